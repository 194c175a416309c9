"""The set-ups docs/setups.md names and its guard: every config, unit and entry point the
repository ships has a row, whose test records what it starts (tests/setups.py) and is held to
its row when it passes (tests/conftest.py).

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
import shlex
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from speakd_tools.bench.screenreader.contenders import null_sink_pulse
from tests import setups
from tests.daemon_proc import READY_LINE
from tests.unit_run import sound_server_priority
from tests.waits import wait_until

ROOT = Path(__file__).resolve().parent.parent
INSTALLED_CONFIG = Path("/etc/speakd/speakd.toml")


def test_every_shipped_config_unit_and_entry_point_has_a_documented_setup() -> None:
    """docs/setups.md claims, for every file a set-up starts, a test that starts it; each such
    test, when it passes, is held to its row by what it recorded (tests/conftest.py)."""
    rows = setups.documented()
    assert len(rows) >= 7, rows
    shipped = setups.shipped()
    claimed = set().union(*(row.files for row in rows.values()))
    assert shipped <= claimed, f"started by no set-up's test: {sorted(shipped - claimed)}"
    assert claimed <= shipped, f"docs/setups.md names files that are not shipped: {claimed}"
    for row in rows.values():
        module, _, name = row.test.partition("::")
        source = (ROOT / module).read_text()
        functions = (ast.FunctionDef, ast.AsyncFunctionDef)
        tests = {n.name for n in ast.walk(ast.parse(source)) if isinstance(n, functions)}
        assert name in tests, f"{row.name}: {row.test} does not exist"


def test_a_setups_test_that_did_not_start_its_files_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    """The check tests/conftest.py makes after each documented test, fed what a test records."""
    row = setups.documented()["tests/test_setups.py::test_make_run_with_the_wav_example"]
    assert row.files == {"examples/wav.toml"}
    monkeypatch.setattr(setups, "_started", {})
    monkeypatch.setenv("PYTEST_CURRENT_TEST", f"{row.test} (call)")
    assert setups.unstarted(row.test) == {"examples/wav.toml"}
    setups.started("systemd/speakd.toml")  # another file, say in a comment, starts nothing
    assert setups.unstarted(row.test) == {"examples/wav.toml"}
    setups.started(*filter(None, [setups.config_of([".venv/bin/speakd", "serve", "--config",
                                                    "examples/wav.toml"])]))  # fmt: skip
    assert setups.unstarted(row.test) == set()
    monkeypatch.setattr(setups, "_started", {})
    setups.started("/etc/speakd/speakd.toml", "/usr/lib/systemd/user/speakd.service")
    assert setups._started[row.test] == {"systemd/speakd.toml", "systemd/user/speakd.service"}


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
    setups.started(*filter(None, [setups.config_of(command)]))
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
