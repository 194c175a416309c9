"""PCM chunks as they flow from engine or cache to a sink, and WAV helpers."""

from __future__ import annotations

import io
import wave
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

SAMPLE_WIDTH = 2  # int16 little-endian everywhere in speakd


@dataclass(frozen=True)
class Word:
    """A spoken word (or, for an engine without word timings, a sentence: ``kind``) and where it
    is in its chunk's audio: samples from the chunk's first, ``end`` exclusive. A word belongs to
    the chunk its start falls in; its end may lie in a later chunk. A sentence whose end is known
    only once all of it is made (ChatTTS) comes on an empty chunk after it, ``start`` negative.
    Front-ends name the event by ``kind``: ``word`` or ``sentence``."""

    text: str
    start: int
    end: int
    kind: str = "word"

    def shifted(self, offset: int) -> Word:
        return replace(self, start=self.start + offset, end=self.end + offset)

    def to_json(self) -> list[str | int]:
        return [self.text, self.start, self.end, self.kind]

    @classmethod
    def from_json(cls, item: list[str | int]) -> Word:
        text, start, end, kind = item
        return cls(str(text), int(start), int(end), str(kind))

    def event(self, offset: int, sample_rate: int) -> dict[str, str | int | float]:
        """What a ``word`` (``sentence``) event says on every front-end: the word (sentence), and
        its start and end in samples and seconds from the start of the audio, the chunk being
        ``offset`` samples in."""
        start, end = offset + self.start, offset + self.end
        return {
            self.kind: self.text,
            "start": start,
            "end": end,
            "start_s": round(start / sample_rate, 3),
            "end_s": round(end / sample_rate, 3),
        }


@dataclass(frozen=True)
class AudioChunk:
    """Mono int16 PCM; each chunk carries its own rate so sinks never guess, and the timings of
    the words that start in it (``Word``), so every reader of a stream and the cache get them."""

    pcm: bytes
    sample_rate: int
    channels: int = 1
    sample_width: int = SAMPLE_WIDTH
    words: tuple[Word, ...] = ()

    @property
    def frames(self) -> int:
        return len(self.pcm) // (self.sample_width * self.channels)

    @property
    def duration(self) -> float:
        return self.frames / self.sample_rate

    def samples(self) -> np.ndarray:
        return np.frombuffer(self.pcm, dtype="<i2")

    @classmethod
    def from_float(
        cls, audio: np.ndarray, sample_rate: int, words: tuple[Word, ...] = ()
    ) -> AudioChunk:
        """Float audio in [-1, 1] → int16, clipped (VITS and Vocos both overshoot now and then)."""
        pcm = (np.clip(audio, -1.0, 1.0) * 32767.0).astype("<i2")
        return cls(pcm.tobytes(), sample_rate, words=words)


def scale_volume(chunk: AudioChunk, volume: float) -> AudioChunk:
    """Volume is applied after synthesis so it never changes what the cache stores."""
    if volume == 1.0:
        return chunk
    scaled = np.clip(chunk.samples().astype(np.float32) * volume, -32768, 32767).astype("<i2")
    return replace(chunk, pcm=scaled.tobytes())


def join_chunks(chunks: Iterable[AudioChunk]) -> AudioChunk | None:
    chunks = list(chunks)
    if not chunks:
        return None
    rates = {c.sample_rate for c in chunks}
    if len(rates) != 1:
        raise ValueError(f"cannot join chunks of different sample rates {sorted(rates)}")
    words: list[Word] = []
    offset = 0
    for c in chunks:
        words.extend(w.shifted(offset) for w in c.words)
        offset += c.frames
    return AudioChunk(b"".join(c.pcm for c in chunks), chunks[0].sample_rate, words=tuple(words))


def wav_bytes(chunk: AudioChunk) -> bytes:
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(chunk.channels)
        w.setsampwidth(chunk.sample_width)
        w.setframerate(chunk.sample_rate)
        w.writeframes(chunk.pcm)
    return buf.getvalue()


def write_wav(path: Path, chunk: AudioChunk) -> None:
    path.write_bytes(wav_bytes(chunk))


def read_wav(path: Path) -> AudioChunk:
    with wave.open(str(path), "rb") as w:
        if w.getsampwidth() != SAMPLE_WIDTH:
            raise ValueError(f"{path}: expected 16-bit PCM, got {8 * w.getsampwidth()}-bit")
        return AudioChunk(w.readframes(w.getnframes()), w.getframerate(), w.getnchannels())
