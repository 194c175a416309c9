"""A cached clip: whole-clip PCM16, what it was made from, and its row in the cache file.

Audio is stored as raw PCM16 (``ENCODING``): a hit is then a memcpy to the sink with no decoder on
the path. The file and every query are ``speakd.cache.store``'s; this is the value they carry, and
what prompt packs and the shipped pack read back.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from speakd.audio import SAMPLE_WIDTH, AudioChunk, Word

ENCODING = "pcm_s16le"


@dataclass
class Clip:
    """One cached utterance: whole-clip PCM16 plus what it was made from."""

    key: str
    text: str
    voice: str
    params: dict[str, Any]
    bundle: str
    sample_rate: int
    audio: bytes
    pinned: bool = False
    created: float = field(default_factory=time.time)
    expires: float | None = None
    last_used: float | None = None
    hits: int = 0
    encoding: str = ENCODING
    words: tuple[Word, ...] = ()  # the clip's word timings, samples from its start
    # what it was prepared with (SynthesisConfig.to_dict, seed as asked): a re-synthesis makes
    # the same clip (Resolver.remade); None in a clip stored before it was kept
    request: dict[str, Any] | None = None

    @property
    def bytes(self) -> int:
        return len(self.audio)

    @property
    def duration(self) -> float:
        return len(self.audio) / SAMPLE_WIDTH / self.sample_rate

    def expired(self, now: float) -> bool:
        return not self.pinned and self.expires is not None and self.expires <= now

    def chunk(self) -> AudioChunk:
        return AudioChunk(self.audio, self.sample_rate, words=self.words)

    def row(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "text": self.text,
            "voice": self.voice,
            "params": json.dumps(self.params, sort_keys=True),
            "bundle": self.bundle,
            "sample_rate": self.sample_rate,
            "encoding": self.encoding,
            "audio": self.audio,
            "duration": round(self.duration, 4),
            "pinned": int(self.pinned),
            "created": self.created,
            "expires": None if self.pinned else self.expires,
            "last_used": self.last_used if self.last_used is not None else self.created,
            "hits": self.hits,
            "bytes": self.bytes,
            "words": json.dumps([w.to_json() for w in self.words]) if self.words else None,
            "request": None if self.request is None else json.dumps(self.request, sort_keys=True),
        }

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Clip:
        return cls(
            key=row["key"],
            text=row["text"],
            voice=row["voice"],
            params=json.loads(row["params"]),
            bundle=row["bundle"],
            sample_rate=row["sample_rate"],
            audio=bytes(row["audio"]),
            pinned=bool(row["pinned"]),
            created=row["created"],
            expires=row["expires"],
            last_used=row["last_used"],
            hits=row["hits"],
            encoding=row["encoding"],
            words=tuple(Word.from_json(w) for w in json.loads(row.get("words") or "[]")),
            request=json.loads(row.get("request") or "null"),
        )
