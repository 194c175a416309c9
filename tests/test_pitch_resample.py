"""Pitch by resampling (``speakd.audio.resample``, ``speakd.audio.pitch.resampled``): a Piper
voice speaks slower and is read back faster, so a screen reader's pitch costs its first audio
about a millisecond instead of a Rubber Band run; the stream joins into the one-shot result."""

from __future__ import annotations

import numpy as np
import pytest

from speakd.audio import AudioChunk, Word, join_chunks
from speakd.audio.pitch import RESAMPLED, by_resampling, ratio, resampled, slower
from speakd.audio.resample import Resampler
from speakd.engines.base import SynthesisConfig
from speakd.engines.vits.engine import VitsEngine
from tests.tone_engine import ToneEngine

TEXT = "Open table check menu item not checked."


@pytest.fixture(scope="module")
def engine() -> VitsEngine:
    return VitsEngine.embedded(threads=2)


@pytest.mark.parametrize("semitones", [1.2, 6.0, -3.0])
def test_a_stream_resamples_into_the_one_shot_samples(semitones: float) -> None:
    x = np.random.default_rng(1).standard_normal(30000).astype(np.float32)
    step = ratio(semitones)
    one = Resampler(step)
    whole = np.concatenate([one.feed(x), one.flush()])
    assert whole.size == round(x.size / step)
    cut = Resampler(step)
    parts, at = [], 0
    for n in (1, 7, 3000, 2, 12000):
        parts.append(cut.feed(x[at : at + n]))
        at += n
    parts += [cut.feed(x[at:]), cut.flush()]
    assert np.array_equal(np.concatenate(parts), whole)


def test_a_tone_rises_by_the_ratio() -> None:
    rate = 22050
    tone = np.sin(2 * np.pi * 200 * np.arange(rate) / rate).astype(np.float32)
    r = Resampler(ratio(1.2))
    y = np.concatenate([r.feed(tone), r.flush()])[2000:-2000]
    spectrum = np.abs(np.fft.rfft(y * np.hanning(y.size), 8 * y.size))
    peak = np.argmax(spectrum) * rate / (8 * y.size)
    assert 12 * np.log2(peak / 200) == pytest.approx(1.2, abs=0.01)


def test_words_move_with_the_samples() -> None:
    rate = 22050
    chunks = [
        AudioChunk.from_float(np.zeros(1000), rate, (Word("a", 10, 900),)),
        AudioChunk.from_float(np.zeros(1000), rate, (Word("b", 500, 1500),)),
    ]
    step = ratio(6.0)
    out = list(resampled(chunks, step))
    assert sum(c.frames for c in out) == round(2000 / step)
    starts, at = {}, 0
    for c in out:
        starts.update({w.text: at + w.start for w in c.words})
        at += c.frames
    assert starts == {"a": round(10 / step), "b": round(1500 / step)}


def test_a_piper_voice_makes_orca_s_pitches_and_rubber_band_the_rest() -> None:
    tone, piper = ToneEngine(), VitsEngine
    assert not by_resampling(tone, 1.2)
    assert by_resampling(piper, 1.2) and by_resampling(piper, -RESAMPLED)
    assert not by_resampling(piper, RESAMPLED + 0.5) and not by_resampling(piper, 0.0)


def test_the_voice_is_resampled_as_it_streams_and_keeps_its_length(engine: VitsEngine) -> None:
    config = SynthesisConfig(seed=3, pitch=1.2)
    stream = engine.synthesize(TEXT, config)
    first = next(stream)
    rest = list(stream)
    assert first.frames > 0 and len(rest) >= 1
    shifted = join_chunks([first, *rest])
    slow = join_chunks(engine._sentences(TEXT, config, None, slower(1.2)))
    r = Resampler(ratio(1.2))
    x = slow.samples() / 32768.0
    once = AudioChunk.from_float(np.concatenate([r.feed(x), r.flush()]), slow.sample_rate)
    assert shifted.pcm == once.pcm  # streamed = the slow speech resampled in one call
    plain = join_chunks(engine.synthesize(TEXT, SynthesisConfig(seed=3)))
    assert shifted.duration == pytest.approx(plain.duration, rel=0.08)
    assert [w.text for w in shifted.words] == [w.text for w in plain.words]
