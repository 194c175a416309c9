"""The library API: the example in docs/api.md runs as written, and matches the daemon's path."""

from __future__ import annotations

import re
import subprocess
import sys
import wave
from pathlib import Path

import pytest

import speakd
from speakd.audio import read_wav
from speakd.audio.pitch import PITCH_RANGE
from speakd.request.prepare import SPEED_RANGE
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


# What the daemon refuses (Control.build_request answers bad_field), every way in refuses.
OUT_OF_RANGE = [
    ("pitch", 50.0),
    ("pitch", PITCH_RANGE[0] - 0.5),
    ("speed", SPEED_RANGE[1] * 2),
    ("speed", SPEED_RANGE[0] / 2),
    ("speed", float("nan")),
]


@pytest.fixture(scope="module")
def engine() -> speakd.LoadedEngine:
    return speakd.load_engine()


@pytest.mark.parametrize(("field", "value"), OUT_OF_RANGE)
def test_the_library_refuses_out_of_range(
    engine: speakd.LoadedEngine, field: str, value: float
) -> None:
    with pytest.raises(speakd.library.api.RequestError, match=f"^{field} must be") as e:
        list(engine.synthesize("Out of range.", speakd.SynthesisConfig(**{field: value})))
    assert e.value.code == "bad_field"


SSML = "<speak>Too <emphasis>fast</emphasis>.</speak>"


@pytest.mark.parametrize(("flag", "text"), [("--pitch=50", "Far off pitch."), ("--speed=10", SSML)])
def test_speakd_synth_refuses_out_of_range(tmp_path: Path, flag: str, text: str) -> None:
    """As the help says (pitch −12..12): exit 2 and why, no file. SSML too, whose prosody would
    otherwise clamp what it adds to."""
    out = tmp_path / "out.wav"
    r = subprocess.run(
        [sys.executable, "-m", "speakd", "synth", text, "-o", str(out), flag],
        capture_output=True,
        text=True,
        timeout=180,
    )
    name = flag[2:].split("=")[0]
    assert r.returncode == 2 and f"speakd: {name} must be within" in r.stderr, r.stderr
    assert not out.exists()
