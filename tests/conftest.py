"""Shared fixtures: a tiny random ChatTTS checkpoint and its fp32 bundle, built once per session
through the real `speakd-tools` commands (export runs its parity check; the bundle's manifest
carries the report)."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import setups
from tests.mosquitto import MOSQUITTO, Mosquitto
from tests.ssip_harness import SsipServer, wav_server


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("ChatTTS", reason="needs the host stack: pip install -e '.[host]'")
    from speakd_tools.cli import main

    out = tmp_path_factory.mktemp("chattts") / "checkpoint-tiny"
    assert main(["checkpoint", "--size", "tiny", "--out", str(out), "--seed", "0"]) == 0
    return out


@pytest.fixture(scope="session")
def tiny_bundle(tiny_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """models/chattts-tiny equivalent: fp32, max_context 2048, voices default + 3 seeded."""
    from speakd_tools.cli import main

    out = tmp_path_factory.mktemp("bundles") / "chattts-tiny"
    assert main(["export", "--checkpoint", str(tiny_checkpoint), "--out", str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mosquitto]:
    """A real mosquitto per test module (test_mqtt_tls overrides it with a TLS one)."""
    b = Mosquitto(tmp_path_factory.mktemp("broker")).start()
    yield b
    b.stop()


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A folder every user may enter, for tests that run speakd as another user (pytest's own
    tmp_path is root's 0700)."""
    path = Path(tempfile.mkdtemp(prefix="speakd-users-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def shared_broker(shared_dir: Path) -> Iterator[Mosquitto]:
    """A mosquitto of its own in ``shared_dir``; a missing one fails under CI."""
    if not Path(MOSQUITTO).exists() and os.environ.get("CI") != "true":
        pytest.skip("mosquitto missing")
    b = Mosquitto(shared_dir / "broker").start()
    yield b
    b.stop()


@pytest.fixture
def ssip_server(tmp_path: Path) -> Iterator[SsipServer]:
    """The in-process SSIP server on the tone engine, writing WAVs (tests.ssip_harness)."""
    with wav_server(tmp_path / "ssip.sock", tmp_path / "wav") as s:
        yield s


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> pytest.TestReport:
    """Keep the call's report, for the check below."""
    report = yield
    if report.when == "call":
        item.stash[CALL_REPORT] = report
    return report


CALL_REPORT = pytest.StashKey[pytest.TestReport]()


@pytest.fixture(autouse=True)
def umask_kept() -> Iterator[None]:
    """``speakd serve`` and ``speakd cache`` narrow the process's umask (speakd.paths.
    private_umask): a test that runs them in this process gives it back, so that what later
    tests make is not made private by the way (an overlay's upper directory at 0750 hid /etc
    from the desktop user of tests/test_user_identity.py)."""
    mask = os.umask(0o022)
    os.umask(mask)
    yield
    os.umask(mask)


@pytest.fixture(autouse=True)
def documented_setup_started(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test docs/setups.md names for a set-up, once passed, must have started every file its
    row says (tests/setups.py: what the test recorded as it started them)."""
    yield
    report = request.node.stash.get(CALL_REPORT, None)
    if report is not None and report.passed:
        missing = setups.unstarted(request.node.nodeid)
        assert not missing, f"docs/setups.md says this test starts {sorted(missing)}; it did not"
