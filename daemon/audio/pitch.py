"""A request's pitch: the engine's PCM shifted by semitones, its length (and so its speed and its
word timings) unchanged.

Neither engine has a pitch control, so pitch is post-processing on what the engine makes, per
text segment, on the synthesis thread: the shifted audio is what readers play and what the cache
stores (the pitch is in the key, ``speakd.request.prepare``). The shifter is Rubber Band, through
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

from speakd.audio import AudioChunk

log = logging.getLogger(__name__)

PITCH_RANGE = (-12.0, 12.0)  # semitones a request may ask for (one octave either way)
SSIP_SEMITONES = 12 / 100  # SSIP's PITCH −100..100 → ±1 octave


def ssip_semitones(pitch: int) -> float | None:
    """SSIP's PITCH (−100..100, 0 the voice's own) as semitones; None at 0 (no processing)."""
    return None if pitch == 0 else round(pitch * SSIP_SEMITONES, 2)


def neutral(semitones: float | None) -> bool:
    return semitones is None or abs(semitones) < 0.005


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
