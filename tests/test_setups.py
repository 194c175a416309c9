"""The set-ups docs/setups.md names, each started by a test with the files a user uses, and the
guard: every config and unit that systemd/ and examples/ ship is started by one of those tests.

Here the two checkout set-ups of the README: ``make run`` and ``make run
CONFIG=examples/wav.toml``, their command read from ``make -n`` (not pip-installed again: the
suite's venv is the one ``make`` made). The daemon's directories go where ``speakd.paths`` puts
them for a systemd service ($RUNTIME_DIRECTORY…), in a private folder, so that a suite run as
root leaves nothing in /run or /var; audio goes through PortAudio's default device into a private
PulseAudio's null sink (the machine has no sound card), and ``speakd say`` finds the daemon with
no flag, as the README runs it.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shlex
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from speakd_tools.bench.screenreader import null_sink_pulse
from tests.daemon_proc import READY_LINE
from tests.unit_run import sound_server_priority
from tests.waits import wait_until

ROOT = Path(__file__).resolve().parent.parent
SETUPS = ROOT / "docs" / "setups.md"
SHIPPED = ("systemd/*.toml", "systemd/*.service", "systemd/user/*.service", "examples/*.toml")
INSTALLED_CONFIG = Path("/etc/speakd/speakd.toml")


def documented_setups() -> list[tuple[str, set[str], str]]:
    """docs/setups.md's table: (set-up, the shipped files it starts, its test)."""
    rows = []
    for line in SETUPS.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 4 or not cells[3].startswith("`tests/"):
            continue
        files = set(re.findall(r"`((?:systemd|examples)/[^`]+)`", cells[2]))
        rows.append((cells[0], files, cells[3].strip("`")))
    return rows


def test_every_shipped_config_and_unit_is_started_by_a_documented_setups_test() -> None:
    rows = documented_setups()
    assert len(rows) >= 4, rows
    shipped = {str(p.relative_to(ROOT)) for pattern in SHIPPED for p in ROOT.glob(pattern)}
    started = set().union(*(files for _, files, _ in rows))
    assert shipped <= started, f"started by no set-up's test: {sorted(shipped - started)}"
    assert started <= shipped, f"docs/setups.md names files that are not shipped: {started}"
    for setup, files, test in rows:
        module, _, name = test.partition("::")
        source = (ROOT / module).read_text()
        tests = {n.name for n in ast.walk(ast.parse(source)) if isinstance(n, ast.FunctionDef)}
        assert name in tests, f"{setup}: {test} does not exist"
        for file in files:  # the test's module starts it: by its installed or its own path
            installed = {
                "systemd/speakd.toml": "/etc/speakd/speakd.toml",
                "systemd/speakd.service": "/usr/lib/systemd/system/speakd.service",
                "systemd/user/speakd.service": "/usr/lib/systemd/user/speakd.service",
            }.get(file, file)
            assert installed in source or file in source, f"{test} never names {file}"


# ---- make run ---------------------------------------------------------------------------------


def make_run_command(config: str | None) -> list[str]:
    """The command ``make run`` runs last, as make prints it."""
    args = ["make", "-n", "-C", str(ROOT), "run", *([f"CONFIG={config}"] if config else [])]
    out = subprocess.run(args, capture_output=True, text=True, timeout=60, check=True).stdout
    (line,) = [ln for ln in out.splitlines() if " serve" in ln]
    return shlex.split(line)


@pytest.fixture
def session(tmp_path: Path) -> Iterator[dict[str, str]]:
    """The environment of `make run` here: a private PulseAudio where libpulse looks, and the
    daemon's directories in ``tmp_path``."""
    if INSTALLED_CONFIG.exists():
        pytest.skip(f"{INSTALLED_CONFIG} exists: make run would use that installed set-up")
    if not shutil.which("pulseaudio"):
        pytest.skip("pulseaudio missing (Debian: pulseaudio)")
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SPEAKD_", "PULSE_"))}
    env |= {"XDG_RUNTIME_DIR": str(run), "HOME": str(tmp_path)}
    for name in ("RUNTIME", "STATE", "CACHE"):
        (tmp_path / name.lower()).mkdir()
        env[f"{name}_DIRECTORY"] = str(tmp_path / name.lower())
    pulse = null_sink_pulse(env, (tmp_path / "pulse.log").open("wb"), sound_server_priority())
    try:
        wait_until(lambda: (run / "pulse" / "native").exists(), "PulseAudio", 30)
        yield env
    finally:
        pulse.terminate()
        pulse.wait(30)


def serve_and_say(command: list[str], env: dict[str, str], log: Path) -> dict:
    """Run the daemon as make would; the README's `speakd say`; the daemon's status after."""
    proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log.open("wb"),
                            stderr=subprocess.STDOUT)  # fmt: skip
    speakd = str(ROOT / ".venv/bin/speakd")
    try:
        wait_until(lambda: READY_LINE in log.read_text() or proc.poll() is not None, "READY", 120)
        assert proc.poll() is None, log.read_text()
        text = "Hello from speakd. The door is open."
        r = subprocess.run([speakd, "say", text, "--wait", "--id", "readme"], env=env,
                           capture_output=True, text=True, timeout=120)  # fmt: skip
        assert r.returncode == 0, r.stderr + log.read_text()[-2000:]
        status = subprocess.run([speakd, "status"], env=env, capture_output=True, text=True,
                                timeout=30, check=True)  # fmt: skip
        return json.loads(status.stdout)
    finally:
        proc.terminate()
        assert proc.wait(30) == 0, log.read_text()[-2000:]


def test_make_run(session: dict[str, str], tmp_path: Path) -> None:
    command = make_run_command(None)
    assert command == [".venv/bin/speakd", "serve"]
    status = serve_and_say(command, session, tmp_path / "daemon.log")
    assert status["audio"]["sink"] == "sounddevice" and status["audio"]["available"], status
    assert status["counters"]["finished"] == 1
    assert status["source"]["cache"]["path"] == session["CACHE_DIRECTORY"] + "/cache.db"


def test_make_run_with_the_wav_example(session: dict[str, str], tmp_path: Path) -> None:
    command = make_run_command("examples/wav.toml")
    assert command[-2:] == ["--config", "examples/wav.toml"]
    wav = Path("/tmp/speakd-wav/readme.wav")  # examples/wav.toml's folder, named in the README
    wav.unlink(missing_ok=True)
    try:
        status = serve_and_say(command, session, tmp_path / "daemon.log")
        assert status["audio"] == {"sink": "wav", "available": True, "wav_dir": str(wav.parent)}
        assert wav.stat().st_size > 10_000
    finally:
        wav.unlink(missing_ok=True)
