"""A request's pitch: the engine's PCM shifted by semitones, its length (and so its speed and its
word timings) unchanged.

Neither engine has a pitch control, so pitch is post-processing on what the engine makes, per
text segment, on the synthesis thread: the shifted audio is what readers play and what the cache
stores (the pitch is in the key, ``speakd.request.prepare``).

An engine that can slow its own speech (a Piper voice's ``length_scale``) shifts by resampling
(``resampled``): it speaks ``ratio`` times slower and the stream is read back ``ratio`` times
faster, so pitch and formants rise together as on a tape, with no analysis window to wait for:
the first chunk costs about a millisecond more, and the stream joins into the one-shot result bit
for bit (``speakd.audio.resample``). Such an engine says so (``shifts_pitch``) and takes
``config.pitch`` itself; the resolver leaves its chunks alone.

For the others the shifter is Rubber Band, through
Spotify's ``pedalboard`` (manylinux wheels for x86_64 and aarch64, GPL-3 like speakd; why this
library: docs/ssml.md). A pitch of 0 never comes here: neutral requests keep their audio and keys.

pedalboard's streaming mode (``reset=False``) gives silence for ``PitchShift`` (pedalboard issue
#415), so each engine chunk (a decoder window of a sentence, for Piper voices) is shifted whole
as it comes, and the first audio waits only for the first chunk's own shift. Feeding the shifter
the end of the chunk before as context, cut off again afterwards, took the result further from a
one-shot shift of the whole text, at the seams and between them (docs/ssml.md), so it does not.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

from speakd.audio import AudioChunk, Word
from speakd.audio.resample import Resampler

log = logging.getLogger(__name__)

PITCH_RANGE = (-12.0, 12.0)  # semitones a request may ask for (one octave either way)
SSIP_SEMITONES = 12 / 100  # SSIP's PITCH −100..100 → ±1 octave
PITCH_STEP = 0.01  # semitones: SSML's precision; SSIP's PITCH moves by 0.12


def ssip_semitones(pitch: int) -> float | None:
    """SSIP's PITCH (−100..100, 0 the voice's own) as semitones; None at 0 (no processing)."""
    return None if pitch == 0 else round(pitch * SSIP_SEMITONES, 2)


def neutral(semitones: float | None) -> bool:
    return semitones is None or abs(semitones) < PITCH_STEP / 2


def resolved(semitones: float | None) -> float | None:
    """A request's pitch as it is keyed and shifted: None when neutral, else rounded to
    ``PITCH_STEP``, finer than any front-end's own step (SSIP's 0.12, SSML's 0.01), so a pitch is
    one of 2 401 values (its key, its resampling step), not any float a JSON client sends."""
    return None if neutral(semitones) else round(semitones, 2) + 0.0  # type: ignore[arg-type]


def ratio(semitones: float) -> float:
    """The frequency ratio of a shift: 2 ** (semitones / 12)."""
    return 2.0 ** (semitones / 12.0)


RESAMPLED = 6.0  # semitones either way an engine that ``shifts_pitch`` resamples (Orca's 1.2, 6)


def by_resampling(engine: Any, semitones: float | None) -> bool:
    """True when ``engine`` makes this pitch itself, slower and resampled (``resampled``);
    beyond ``RESAMPLED`` its speech drifts from the unshifted length, and Rubber Band does it."""
    return (
        getattr(engine, "shifts_pitch", False)
        and not neutral(semitones)
        and abs(semitones) <= RESAMPLED  # type: ignore[arg-type]
    )


def slower(semitones: float) -> float:
    """How much slower a voice speaks to be resampled by ``ratio(semitones)`` back to its
    length. Not the ratio itself: Piper rounds each phoneme's frames up, and the many one-frame
    pauses stay one frame at any speed, so speech stretched by r comes out shorter than r times.
    Half as much again, up to 1.5 semitones more, keeps a sentence's length within 1.5 % on
    average over the English corpus at −3 … +6 semitones (within 5–8 % for one sentence)."""
    return ratio(semitones + max(-1.5, min(1.5, semitones)))


def resampled(chunks: Iterable[AudioChunk], step: float) -> Iterator[AudioChunk]:
    """``chunks`` read ``step`` times faster at their own rate (``speakd.audio.resample``), their
    words moved with them: a word belongs to the output chunk its start falls in."""
    resampler = Resampler(step)
    fed, rate = 0, 0
    words: list[Word] = []  # not yet given, at output positions
    for chunk in chunks:
        rate = chunk.sample_rate
        words += [
            Word(w.text, round((fed + w.start) / step), round((fed + w.end) / step), w.kind)
            for w in chunk.words
        ]
        fed += chunk.frames
        start = resampler.made
        out = _chunk(resampler.feed(chunk.samples() / 32768.0), rate, start, words, last=False)
        if out is not None:
            yield out
    if rate:
        start = resampler.made
        out = _chunk(resampler.flush(), rate, start, words, last=True)
        if out is not None:
            yield out


def _chunk(
    y: np.ndarray, rate: int, start: int, words: list[Word], last: bool
) -> AudioChunk | None:
    """Output samples ``start`` … with the words that start in them (all that are left when
    ``last``), taken out of ``words``; None when there is neither."""
    here = [w for w in words if w.start < start + y.size or last]
    del words[: len(here)]
    if not y.size and not here:
        return None
    moved = tuple(Word(w.text, max(0, w.start - start), w.end - start, w.kind) for w in here)
    return AudioChunk.from_float(y, rate, moved)


@functools.cache
def _pitch_shift() -> Any:
    """pedalboard's PitchShift class, imported on first use: a daemon whose clients never ask for
    a pitch does not load it."""
    from pedalboard import PitchShift

    return PitchShift


@functools.cache
def unavailable() -> str | None:
    """Why pitch cannot be shifted on this machine (pedalboard missing, or a library its native
    module links, such as libatomic.so.1 on aarch64, absent), else None. Requests then speak at
    the voice's own pitch with a ``pitch_unavailable`` warning (``speakd.markup.plan``) instead
    of failing in the engine's thread, where the breaker would count it against the engine."""
    try:
        _pitch_shift()
    except (ImportError, OSError) as e:
        log.error("pitch is unavailable, requests keep the voice's own pitch: %s", e)
        return f"{type(e).__name__}: {e}"
    return None


class Shifter:
    """Shifts one segment's chunks, in order, by ``semitones``."""

    def __init__(self, semitones: float) -> None:
        self.semitones = semitones
        self._effect = _pitch_shift()(semitones=semitones)

    def shift(self, chunk: AudioChunk) -> AudioChunk:
        """``chunk`` shifted: the same number of samples and the same words."""
        if not chunk.frames:
            return chunk
        x = chunk.samples().astype(np.float32) / 32768.0
        y = self._effect.process(x, chunk.sample_rate, reset=True)  # same length: pedalboard
        return AudioChunk.from_float(y, chunk.sample_rate, chunk.words)  # trims its latency


def shifted(chunks: Iterable[AudioChunk], semitones: float | None) -> Iterator[AudioChunk]:
    """The chunks shifted by ``semitones``; as they are when it is neutral."""
    if neutral(semitones):
        yield from chunks
        return
    assert semitones is not None
    shifter = Shifter(semitones)
    for chunk in chunks:
        yield shifter.shift(chunk)
