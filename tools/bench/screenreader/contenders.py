"""``bench screenreader``'s two contenders, each started for one run and stopped after it:
speakd on its realtime-paced WAV sink, and Speech Dispatcher + espeak-ng into a private
PulseAudio's null sink. Each yields its SSIP socket and how it tells a message's first audio.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import IO

from ..harness.daemon import UNIT_NICE, serve
from .daemon_parts import SpeakdFigures
from .screenreader_nav import FirstAudio, Monitor


@contextmanager
def speakd_ssip(work: Path) -> Iterator[tuple[str, FirstAudio]]:
    """speakd on the embedded voice, SSIP on, its WAV sink paced in real time, measured once its
    key-echo prewarm is done (what a board that has been up a minute gives a screen reader), at
    the nice value its systemd unit gives it when the bench runs as root."""
    from speakd.frontends.ssip.keys import DONE_LINE

    ssip = work / "ssip.sock"
    audio = f'sink = "wav"\nwav_dir = "{work / "wav"}"\nrealtime = true'
    (work / "wav").mkdir()
    proc, sock = serve(
        work,
        engine="trace_parts = true",
        audio=audio,
        ssip_path=str(ssip),
        env={"SPEAKD_LOG_LEVEL": "INFO"},
        nice=UNIT_NICE,
    )
    log = work / "speakd.log"
    deadline = time.monotonic() + 600
    while DONE_LINE not in log.read_text(errors="replace"):
        if time.monotonic() > deadline or proc.poll() is not None:
            proc.kill()
            raise RuntimeError(f"speakd's key-echo prewarm did not finish: {log}")
        time.sleep(0.5)
    try:
        yield str(ssip), SpeakdFigures(work / "wav", sock, log)
    finally:
        proc.terminate()
        proc.wait(30)


SPEECHD_CONF = """\
AudioOutputMethod "pulse"
DefaultModule espeak-ng
AddModule "espeak-ng" "sd_espeak-ng" "espeak-ng.conf"
DefaultLanguage "en"
"""


@contextmanager
def speech_dispatcher(work: Path) -> Iterator[tuple[str, FirstAudio]]:
    """Speech Dispatcher + espeak-ng into a private PulseAudio's null sink (real-time pacing)."""
    missing = [b for b in ("speech-dispatcher", "pulseaudio") if not shutil.which(b)]
    if missing:
        raise RuntimeError(f"not installed: {', '.join(missing)}")
    runtime, conf = work / "run", work / "conf"
    for d in (runtime, conf / "modules", work / "home"):
        d.mkdir(parents=True)
    runtime.chmod(0o700)
    pulse = runtime / "pulse.sock"
    env = {**os.environ, "XDG_RUNTIME_DIR": str(runtime), "HOME": str(work / "home")}
    env["PULSE_SERVER"] = f"unix:{pulse}"
    (conf / "speechd.conf").write_text(SPEECHD_CONF)
    shutil.copy("/etc/speech-dispatcher/modules/espeak-ng.conf", conf / "modules")
    log = (work / "speechd.log").open("wb")
    procs = [null_sink_pulse(env, log)]
    try:
        _wait_for(pulse, procs[0], "PulseAudio")
        sock = work / "speechd.sock"
        procs.append(
            subprocess.Popen(
                [
                    *("speech-dispatcher", "-s", "-t", "0", "-c", "unix_socket", "-S", str(sock)),
                    *("-C", str(conf), "-L", str(work), "-P", str(work / "speechd.pid")),
                ],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        )
        _wait_for(sock, procs[1], "speech-dispatcher")
        monitor = Monitor(env, "bench.monitor")
        try:
            yield str(sock), monitor
        finally:
            monitor.close()
    finally:
        for p in reversed(procs):
            p.terminate()
            p.wait(30)


def null_sink_pulse(
    env: dict[str, str], log: IO[bytes], wrap: Sequence[str] = ()
) -> subprocess.Popen[bytes]:
    """A private PulseAudio whose one sink is a null sink (it paces like a device; ALSA's null
    does not), listening where libpulse looks: ``$PULSE_SERVER``, else
    ``$XDG_RUNTIME_DIR/pulse/native``. ``wrap`` runs it as another user (``setpriv …``)."""
    native = "module-native-protocol-unix auth-anonymous=1"
    if server := env.get("PULSE_SERVER", "").removeprefix("unix:"):
        native += f" socket={server}"
    return subprocess.Popen(
        [
            *wrap,
            *("pulseaudio", "-n", "--daemonize=no", "--exit-idle-time=-1", "--system=false"),
            "--load=module-null-sink sink_name=bench",
            f"--load={native}",
        ],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )


def _wait_for(path: Path, proc: subprocess.Popen[bytes], what: str) -> None:
    deadline = time.monotonic() + 30
    while not path.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not start (log in {path.parent})")
        time.sleep(0.05)


CONTENDERS = {"speakd": speakd_ssip, "speechd": speech_dispatcher}
