"""A marked-up request's audio: the streams of its parts in order, with silences and marks.

SSML (``speakd.markup``) and a request's ``chime`` make a request of several parts: runs of text,
each prepared and keyed on its own (``speakd.markup.plan``), silences, marks and sounds.
``compose`` produces the request's one ``AudioStream``: it opens each text part's own stream — a
cache hit, or a synthesis shared with every other reader of that key — and copies its chunks in,
scaled by the part's volume and resampled to the request's rate; a silence is zeros; a mark is
noted before the chunk it precedes (``AudioStream.marks``), and a text part's own marks are
placed inside its audio by its word timings (``speakd.request.marks``), the chunk split at the
mark's sample; a sound (``speakd.request.sounds``) is its samples, resampled whole, so the next
part follows its last sample with no gap. Only the parts are cached (with their word timings), so
the same sentence in other markup or with other marks shares its clip, and a mark's sample offset
is the same whichever parts were cached.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import numpy as np
import soxr

from speakd.audio import AudioChunk, scale_volume
from speakd.request.marks import Placer
from speakd.request.prepare import Marker, Part, Prepared, Silence, Sound, Speech
from speakd.request.stream import AudioStream

OpenPart = Callable[[Prepared], AudioStream]
OpenSound = Callable[[Sound], AudioChunk]


def compose(
    out: AudioStream,
    parts: Sequence[Part],
    sample_rate: int,
    open_part: OpenPart,
    open_sound: OpenSound,
) -> None:
    """Fill ``out`` from ``parts`` (on a thread of its own): ``open_part`` returns a text part's
    stream with a reader attached, ``open_sound`` a sound's samples. Ends ``out`` cleanly, with
    the first part's error, or early when ``out`` is cancelled (its last reader left)."""
    out.begin()
    cached = True
    try:
        for part in parts:
            if out.cancel.is_set():
                break
            if isinstance(part, Marker):
                out.mark(part.name)
            elif isinstance(part, Silence):
                frames = part.ms * sample_rate // 1000
                out.put(AudioChunk(bytes(2 * frames), sample_rate))
            elif isinstance(part, Sound):
                out.put(_at_rate(open_sound(part), sample_rate))
            else:
                cached &= _copy(out, open_part(part.prepared), part, sample_rate)
    except Exception as e:  # a part's failure is the request's
        out.finish(e)
        return
    out.from_cache = cached
    out.finish()


def _copy(out: AudioStream, stream: AudioStream, part: Speech, sample_rate: int) -> bool:
    """A part's chunks into ``out``, its marks placed among them; whether they came from the
    cache."""
    resampler: soxr.ResampleStream | None = None
    placer = Placer(part.prepared.text, part.marks)
    volume = part.volume
    try:
        for chunk in stream.read(out.cancel):
            if chunk.sample_rate != sample_rate and resampler is None:
                resampler = soxr.ResampleStream(chunk.sample_rate, sample_rate, 1, dtype="int16")
            if resampler is not None:
                chunk = _resampled(resampler, chunk, sample_rate)
            for names, piece in placer.place(chunk):
                for name in names:
                    out.mark(name)
                if piece.pcm or piece.words or not names:  # marks at its end: before the next
                    out.put(scale_volume(piece, volume))
        if resampler is not None:
            tail = resampler.resample_chunk(np.zeros(0, dtype="<i2"), last=True)
            out.put(scale_volume(AudioChunk(tail.astype("<i2").tobytes(), sample_rate), volume))
        for name in placer.rest():
            out.mark(name)
        return stream.from_cache
    finally:
        stream.release()


def _at_rate(chunk: AudioChunk, rate: int) -> AudioChunk:
    """A whole sound at the request's rate, resampled in one go (no stream delay to flush)."""
    if chunk.sample_rate == rate:
        return chunk
    pcm = soxr.resample(chunk.samples(), chunk.sample_rate, rate)
    return AudioChunk(np.asarray(pcm, dtype="<i2").tobytes(), rate)


def _resampled(resampler: soxr.ResampleStream, chunk: AudioChunk, rate: int) -> AudioChunk:
    """A voice of another rate than the request's first (a ``<voice>`` switch), at its rate;
    its word timings scaled (to within the resampler's few samples of delay)."""
    pcm = resampler.resample_chunk(chunk.samples(), last=False)
    ratio = rate / chunk.sample_rate
    words = tuple(
        dataclasses.replace(w, start=round(w.start * ratio), end=round(w.end * ratio))
        for w in chunk.words
    )
    return AudioChunk(pcm.astype("<i2").tobytes(), rate, words=words)
