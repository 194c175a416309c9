"""A marked-up request's audio (speakd.request.compose): parts in order, exact silences, marks at
their sample offsets, per-part volume, another voice's rate resampled, sounds, errors and
cancellation."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

from speakd.audio import AudioChunk, Word
from speakd.request.compose import compose
from speakd.request.prepare import Marker, Silence, Sound, Speech
from speakd.request.stream import AudioStream

RATE = 16000


RAMP = np.arange(-800, 800, dtype="<i2")  # a sound whose every sample differs
SOUNDS = {
    Sound("ramp", "ramp"): AudioChunk(RAMP.tobytes(), RATE),
    Sound("ramp-22k", "ramp-22k"): AudioChunk(RAMP.tobytes(), 22050),
}


def tone(frames: int, rate: int = RATE, level: int = 8000) -> AudioChunk:
    return AudioChunk(np.full(frames, level, dtype="<i2").tobytes(), rate)


@dataclass(frozen=True)
class Stand:
    """A stand-in for a part's Prepared: its text names its stream."""

    text: str


class Parts:
    """Each part's stream, by a stand-in for its Prepared: whole at once (a hit) or filled by a
    producer thread (a miss)."""

    def __init__(self) -> None:
        self.streams: dict[str, AudioStream] = {}

    def hit(self, name: str, chunk: AudioChunk) -> Speech:
        self.streams[name] = AudioStream.complete(name, chunk)
        return Speech(Stand(name))  # type: ignore[arg-type]

    def miss(self, name: str, *chunks: AudioChunk, error: Exception | None = None) -> Speech:
        stream = AudioStream(name)

        def produce() -> None:
            for chunk in chunks:
                stream.put(chunk)
            stream.finish(error)

        threading.Thread(target=produce, daemon=True).start()
        self.streams[name] = stream
        return Speech(Stand(name))  # type: ignore[arg-type]

    def open(self, prepared: Any) -> AudioStream:
        return self.streams[prepared.text].attach()


def run(parts: list[Any], opener: Parts, rate: int = RATE) -> AudioStream:
    out = AudioStream("request").attach()
    compose(out, parts, rate, opener.open, SOUNDS.__getitem__)
    return out


def marks_at(out: AudioStream) -> dict[str, int]:
    """Each mark's sample offset, as a reader counts it."""
    offsets, frames = {}, 0
    for i, chunk in enumerate([*out.chunks, None]):
        for name in out.marks_before(i):
            offsets[name] = frames
        frames += chunk.frames if chunk is not None else 0
    return offsets


def test_parts_silences_and_marks_in_order() -> None:
    p = Parts()
    out = run(
        [p.hit("door", tone(1600)), Silence(700), p.miss("open", tone(800), tone(800)),
         Marker("m")],
        p,
    )  # fmt: skip
    pcm = np.concatenate([c.samples() for c in out.read()])
    assert len(pcm) == 1600 + 700 * RATE // 1000 + 1600
    assert not pcm[1600 : 1600 + 11200].any() and pcm[:1600].all() and pcm[-1600:].all()
    assert marks_at(out) == {"m": 1600 + 11200 + 1600}
    assert out.done and out.error is None and out.from_cache is False


def test_a_mark_between_parts_is_at_the_first_sample_of_the_next() -> None:
    p = Parts()
    out = run([Marker("start"), p.hit("a", tone(500)), Marker("mid"), p.hit("b", tone(300))], p)
    assert marks_at(out) == {"start": 0, "mid": 500}
    assert out.from_cache is True  # every part was a hit


def test_a_parts_volume_scales_only_that_part() -> None:
    p = Parts()
    parts = [p.hit("a", tone(100)), Speech(p.hit("b", tone(100)).prepared, volume=0.5)]
    samples = np.concatenate([c.samples() for c in run(parts, p).read()])
    assert set(samples[:100]) == {8000} and set(samples[100:]) == {4000}


def test_another_voices_rate_is_resampled_to_the_requests() -> None:
    p = Parts()
    out = run([p.hit("a", tone(1600)), p.miss("b", tone(2205, 22050), tone(2205, 22050))], p)
    assert {c.sample_rate for c in out.chunks} == {RATE}
    frames = sum(c.frames for c in out.chunks)
    assert abs(frames - (1600 + 3200)) <= 2  # 0.2 s at 22.05 kHz is 0.2 s at 16 kHz


def test_a_sound_is_its_samples_and_the_next_part_follows_its_last() -> None:
    p = Parts()
    out = run([Sound("ramp", "ramp"), Marker("text"), p.hit("a", tone(100))], p)
    pcm = np.concatenate([c.samples() for c in out.read()])
    assert np.array_equal(pcm, np.concatenate([RAMP, tone(100).samples()]))
    assert marks_at(out) == {"text": len(RAMP)}


def test_a_sound_of_another_rate_is_resampled_whole() -> None:
    """One resampling of the whole sound: its length scales exactly, nothing held back."""
    p = Parts()
    out = run([Sound("ramp-22k", "ramp-22k"), p.hit("a", tone(100))], p)
    assert {c.sample_rate for c in out.chunks} == {RATE}
    assert [c.frames for c in out.chunks] == [round(len(RAMP) * RATE / 22050), 100]


def test_a_parts_error_ends_the_request_with_it() -> None:
    p = Parts()
    out = run([p.hit("a", tone(100)), p.miss("b", tone(100), error=RuntimeError("engine died"))], p)
    with pytest.raises(RuntimeError, match="engine died"):
        list(out.read())


def test_a_cancelled_request_stops_and_releases_its_part() -> None:
    p = Parts()
    slow = AudioStream("slow")  # a synthesis that never ends by itself
    p.streams["slow"] = slow
    out = AudioStream("request").attach()
    worker = threading.Thread(
        target=compose,
        args=(out, [Speech(Stand("slow")), Silence(100)], RATE, p.open, SOUNDS.__getitem__),  # type: ignore[arg-type]
    )
    worker.start()
    slow.put(tone(100))
    assert next(out.read()).frames == 100  # the part's first chunk is through
    out.release()  # the last reader leaves
    worker.join(10)
    assert not worker.is_alive()
    assert slow.cancel.is_set()  # nobody else read the part: its synthesis is cancelled
    assert out.done and sum(c.frames for c in out.chunks) == 100  # no silence after the cancel


def test_a_parts_marks_land_on_the_words_they_precede_and_leave_its_audio_whole() -> None:
    """Marks are positions in one part: each at the first sample of the word it precedes (the
    chunk split there), ``Name:`` timed as ``Name``, a mark at the text's end after its audio."""
    p = Parts()
    words = (Word("Name", 100, 900), Word("text", 1000, 1500))
    first = AudioChunk(RAMP[:1200].tobytes(), RATE, words=words[:1] + words[1:])
    text = p.miss("Name: text", first, AudioChunk(RAMP[1200:].tobytes(), RATE))
    marked = Speech(text.prepared, marks=((0, "0:4"), (5, "6:10"), (10, "end")))
    out = run([marked], p)
    assert marks_at(out) == {"0:4": 100, "6:10": 1000, "end": len(RAMP)}
    assert np.array_equal(np.concatenate([c.samples() for c in out.read()]), RAMP)
    timed = [w.shifted(sum(c.frames for c in out.chunks[:i])) for i, c in enumerate(out.chunks)
             for w in c.words]  # fmt: skip
    assert timed == list(words)  # the word timings survive the split


def test_an_engine_that_times_sentences_places_their_marks_at_the_sentences_end() -> None:
    """ChatTTS names a sentence on an empty chunk after its audio: marks inside it, and before
    the next sentence, land there; one at the end after the audio."""
    p = Parts()
    sentence = AudioChunk(b"", RATE, words=(Word("One two.", -800, 0, "sentence"),))
    text = p.miss("One two. Three.", tone(800), sentence, tone(400))
    out = run([Speech(text.prepared, marks=((0, "a"), (4, "b"), (9, "c"), (15, "d")))], p)
    assert marks_at(out) == {"a": 800, "b": 800, "c": 800, "d": 1200}


def test_marks_in_text_without_spaces_land_between_its_sentences() -> None:
    """Chinese has no spaces: a mark is found by the text each timing says, not by words."""
    p = Parts()
    first = AudioChunk(b"", RATE, words=(Word("第一句。", -800, 0, "sentence"),))
    second = AudioChunk(b"", RATE, words=(Word("第二句。", -400, 0, "sentence"),))
    text = p.miss("第一句。第二句。", tone(800), first, tone(400), second)
    out = run([Speech(text.prepared, marks=((0, "a"), (2, "b"), (4, "c"), (8, "d")))], p)
    assert marks_at(out) == {"a": 800, "b": 800, "c": 800, "d": 1200}
