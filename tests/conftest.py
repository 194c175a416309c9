"""Shared fixtures: a tiny random ChatTTS checkpoint and its fp32 bundle, built once per session
through the real `speakd-tools` commands (export runs its parity check; the bundle's manifest
carries the report)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.mosquitto import Mosquitto
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
def ssip_server(tmp_path: Path) -> Iterator[SsipServer]:
    """The in-process SSIP server on the tone engine, writing WAVs (tests.ssip_harness)."""
    with wav_server(tmp_path / "ssip.sock", tmp_path / "wav") as s:
        yield s
