"""The library API: the example in docs/api.md runs as written, and matches the daemon's path."""

from __future__ import annotations

import re
import wave
from pathlib import Path

import pytest

import speakd
from speakd.audio import read_wav
from tests.daemon_proc import synth

DOC = Path(__file__).resolve().parents[1] / "docs" / "api.md"


def test_the_documented_example_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    [example] = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)
    monkeypatch.chdir(tmp_path)
    exec(compile(example, str(DOC), "exec"), {})
    with wave.open(str(tmp_path / "door.wav")) as w:
        assert w.getframerate() == 22050 and w.getnframes() > 22050  # over a second of speech


def test_library_audio_is_the_daemons(tmp_path: Path) -> None:
    """``speakd synth`` (the daemon's request path) and the library give the same bytes."""
    text = "Library and daemon agree."
    engine = speakd.load_engine()
    assert speakd.SynthesisConfig is speakd.library.api.SynthesisConfig
    assert engine.synthesize_wav(text, tmp_path / "lib.wav") > 1.0
    reference = synth(text, tmp_path / "cli.wav")
    assert read_wav(tmp_path / "lib.wav").pcm == read_wav(reference).pcm
    with pytest.raises(speakd.library.api.RequestError) as e:
        list(engine.synthesize(text, speakd.SynthesisConfig(lang="zh")))
    assert e.value.code == "unknown_language"
