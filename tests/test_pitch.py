"""Pitch: the engine's PCM shifted by Rubber Band (``speakd.audio.pitch``), keyed, length
unchanged."""

from __future__ import annotations

import numpy as np
import pytest

from speakd.audio import AudioChunk, Word, join_chunks
from speakd.audio import pitch as pitch_module
from speakd.audio.pitch import Shifter, shifted, ssip_semitones
from speakd.audio.sinks import NullSink
from speakd.control import Control
from speakd.engines.base import SynthesisConfig
from speakd.lifecycle.doctor import WARN, _check_pitch
from speakd.request.errors import RequestError
from speakd.request.messages import SpeakRequest
from speakd.request.prepare import prepare
from speakd.request.resolver import Resolver
from speakd.request.scheduler import Scheduler
from speakd.request.stream import Cancel
from speakd.request.voices import VoiceLibrary
from tests.tone_engine import ToneEngine

TEXT = "one two three four five six"
LIBATOMIC = "libatomic.so.1: cannot open shared object file: No such file or directory"


def peak_hz(samples: np.ndarray, rate: int) -> float:
    spectrum = np.abs(np.fft.rfft(samples.astype(np.float64) * np.hanning(samples.size)))
    return float(np.fft.rfftfreq(samples.size, 1 / rate)[np.argmax(spectrum)])


def played(pitch: float | None) -> tuple[str, AudioChunk]:
    engine = ToneEngine()
    config = SynthesisConfig(pitch=pitch)
    prepared = VoiceLibrary.of(engine).prepare(TEXT, config)
    request = SpeakRequest(text=TEXT, config=config, prepared=prepared)
    audio = join_chunks(Resolver(engine).stream(request, Cancel()))
    assert audio is not None
    return prepared.key, audio


def test_a_neutral_pitch_keeps_the_key_and_the_audio() -> None:
    engine = ToneEngine()
    plain = prepare(engine, TEXT, SynthesisConfig())
    for neutral in (None, 0.0, -0.0):
        same = prepare(engine, TEXT, SynthesisConfig(pitch=neutral))
        assert same.key == plain.key and "pitch" not in same.params
        assert same.config == plain.config
    assert played(0.0)[1].pcm == played(None)[1].pcm


def test_pitch_is_in_the_key_but_not_in_the_seed() -> None:
    engine = ToneEngine()
    plain = prepare(engine, TEXT, SynthesisConfig())
    up = prepare(engine, TEXT, SynthesisConfig(pitch=2.0))
    assert up.key != plain.key and up.params["pitch"] == 2.0
    assert up.config.seed == plain.config.seed  # the same speech, higher


@pytest.mark.parametrize("semitones", [12.0, -5.0])
def test_the_request_path_shifts_the_pitch_and_keeps_the_length(semitones: float) -> None:
    _, plain = played(None)
    _, shifted_audio = played(semitones)
    assert shifted_audio.frames == plain.frames
    rate = plain.sample_rate
    middle = slice(rate // 10, rate // 2)  # inside the audio, across the 0.1 s chunk seams
    want = peak_hz(plain.samples()[middle], rate) * 2 ** (semitones / 12)
    assert peak_hz(shifted_audio.samples()[middle], rate) == pytest.approx(want, rel=0.03)


def test_a_chunk_keeps_its_length_and_its_words() -> None:
    rate = 22050
    t = np.arange(rate // 5) / rate
    words = (Word("a", 10, 300),)
    chunk = AudioChunk.from_float(0.3 * np.sin(2 * np.pi * 150 * t), rate, words)
    shifter = Shifter(3.0)
    out = [shifter.shift(chunk), shifter.shift(AudioChunk(b"", rate)), shifter.shift(chunk)]
    assert [c.frames for c in out] == [chunk.frames, 0, chunk.frames]
    assert out[0].words == words and out[2].words == words


def test_neutral_chunks_pass_untouched() -> None:
    chunks = [AudioChunk(b"\x01\x00" * 100, 16000)]
    assert list(shifted(chunks, 0.0)) == chunks


def test_ssip_pitch_is_an_octave_either_way() -> None:
    assert ssip_semitones(0) is None
    assert (ssip_semitones(100), ssip_semitones(-100), ssip_semitones(50)) == (12.0, -12.0, 6.0)


def test_a_pitch_out_of_range_is_refused() -> None:
    control = Control(Scheduler(Resolver(ToneEngine()), NullSink()), max_text_chars=100)
    for bad in (13, "high", True):
        with pytest.raises(RequestError, match="pitch"):
            control.build_request({"text": "x", "pitch": bad}, origin="test")


@pytest.fixture
def no_pedalboard(monkeypatch: pytest.MonkeyPatch):
    """pedalboard's native module failing to load, as on an aarch64 board without libatomic.so.1."""

    def fails() -> None:
        raise ImportError(LIBATOMIC)

    monkeypatch.setattr(pitch_module, "_pitch_shift", fails)
    pitch_module.unavailable.cache_clear()
    yield
    pitch_module.unavailable.cache_clear()


@pytest.mark.parametrize(
    "fields",
    [
        {"text": TEXT, "pitch": 6},
        {"text": f"<speak><prosody pitch='+6st'>{TEXT}</prosody></speak>"},
    ],
    ids=["field", "ssml"],
)
def test_a_pitch_this_machine_cannot_shift_is_spoken_at_the_voice_pitch_with_a_warning(
    no_pedalboard: None, fields: dict
) -> None:
    """Not an engine failure (which the breaker would count until the voice is unavailable for
    every request): the text is spoken, keyed and cached as the neutral text, and the client is
    told."""
    engine = ToneEngine()
    control = Control(Scheduler(Resolver(engine), NullSink()), max_text_chars=1000)
    request = control.build_request(fields, origin="test")
    assert [w.code for w in request.warnings] == ["pitch_unavailable"]
    assert LIBATOMIC in request.warnings[0].message
    neutral = control.build_request({"text": TEXT}, origin="test")
    assert request.prepared.key == neutral.prepared.key
    audio = join_chunks(Resolver(engine).stream(request, Cancel()))
    assert audio is not None and audio.pcm == played(None)[1].pcm


def test_doctor_warns_when_pitch_cannot_be_shifted(no_pedalboard: None) -> None:
    ok, detail = _check_pitch()
    assert ok == WARN and LIBATOMIC in detail and "apt-get install libatomic1" in detail


def test_doctor_says_pitch_works() -> None:
    assert _check_pitch()[0] is True


def test_a_request_prepared_anew_is_spoken_at_the_voice_pitch_too(no_pedalboard: None) -> None:
    """The resolver prepares again a request whose voice was reloaded since (or that came with
    no preparation): it too keeps the voice's pitch instead of failing in the engine's thread."""
    request = SpeakRequest(text=TEXT, config=SynthesisConfig(pitch=6.0))
    audio = join_chunks(Resolver(ToneEngine()).stream(request, Cancel()))
    assert audio is not None and audio.pcm == played(None)[1].pcm
