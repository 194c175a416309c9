"""The engine contract: a loaded model that turns text into a stream of PCM chunks.

Engines know nothing of protocols, queues or sinks. ``synthesize`` is a generator that checks
``cancel`` between steps, so stop/cancel take effect within one step, and it is deterministic for a
given ``SynthesisConfig.seed``.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from speakd.audio import AudioChunk


class EngineError(Exception):
    """A synthesis failure the caller reports to the client (bad voice, model fault...)."""


class UnknownVoiceError(EngineError):
    pass


@dataclass(frozen=True)
class SynthesisConfig:
    """Per-request knobs; ``None`` means "the bundle's default". Built once, never mutated."""

    voice: str | None = None
    speed: float | None = None  # 1.0 = normal; engines map it to their own scale
    seed: int | None = None
    # Engine-specific sampling overrides (e.g. ChatTTS temperature/top_p/top_k).
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v not in (None, {})}


@dataclass(frozen=True)
class VoiceInfo:
    name: str
    language: str
    description: str = ""


class Engine(Protocol):
    kind: str
    sample_rate: int
    bundle_id: str  # identifies the model bytes; part of every cache key
    precision: str

    def voices(self) -> list[VoiceInfo]: ...

    def default_voice(self) -> str: ...

    def normalize_text(self, text: str) -> str:
        """The text as the model will read it; the cache key is built from this."""
        ...

    def audio_params(self, config: SynthesisConfig) -> dict[str, Any]:
        """Every resolved parameter that changes the audio (voice, speed, sampling...)."""
        ...

    def synthesize(
        self, text: str, config: SynthesisConfig, cancel: threading.Event | None = None
    ) -> Iterator[AudioChunk]: ...
