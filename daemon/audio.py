"""PCM chunks as they flow from engine or cache to a sink, and WAV helpers."""

from __future__ import annotations

import io
import wave
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

SAMPLE_WIDTH = 2  # int16 little-endian everywhere in speakd


@dataclass(frozen=True)
class AudioChunk:
    """Mono int16 PCM; each chunk carries its own rate so sinks never guess."""

    pcm: bytes
    sample_rate: int
    channels: int = 1
    sample_width: int = SAMPLE_WIDTH

    @property
    def frames(self) -> int:
        return len(self.pcm) // (self.sample_width * self.channels)

    @property
    def duration(self) -> float:
        return self.frames / self.sample_rate

    def samples(self) -> np.ndarray:
        return np.frombuffer(self.pcm, dtype="<i2")

    @classmethod
    def from_float(cls, audio: np.ndarray, sample_rate: int) -> AudioChunk:
        """Float audio in [-1, 1] → int16, clipped (VITS and Vocos both overshoot now and then)."""
        pcm = (np.clip(audio, -1.0, 1.0) * 32767.0).astype("<i2")
        return cls(pcm.tobytes(), sample_rate)


def scale_volume(chunk: AudioChunk, volume: float) -> AudioChunk:
    """Volume is applied after synthesis so it never changes what the cache stores."""
    if volume == 1.0:
        return chunk
    scaled = np.clip(chunk.samples().astype(np.float32) * volume, -32768, 32767).astype("<i2")
    return AudioChunk(scaled.tobytes(), chunk.sample_rate, chunk.channels, chunk.sample_width)


def join_chunks(chunks: Iterable[AudioChunk]) -> AudioChunk | None:
    chunks = list(chunks)
    if not chunks:
        return None
    rates = {c.sample_rate for c in chunks}
    if len(rates) != 1:
        raise ValueError(f"cannot join chunks of different sample rates {sorted(rates)}")
    return AudioChunk(b"".join(c.pcm for c in chunks), chunks[0].sample_rate)


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
