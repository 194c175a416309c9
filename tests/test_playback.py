"""Playback through a real PortAudio stream into ALSA's ``file`` plugin (no sound card needed).

The plugin is made the default device by a ``.asoundrc`` in the daemon's $HOME; it writes every
frame PortAudio hands to ALSA into a raw file, so the test compares what reached the "device"
with what the engine produced.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from speakd.audio import read_wav
from tests.daemon_proc import start_daemon, synth, write_config

pytest.importorskip("sounddevice", exc_type=OSError)

TEXT = "Hello from speakd. The door is open."


def asound_home(tmp_path: Path) -> tuple[Path, Path]:
    home = tmp_path / "home"
    home.mkdir()
    captured = tmp_path / "captured.raw"
    (home / ".asoundrc").write_text(
        f'pcm.!default {{ type file; slave.pcm "null"; file "{captured}"; format "raw" }}\n'
    )
    return home, captured


def test_played_pcm_reaches_the_device_unchanged(tmp_path: Path) -> None:
    home, captured = asound_home(tmp_path)
    reference = synth(TEXT, tmp_path / "ref.wav")
    d = start_daemon(write_config(tmp_path, sink="sounddevice"), env={"HOME": str(home)})
    try:
        status = d.cli("status")
        assert '"available": true' in status.stdout, status.stdout
        r = d.cli("say", TEXT, "--wait")
        assert r.returncode == 0, r.stderr + d.log_text()
    finally:
        assert d.stop() == 0
    expected = read_wav(reference).samples()
    got = np.frombuffer(captured.read_bytes(), dtype="<i2")
    # ALSA may pad with silence around the utterance; the speech itself must be bit-exact.
    start = int(np.flatnonzero(got)[0])
    first = int(np.flatnonzero(expected)[0])
    offset = start - first
    assert offset >= 0
    assert np.array_equal(got[offset : offset + len(expected)], expected)
    assert not got[offset + len(expected) :].any()


def test_missing_device_is_a_state_not_a_crash(tmp_path: Path) -> None:
    home, _ = asound_home(tmp_path)
    config = write_config(tmp_path, extra="", sink="sounddevice")
    config.write_text(config.read_text().replace("[audio]", '[audio]\ndevice = "no-such-speaker"'))
    d = start_daemon(config, env={"HOME": str(home)})
    try:
        r = d.cli("say", "Is anybody there?", "--wait", "--json")
        assert r.returncode == 1
        assert "audio_unavailable" in r.stdout
        status = d.cli("status").stdout
        assert '"available": false' in status
        assert d.cli("say", "Still here?", "--wait").returncode == 1  # still serving, still clear
    finally:
        assert d.stop() == 0
