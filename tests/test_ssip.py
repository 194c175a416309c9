"""SSIP: Debian's stock ``spd-say`` against speakd, and the protocol details it relies on.

Two layers: the real ``spd-say`` binary against a real ``speakd serve`` process with the embedded
VITS voice (WAV sink, real-time pacing), and raw SSIP exchanges against the real front-end,
scheduler and WAV sink in-process with the tone engine (fast, and the engine records the text it
was given). ``spd-say`` always runs with ``SPEECHD_CMD=/bin/false`` so it can never autospawn the
real Speech Dispatcher, and with ``LANG=C.UTF-8`` (an installed locale: it exits 1 otherwise).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest

from speakd.audio import read_wav
from speakd.engines.base import SynthesisConfig, VoiceInfo
from speakd.frontends.unixserver import AccessPolicy
from tests.daemon_proc import DaemonProc, start_daemon, write_config
from tests.ssip_harness import SsipClient, SsipServer
from tests.tone_engine import ToneEngine
from tests.waits import HeldSink, wait_until

SPD_SAY = shutil.which("spd-say")
needs_spd_say = pytest.mark.skipif(SPD_SAY is None, reason="spd-say (speech-dispatcher) missing")

LONG = (  # a short first sentence starts the audio early; the whole text is > 8 s
    "Attention. This is a long announcement that keeps going for a while, so that there is "
    "time to interrupt it. It has several sentences. Each one adds a few more seconds of "
    "speech. And here is one more, just to be sure."
)


def spd_say(
    ssip: Path, *args: str, stdin: str | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [SPD_SAY or "spd-say", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=spd_env(ssip),
    )


def spd_env(ssip: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LC_", "SPEECHD_"))}
    return {
        **env,
        "LANG": "C.UTF-8",
        "SPEECHD_ADDRESS": f"unix_socket:{ssip}",
        "SPEECHD_CMD": "/bin/false",
    }


def rms(samples: np.ndarray) -> float:
    return float(np.sqrt(np.mean(samples.astype(np.float64) ** 2)))


def msg_wavs(wav_dir: Path) -> dict[int, Path]:
    """SSIP message id → its WAV (the WAV sink names files after the request id ssip-<id>)."""
    out = {}
    for p in wav_dir.glob("ssip-*.wav"):
        m = re.fullmatch(r"ssip-(\d+)\.wav", p.name)
        if m:
            out[int(m.group(1))] = p
    return out


def wait_new_wavs(wav_dir: Path, before: set[int], count: int, timeout: float = 30) -> list[Path]:
    def new() -> dict[int, Path]:
        found = {k: v for k, v in msg_wavs(wav_dir).items() if k not in before}
        return found if len(found) >= count else {}

    found = wait_until(new, f"{count} new WAVs in {wav_dir}", timeout)
    return [found[k] for k in sorted(found)]


# ---- the real spd-say against a real speakd process --------------------------------------


class Speakd:
    def __init__(self, proc: DaemonProc, tmp: Path) -> None:
        self.proc = proc
        self.ssip = tmp / "ssip.sock"
        self.wav_dir = tmp / "wav"

    def json(self, request: dict) -> dict:
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(10)
            s.connect(self.proc.socket)
            s.sendall(json.dumps(request).encode() + b"\n")
            return json.loads(s.makefile("rb").readline())

    def wait_speaking(self, timeout: float = 30) -> None:
        wait_until(lambda: self.json({"op": "status"})["state"] == "speaking", "speaking", timeout)

    def wait_idle(self, timeout: float = 60) -> None:
        def idle() -> bool:
            s = self.json({"op": "status"})
            return s["state"] == "idle" and not s["queue_length"]

        wait_until(idle, "speakd to go idle", timeout)

    def ids(self) -> set[int]:
        return set(msg_wavs(self.wav_dir))


@pytest.fixture(scope="module")
def speakd(tmp_path_factory: pytest.TempPathFactory):
    if SPD_SAY is None:
        pytest.skip("spd-say (speech-dispatcher) missing")
    tmp = tmp_path_factory.mktemp("ssip")
    proc = start_daemon(write_config(tmp, realtime=True), ready_timeout=120)
    d = Speakd(proc, tmp)
    wait_until(d.ssip.exists, "the SSIP socket")
    yield d
    assert proc.stop() == 0, proc.log_text()


def test_spd_say_speaks(speakd: Speakd) -> None:
    before = speakd.ids()
    r = spd_say(speakd.ssip, "Hello from speakd.")
    assert r.returncode == 0, r.stdout + r.stderr
    (wav,) = wait_new_wavs(speakd.wav_dir, before, 1)
    audio = read_wav(wav)
    assert audio.sample_rate == 22050 and 0.5 < audio.duration < 5
    assert rms(audio.samples()) > 300, "spoken audio is (nearly) silent"
    speakd.wait_idle()


def test_wait_returns_after_the_audio(speakd: Speakd) -> None:
    before = speakd.ids()
    t0 = time.monotonic()
    r = spd_say(speakd.ssip, "-w", "The kettle has boiled.")
    elapsed = time.monotonic() - t0
    assert r.returncode == 0, r.stdout + r.stderr
    # The WAV is complete when -w returns: it was played (paced in real time) before the 702.
    (wav,) = [p for k, p in msg_wavs(speakd.wav_dir).items() if k not in before]
    duration = read_wav(wav).duration
    assert duration > 0.8
    assert elapsed >= duration, f"spd-say -w returned after {elapsed:.2f} s, audio {duration:.2f} s"


def test_cancel_stops_the_speech_and_releases_a_waiting_client(speakd: Speakd) -> None:
    before = speakd.ids()
    waiting = subprocess.Popen(
        [SPD_SAY, "-w", "-P", "message", LONG],
        env=spd_env(speakd.ssip),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    speakd.wait_speaking()
    t0 = time.monotonic()
    r = spd_say(speakd.ssip, "-C")
    assert r.returncode == 0, r.stdout + r.stderr
    assert waiting.wait(timeout=5) == 0  # its 703 CANCELED arrived
    assert time.monotonic() - t0 < 3.0  # two process start-ups included
    (wav,) = wait_new_wavs(speakd.wav_dir, before, 1)
    assert read_wav(wav).duration < 4.0, "the long text played on after CANCEL ALL"
    speakd.wait_idle()


def test_important_interrupts(speakd: Speakd) -> None:
    before = speakd.ids()
    long_client = subprocess.Popen(
        [SPD_SAY, "-w", "-P", "message", LONG],
        env=spd_env(speakd.ssip),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    speakd.wait_speaking()
    r = spd_say(speakd.ssip, "-w", "-P", "important", "Attention please.")
    assert r.returncode == 0, r.stdout + r.stderr
    assert long_client.wait(timeout=5) == 0  # interrupted: it got 703, not a hang
    first, second = wait_new_wavs(speakd.wav_dir, before, 2)
    assert read_wav(first).duration < 4.0, "the message was not interrupted"
    assert rms(read_wav(second).samples()) > 300
    speakd.wait_idle()


def test_pipe_mode_speaks_each_line_in_order(speakd: Speakd) -> None:
    before = speakd.ids()
    lines = ["One.", "Two.", "Three."]
    r = spd_say(speakd.ssip, "-e", stdin="\n".join(lines) + "\n")
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.splitlines() == lines  # pipe mode echoes stdin
    wavs = wait_new_wavs(speakd.wav_dir, before, 3, timeout=60)
    assert all(rms(read_wav(w).samples()) > 300 for w in wavs)
    mtimes = [w.stat().st_mtime for w in wavs]
    assert mtimes == sorted(mtimes), "lines were not spoken in the order sent"
    speakd.wait_idle()


def test_list_voices_and_modules(speakd: Speakd) -> None:
    voices = speakd.json({"op": "voices"})["voices"]
    r = spd_say(speakd.ssip, "-L")
    assert r.returncode == 0, r.stdout + r.stderr
    rows = [line.split() for line in r.stdout.splitlines()]
    assert rows[0] == ["NAME", "LANGUAGE", "VARIANT"]
    assert rows[1:] == [[v["name"], v["language"], "none"] for v in voices]
    assert rows[1][1] == "en-US"  # BCP 47, as Orca and other clients spell it
    r = spd_say(speakd.ssip, "-O")
    assert r.returncode == 0 and r.stdout.split() == ["OUTPUT", "MODULES", "vits"]


def test_rate_and_volume_change_the_audio(speakd: Speakd) -> None:
    text = "Rate and volume."
    durations, levels = {}, {}
    for args in (("-r", "0"), ("-r", "50"), ("-i", "-50")):
        before = speakd.ids()
        r = spd_say(speakd.ssip, "-w", *args, text)
        assert r.returncode == 0, r.stdout + r.stderr
        (wav,) = [p for k, p in msg_wavs(speakd.wav_dir).items() if k not in before]
        audio = read_wav(wav)
        durations[args], levels[args] = audio.duration, rms(audio.samples())
    # rate 50 = speed 2^(50/50) = 2: about half as long (the end's pause and the onset frame do
    # not shrink with it, since the leading silence went, issue 45)
    assert 0.4 < durations[("-r", "50")] / durations[("-r", "0")] < 0.7, durations
    # volume -50 = gain 0.25 of the same (deterministic) audio
    assert durations[("-i", "-50")] == durations[("-r", "0")]
    assert abs(levels[("-i", "-50")] / levels[("-r", "0")] - 0.25) < 0.01, levels


def f0(samples: np.ndarray, rate: int) -> float:
    """Median fundamental of the voiced 40 ms frames, by autocorrelation (60-400 Hz)."""
    x = samples.astype(np.float64)
    n, lo, hi = rate * 40 // 1000, rate // 400, rate // 60
    loud = 0.3 * np.abs(x).max()
    found = []
    for start in range(0, x.size - n, n // 2):
        frame = x[start : start + n] - x[start : start + n].mean()
        if np.abs(frame).max() < loud:
            continue
        ac = np.correlate(frame, frame, "full")[n - 1 :]
        lag = lo + int(np.argmax(ac[lo:hi]))
        if ac[lag] > 0.5 * ac[0]:  # voiced: a clear period
            found.append(rate / lag)
    assert found, "no voiced frame"
    return float(np.median(found))


def test_orcas_capital_is_higher_than_the_lowercase_letter(speakd: Speakd) -> None:
    """Orca's uppercase voice: SET self PITCH 50 + CHAR T against PITCH 10 + CHAR t; and
    PITCH 10 against 0, over three letters (one letter's 8 voiced frames move by a few % with
    where the frames fall)."""
    heard = {}
    with SsipClient(speakd.ssip, timeout=30) as c:
        assert c.code("SET self CLIENT_NAME test:orca:pitch") == 208
        for pitch, char in (
            (10, "t"),
            (50, "T"),
            (0, "t"),
            (10, "b"),
            (0, "b"),
            (10, "m"),
            (0, "m"),
        ):
            before = speakd.ids()
            assert c.code(f"SET self PITCH {pitch}") == 204
            assert c.command(f"CHAR {char}")[-1] == "225 OK MESSAGE QUEUED"
            (wav,) = wait_new_wavs(speakd.wav_dir, before, 1)
            speakd.wait_idle()
            audio = read_wav(wav)
            heard[pitch, char] = (f0(audio.samples(), audio.sample_rate), audio.duration)
    # ±100 is ±1 octave: 50 is 6 st, 10 is 1.2 st; 2^(4.8/12) = 1.32 between them
    assert 1.2 < heard[50, "T"][0] / heard[10, "t"][0] < 1.45, heard
    raised = [heard[10, ch][0] / heard[0, ch][0] for ch in "tbm"]
    assert 1.03 < float(np.median(raised)) < 1.12, heard  # 2^(1.2/12) = 1.072
    # resampled pitch (docs/ssml.md#pitch): the letters' length within 8 % (each one's frames
    # are whole: a letter alone moves by up to 12 %)
    lengths = [sum(heard[p, ch][1] for ch in "tbm") for p in (10, 0)]
    assert lengths[0] == pytest.approx(lengths[1], rel=0.08), heard


def test_orcas_marks_come_between_begin_and_end(speakd: Speakd) -> None:
    """Speech Dispatcher's order: 701 BEGIN, the 700 INDEX MARKs in text order, then 702 END."""
    with SsipClient(speakd.ssip, timeout=30) as c:
        assert c.code("SET self CLIENT_NAME test:orca:marks") == 208
        assert c.code("SET self NOTIFICATION all on") == 220
        assert c.code("SET self SSML_MODE on") == 219
        msg = c.speak('<speak><mark name="0:4"/>Name: <mark name="6:10"/>text</speak>')
        c.wait_event(702, msg, timeout=60)
        assert c.event_codes(msg) == [701, 700, 700, 702], c.events
        marks = [ev[2] for ev in c.events if ev[0] == f"700-{msg}"]
        assert marks == ["700-0:4", "700-6:10"], marks
    speakd.wait_idle()


# ---- the real spd-say against the in-process front-end (tone engine) ----------------------


@needs_spd_say
def test_spd_cmd_guard_prevents_autospawn(tmp_path: Path) -> None:
    """With speakd down, libspeechd would spawn speech-dispatcher on speakd's socket path;
    SPEECHD_CMD=/bin/false (what the README tells clients to set) makes it fail instead."""
    path = tmp_path / "ssip.sock"
    r = spd_say(path, "hello")
    assert r.returncode == 1 and "Failed to connect" in r.stderr
    assert not path.exists()


@needs_spd_say
@pytest.mark.parametrize(
    ("argument", "spoken"),
    [
        ("first\n.dotline\nlast", "first\n.dotline\nlast"),
        ("a\n.\nb", "a\n.\nb"),  # the CRLF trap: a bare-LF "." line does not end the data
        (".hidden", ".hidden"),  # sent dot-stuffed as "..hidden"
    ],
)
def test_spd_say_text_arrives_intact(ssip_server: SsipServer, argument: str, spoken: str) -> None:
    r = spd_say(ssip_server.path, "-w", argument)
    assert r.returncode == 0, r.stdout + r.stderr
    assert ssip_server.engine.calls == [spoken]


@needs_spd_say
def test_spd_say_settings_reach_the_request(ssip_server: SsipServer, tmp_path: Path) -> None:
    markup = "<speak>two <b>words</b></speak>"
    r = spd_say(ssip_server.path, "-w", "-y", "HIGH", "-x", "-P", "message", markup)
    assert r.returncode == 0, r.stdout + r.stderr
    assert ssip_server.engine.calls == ["two words"]  # SSML tags stripped
    audio = read_wav(next((tmp_path / "wav").glob("ssip-*.wav")))
    crossings = np.count_nonzero(np.diff(np.signbit(audio.samples())))
    assert abs(crossings / audio.duration / 2 - 880) < 20  # the "high" voice


# ---- raw SSIP against the in-process front-end ---------------------------------------------


def test_spd_say_transcript(ssip_server: SsipServer) -> None:
    with SsipClient(ssip_server.path) as c:
        assert c.command('SET SELF CLIENT_NAME "joe:spd-say:main"') == ["208 OK CLIENT NAME SET"]
        assert c.command("SET SELF LANGUAGE C") == ["201 OK LANGUAGE SET"]
        assert c.command("SET SELF PRIORITY TEXT") == ["202 OK PRIORITY SET"]
        assert c.command("speak") == ["230 OK RECEIVING DATA"]
        c.send(b"hello\r\n.\r\n")
        unit = c.reply()
        assert re.fullmatch(r"225-\d+", unit[0]) and unit[1:] == ["225 OK MESSAGE QUEUED"]
    ssip_server.wait_idle()
    assert ssip_server.engine.calls == ["hello"]


@pytest.mark.parametrize(
    ("command", "code"),
    [
        ("SET SELF RATE 20", 203),
        ("SET SELF RATE 101", 409),
        ("SET SELF RATE -101", 410),
        ("SET SELF RATE fast", 511),
        ("SET SELF PITCH -10", 204),
        ("SET SELF PITCH 200", 411),
        ("SET SELF PITCH_RANGE 5", 263),
        ("SET SELF VOLUME 50", 218),
        ("SET SELF VOLUME -300", 414),
        ("SET SELF VOICE_TYPE FEMALE1", 209),
        ("SET SELF VOICE_TYPE ROBOT", 309),
        ("SET SELF VOICE FEMALE2", 209),  # before speechd 0.10: VOICE was the voice type
        ("SET SELF VOICE ROBOT", 309),
        ("SET SELF PUNCTUATION_TABLE default", 215),  # before 0.2: tables, accepted and inert
        ("SET SELF CHARACTER_TABLE default", 215),
        ("SET SELF KEY_TABLE default", 215),
        ("SET SELF TEXT_TABLE default", 299),
        ("SET SELF SOUND_TABLE", 510),
        ("SET SELF SYNTHESIS_VOICE no such voice", 209),  # speechd accepts any name
        ("SET SELF OUTPUT_MODULE piper", 216),
        ("SET SELF PUNCTUATION some", 205),
        ("SET SELF PUNCTUATION loud", 514),
        ("SET SELF SPELLING on", 207),
        ("SET SELF SPELLING maybe", 513),
        ("SET SELF CAP_LET_RECOGN icon", 206),
        ("SET SELF SSML_MODE off", 219),
        ("SET SELF PAUSE_CONTEXT 2", 217),
        ("SET SELF NOTIFICATION end on", 220),
        ("SET SELF NOTIFICATION all off", 220),
        ("SET SELF NOTIFICATION bogus on", 316),
        ("SET SELF NOTIFICATION end sometimes", 514),
        ("SET ALL NOTIFICATION end on", 514),
        ("SET SELF PRIORITY important", 202),
        ("SET SELF PRIORITY urgent", 408),
        ("SET ALL PRIORITY text", 301),
        ("SET SELF CLIENT_NAME nocolons", 311),
        ("SET ALL RATE 10", 203),
        ("SET 9999 RATE 10", 303),  # no such client
        ("SET nobody RATE 10", 514),
        ("SET SELF RATE", 510),
        ("SET SELF WHATEVER 1", 500),
        ("SET", 510),
        ("STOP SELF", 210),
        ("STOP ALL", 210),
        ("STOP 0", 406),
        ("CANCEL SELF", 213),
        ("CANCEL ALL", 213),
        ("CANCEL 7", 213),
        ("CANCEL someone", 514),
        ("RESUME SELF", 417),  # nothing paused: a 4xx, as SSIP asks
        ("LIST VOICES", 249),
        ("LIST NONSENSE", 514),
        ("GET RATE", 251),
        ("GET COLOUR", 514),
        ("HISTORY GET CLIENT_ID", 245),
        ("HISTORY GET LAST", 380),
        ("HISTORY SAY 3", 380),
        ("HISTORY", 510),
        ("HELP", 248),
        ("BLOCK END", 331),
        ("CHAR", 510),
        ("FROBNICATE", 500),
        ("", 500),
        ("speak", 230),
    ],
)
def test_reply_codes(ssip_server: SsipServer, command: str, code: int) -> None:
    with SsipClient(ssip_server.path) as c:
        assert c.code(command) == code


def test_reply_bodies(ssip_server: SsipServer) -> None:
    with SsipClient(ssip_server.path) as c:
        assert c.command("LIST SYNTHESIS_VOICES") == [
            "249-low\ten\tnone",
            "249-high\ten\tnone",
            "249 OK VOICE LIST SENT",
        ]
        assert c.command("LIST SYNTHESIS_VOICES de") == ["249 OK VOICE LIST SENT"]
        assert c.command("LIST OUTPUT_MODULES") == ["250-tone", "250 OK MODULE LIST SENT"]
        assert c.command("LIST VOICES")[0] == "249-MALE1"
        assert c.code("SET SELF RATE -30") == 203
        assert c.command("GET RATE") == ["251--30", "251 OK GET RETURNED"]
        assert c.code("SET SELF VOICE child_female") == 209  # the pre-0.10 spelling
        assert c.command("GET VOICE") == ["251-CHILD_FEMALE", "251 OK GET RETURNED"]
        assert c.command("GET VOICE_TYPE") == ["251-CHILD_FEMALE", "251 OK GET RETURNED"]
        # no such client: speech-dispatcher's own wording of each "couldn't set"
        assert c.command("SET 9999 PUNCTUATION all") == ["305 ERR COULDNT SET PUNCT MODE"]
        assert c.command("SET 9999 CAP_LET_RECOGN spell") == [
            "306 ERR COULDNT SET CAP LET RECOGNITION"
        ]
        assert c.command("SET 9999 OUTPUT_MODULE x") == ["312 ERR COULDNT SET OUTPUT MODULE"]
        client_id = c.command("HISTORY GET CLIENT_ID")[0]
        assert re.fullmatch(r"245-\d+", client_id)
        assert c.command("QUIT") == ["231 HAPPY HACKING"]
        with pytest.raises(EOFError):
            c.line()


def test_body_framing_dot_unstuffing_and_encoding(ssip_server: SsipServer) -> None:
    with SsipClient(ssip_server.path) as c:
        assert c.code("SET SELF PRIORITY MESSAGE") == 202
        for body in (b"..lead\r\nmid\r\n..\r\nx\n.\ny\r\n.\r\n", b"a\x00b\r\n.\r\n"):
            assert c.code("SPEAK") == 230
            c.send(body)
            assert c.reply()[-1] == "225 OK MESSAGE QUEUED"
        assert c.code("SPEAK") == 230
        c.send(b".\r\n")
        assert c.reply() == ["227 OK MESSAGE CANCELED"]
        assert c.code("SPEAK") == 230
        c.send(b"caf\xc3\r\n.\r\n")
        assert c.reply() == ["501 ERR INVALID ENCODING"]
        assert c.code("SET SELF RATE \xff") == 511  # the line is valid UTF-8 ("ÿ")
        c.send(b"SET SELF RATE \xff\r\n")
        assert c.reply() == ["501 ERR INVALID ENCODING"]
        assert c.code("HELP") == 248  # still in sync
    ssip_server.wait_idle()
    assert ssip_server.engine.calls == [".lead\nmid\n.\nx\n.\ny", "a?b"]


def test_line_limit_resynchronises(ssip_server: SsipServer) -> None:
    with SsipClient(ssip_server.path) as c:
        c.send(b"SET SELF CLIENT_NAME " + b"x" * 20000 + b"\r\n")
        assert c.reply()[0].startswith("500 ERR LINE TOO LONG")
        assert c.code("HISTORY GET CLIENT_ID") == 245
        assert c.code("SPEAK") == 230
        c.send(b"y" * 20000 + b"\r\n" + b"ok\r\n.\r\n")
        assert c.reply()[0].startswith("400 ERR TEXT TOO LONG")
        assert c.code("HELP") == 248


def test_events_follow_the_speech(ssip_server: SsipServer) -> None:
    with SsipClient(ssip_server.path) as c:
        assert c.code("SET SELF NOTIFICATION all on") == 220
        assert c.code("SET SELF PRIORITY MESSAGE") == 202
        msg = c.speak("one two three")
        t0 = time.monotonic()
        end = c.wait_event(702, msg)
        assert time.monotonic() - t0 >= 0.25  # three 0.1 s words, paced in real time
        client_id = int(c.command("HISTORY GET CLIENT_ID")[0][4:])
        assert end == [f"702-{msg}", f"702-{client_id}", "702 END"]
        assert c.event_codes(msg) == [701, 702]


def test_no_events_without_notification(ssip_server: SsipServer) -> None:
    with SsipClient(ssip_server.path, timeout=0.5) as c:
        msg = c.speak("one")
        ssip_server.wait_idle()
        with pytest.raises(TimeoutError):
            c.unit()
        assert c.event_codes(msg) == []


def test_pause_holds_playback_until_resume(ssip_server: SsipServer, tmp_path: Path) -> None:
    with SsipClient(ssip_server.path) as c:
        assert c.code("SET SELF NOTIFICATION all on") == 220
        assert c.code("SET SELF PRIORITY MESSAGE") == 202
        msg = c.speak(" ".join(["word"] * 8))  # 0.8 s of audio
        c.wait_event(701, msg)
        assert c.code("PAUSE SELF") == 211
        c.wait_event(704, msg)
        status = ssip_server.status()  # parked: back in the queue, the worker free for others
        assert status["state"] == "idle" and status["queue"] == [f"ssip-{msg}"], status
        later = c.speak("queued")  # paused clients' new messages wait too
        # the queue has looked at both (the submit woke it before this status call ran)
        status = ssip_server.status()
        assert status["state"] == "idle" and len(status["queue"]) == 2, status
        assert c.event_codes(msg) == [701, 704]
        assert c.code("RESUME SELF") == 212
        c.wait_event(705, msg)
        c.wait_event(702, msg)
        c.wait_event(702, later)
        assert c.event_codes(msg) == [701, 704, 705, 702]
        assert c.code("RESUME SELF") == 417
    assert abs(read_wav(tmp_path / "wav" / f"ssip-{msg}.wav").duration - 0.8) < 0.01


def test_a_paused_message_does_not_block_other_clients(tmp_path: Path) -> None:
    """PAUSE SELF parks the client's message: other clients' messages play meanwhile, and RESUME
    continues it where it stopped (speech-dispatcher's semantics), losing and repeating nothing."""
    sink = HeldSink(tmp_path / "wav")
    with (
        SsipServer(tmp_path / "ssip.sock", sink=sink) as ssip_server,
        SsipClient(ssip_server.path) as a,
        SsipClient(ssip_server.path) as b,
    ):
        for c in (a, b):
            assert c.code("SET SELF NOTIFICATION all on") == 220
            assert c.code("SET SELF PRIORITY MESSAGE") == 202
        sink.hold(15)  # 0.3 s in: part-way through
        paused = a.speak(" ".join(["word"] * 8))  # 0.8 s of audio
        sink.held()
        a.wait_event(701, paused)
        assert a.code("PAUSE SELF") == 211
        sink.release()
        a.wait_event(704, paused)
        other = b.speak("meanwhile from b")
        b.wait_event(701, other)
        b.wait_event(702, other)
        assert a.event_codes(paused) == [701, 704]
        assert a.code("RESUME SELF") == 212
        a.wait_event(702, paused)
        assert a.event_codes(paused) == [701, 704, 705, 702]
    wav = tmp_path / "wav"
    assert abs(read_wav(wav / f"ssip-{paused}.wav").duration - 0.8) < 0.01
    assert abs(read_wav(wav / f"ssip-{other}.wav").duration - 0.3) < 0.01


def test_stop_and_cancel_scopes(ssip_server: SsipServer) -> None:
    with SsipClient(ssip_server.path) as a, SsipClient(ssip_server.path) as b:
        for c in (a, b):
            assert c.code("SET SELF NOTIFICATION all on") == 220
            assert c.code("SET SELF PRIORITY MESSAGE") == 202
        long_a = a.speak(" ".join(["a"] * 20))
        a.wait_event(701, long_a)
        queued_b = [b.speak("b one"), b.speak("b two")]
        assert b.code("STOP SELF") == 210  # b is not speaking: nothing to stop
        assert b.code("CANCEL SELF") == 213  # drops b's queued messages only
        for m in queued_b:
            b.wait_event(703, m)
        assert a.event_codes(long_a) == [701]
        assert b.code("STOP ALL") == 210  # stops what is speaking, whoever it belongs to
        a.wait_event(703, long_a)
    ssip_server.wait_idle()
    assert ssip_server.engine.calls == [" ".join(["a"] * 20)]


def test_important_from_one_client_interrupts_another(ssip_server: SsipServer) -> None:
    with SsipClient(ssip_server.path) as a, SsipClient(ssip_server.path) as b:
        for c, priority in ((a, "TEXT"), (b, "IMPORTANT")):
            assert c.code("SET SELF NOTIFICATION all on") == 220
            assert c.code(f"SET SELF PRIORITY {priority}") == 202
        text = a.speak(" ".join(["text"] * 20))
        a.wait_event(701, text)
        urgent = b.speak("fire")
        a.wait_event(703, text)
        b.wait_event(702, urgent)


def test_settings_apply_to_speech(ssip_server: SsipServer, tmp_path: Path) -> None:
    with SsipClient(ssip_server.path) as c:
        assert c.code("SET SELF NOTIFICATION end on") == 220
        assert c.code("SET SELF PRIORITY MESSAGE") == 202
        plain = c.speak("one two")
        assert c.code("SET SELF VOLUME 0") == 218  # gain 0.5 of the same audio
        quiet = c.speak("one two")
        assert c.code("SET SELF RATE 50") == 203  # speed 2
        fast = c.speak("one two")
        assert c.code("SET SELF SYNTHESIS_VOICE High") == 209  # names match case-blind
        high = c.speak("one two")
        assert c.code("SET SELF SPELLING on") == 207
        spelled = c.speak("ab c")
        for m in (plain, quiet, fast, high, spelled):
            c.wait_event(702, m)
    wav = {m: read_wav(tmp_path / "wav" / f"ssip-{m}.wav") for m in (plain, quiet, fast, high)}
    assert np.array_equal(wav[quiet].samples(), (wav[plain].samples() * 0.5).astype("<i2"))
    assert abs(wav[fast].duration - wav[plain].duration / 2) < 0.01
    for m, freq in ((plain, 440), (high, 880)):
        crossings = np.count_nonzero(np.diff(np.signbit(wav[m].samples())))
        assert abs(crossings / wav[m].duration / 2 - freq) < 20
    assert ssip_server.engine.calls[-1] == "a b c"


def test_set_other_clients(ssip_server: SsipServer) -> None:
    with SsipClient(ssip_server.path) as a, SsipClient(ssip_server.path) as b:
        b_id = b.command("HISTORY GET CLIENT_ID")[0][4:]
        assert a.code(f"SET {b_id} RATE 40") == 203
        assert b.command("GET RATE")[0] == "251-40"
        assert a.code("SET ALL VOLUME 10") == 218
        assert a.command("GET VOLUME")[0] == b.command("GET VOLUME")[0] == "251-10"


def test_char_key_and_sound_icon(ssip_server: SsipServer) -> None:
    with SsipClient(ssip_server.path) as c:
        assert c.code("SET SELF NOTIFICATION all on") == 220
        assert c.code("SET SELF PRIORITY MESSAGE") == 202
        ids = []
        for command in ("CHAR x", "CHAR space", "KEY shift_a", "SOUND_ICON bell"):
            unit = c.command(command)
            assert unit[-1] == "225 OK MESSAGE QUEUED", unit
            ids.append(int(unit[0][4:]))
        for m in ids:
            c.wait_event(702, m)
    assert ssip_server.engine.calls == ["x", "space", "shift a"]  # no sound icons: nothing played


def test_cap_let_recogn_spell_says_capital_and_icon_plays_the_capital_sound(
    ssip_server: SsipServer, tmp_path: Path
) -> None:
    """As espeak-ng (Speech Dispatcher's reference module) does, over CHAR and text alike."""
    with SsipClient(ssip_server.path) as c:
        assert c.code("SET SELF NOTIFICATION end on") == 220
        assert c.code("SET SELF PRIORITY MESSAGE") == 202
        ids = {}
        for mode in ("spell", "icon", "none"):
            assert c.command(f"SET SELF CAP_LET_RECOGN {mode}") == [
                "206 OK CAP LET RECOGNITION SET"
            ]
            ids[mode] = int(c.command("CHAR T")[0][4:])
            c.wait_event(702, ids[mode])
        assert c.code("SET SELF CAP_LET_RECOGN spell") == 206
        c.wait_event(702, c.speak("Hello NASA and bob"))
    assert ssip_server.engine.calls == ["capital T", "T", "T", "capital Hello capital NASA and bob"]
    wav = {mode: read_wav(tmp_path / "wav" / f"ssip-{m}.wav") for mode, m in ids.items()}
    icon_s = wav["icon"].duration - wav["none"].duration  # the capital sound, then the letter
    assert icon_s == pytest.approx(0.09, abs=0.005)
    assert np.array_equal(wav["icon"].samples()[-wav["none"].frames :], wav["none"].samples())


def test_block_restricts_commands(ssip_server: SsipServer) -> None:
    with SsipClient(ssip_server.path) as c:
        assert c.code("BLOCK BEGIN") == 260
        assert c.code("BLOCK BEGIN") == 330
        assert c.code("STOP ALL") == 332
        assert c.code("SET SELF PRIORITY text") == 332
        assert c.code("SET SELF RATE 5") == 203
        assert c.code("BLOCK END") == 261


def test_queue_full_is_a_server_error(tmp_path: Path) -> None:
    engine = ToneEngine(compute_s=0.5)  # slow synthesis keeps the queue occupied
    with (
        SsipServer(tmp_path / "s.sock", max_queue=1, engine=engine) as ssip_server,
        SsipClient(ssip_server.path) as c,
    ):
        assert c.code("SET SELF PRIORITY MESSAGE") == 202
        codes = []
        for _ in range(4):
            assert c.code("SPEAK") == 230
            c.send(b"a b c\r\n.\r\n")
            codes.append(int(c.reply()[-1][:3]))
        assert codes[0] == 225 and codes[-1] == 300
        assert c.code("CANCEL ALL") == 213


def test_disconnect_lifts_a_pause(ssip_server: SsipServer) -> None:
    with SsipClient(ssip_server.path) as a:
        assert a.code("SET SELF PRIORITY MESSAGE") == 202
        assert a.code("PAUSE SELF") == 211
        held = a.speak("held")
        status = ssip_server.status()  # the submit woke the queue before this call ran
        assert status["state"] == "idle" and status["queue"] == [f"ssip-{held}"], status
        assert ssip_server.engine.calls == []
    ssip_server.wait_idle()
    assert ssip_server.engine.calls == ["held"]


class BilingualTone(ToneEngine):
    """Two voices in two languages; records the voice each synthesis was asked for."""

    def __init__(self) -> None:
        super().__init__()
        self.voices_used: list[str | None] = []

    def voices(self) -> list[VoiceInfo]:
        return [VoiceInfo("low", "en_US"), VoiceInfo("high", "de_DE")]

    def synthesize(self, text: str, config: SynthesisConfig, cancel=None):
        self.voices_used.append(config.voice)
        return super().synthesize(text, config, cancel)


def test_language_picks_a_voice_of_that_language(tmp_path: Path) -> None:
    engine = BilingualTone()
    with (
        SsipServer(tmp_path / "s.sock", engine=engine) as ssip_server,
        SsipClient(ssip_server.path) as c,
    ):
        assert c.code("SET SELF NOTIFICATION end on") == 220
        assert c.code("SET SELF PRIORITY MESSAGE") == 202
        for language in ("C", "en-GB", "de", "DE_at", "fr"):
            assert c.code(f"SET SELF LANGUAGE {language}") == 201
            c.wait_event(702, c.speak("word"))
        for lang in ("de", "de-DE", "de_DE"):  # listed in BCP 47, asked for in either spelling
            assert c.command(f"LIST SYNTHESIS_VOICES {lang}") == [
                "249-high\tde-DE\tnone",
                "249 OK VOICE LIST SENT",
            ]
    # the default ("low", English) unless the language is another voice's; de-AT falls back to de
    assert engine.voices_used == ["low", "low", "high", "high", "low"]


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another user")
def test_peer_outside_the_allow_list_reads_an_ssip_error() -> None:
    public = Path(tempfile.mkdtemp(prefix="speakd-ssip-"))
    public.chmod(0o755)
    try:
        policy = AccessPolicy(allow_uids=(4242,))
        with SsipServer(public / "ssip.sock", policy=policy) as ssip_server:
            assert as_nobody(ssip_server.path) == "400 ERR NOT ALLOWED HERE\r\n"
            with SsipClient(ssip_server.path) as c:  # root is always allowed
                assert c.code("HISTORY GET CLIENT_ID") == 245
    finally:
        shutil.rmtree(public, ignore_errors=True)


def as_nobody(path: Path) -> str:
    """Connect as uid nobody (forked child) and return the first bytes the ssip_server sends."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.setgid(65534)
            os.setuid(65534)
            with socket.socket(socket.AF_UNIX) as s:
                s.settimeout(10)
                s.connect(str(path))
                result = s.recv(1024).decode()
        except OSError as e:
            result = f"{type(e).__name__}: {e}"
        os.write(write_fd, result.encode())
        os._exit(0)
    os.close(write_fd)
    with os.fdopen(read_fd, newline="") as f:  # keep the CRLF
        result = f.read()
    os.waitpid(pid, 0)
    return result
