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
from speakd.engines.options import Option


class EngineError(Exception):
    """A synthesis failure the caller reports to the client (bad voice, model fault...)."""


class UnknownVoiceError(EngineError):
    code = "unknown_voice"


class UnknownSpeakerError(EngineError):
    code = "unknown_speaker"


class TextTooLongError(EngineError):
    """More text than the engine takes in one request."""

    code = "text_too_long"


@dataclass(frozen=True)
class SynthesisConfig:
    """Per-request knobs; ``None`` means "the bundle's default". Built once, never mutated."""

    voice: str | None = None
    speaker: str | None = None  # a multi-speaker voice's speaker, by name or id
    speed: float | None = None  # 1.0 = normal; engines map it to their own scale
    seed: int | None = None
    lang: str | None = None  # a language the voice speaks ("en", "zh"); None = the voice's own
    # semitones; not the engine's: its PCM is shifted afterwards (speakd.audio.pitch). None = as
    # made
    pitch: float | None = None
    # The engine's declared options (``Engine.options``), already validated.
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v not in (None, {})}


@dataclass(frozen=True)
class VoiceInfo:
    name: str
    language: str  # one code ("en_US") or several, comma-separated ("zh,en")
    description: str = ""
    speakers: tuple[str, ...] = ()  # a multi-speaker voice's speakers; the first is its default

    @property
    def languages(self) -> tuple[str, ...]:
        return tuple(code.strip() for code in self.language.split(",") if code.strip())


class VoiceModel(Protocol):
    """What a voice means without its model loaded: names, text and parameters. Requests are
    prepared (keyed) against it, so a cached clip plays while the model stays unloaded."""

    kind: str
    sample_rate: int
    bundle_id: str  # identifies the model bytes; part of every cache key
    precision: str
    options: tuple[Option, ...]  # what a request may tune (speakd.engines.options)
    # the tools' measurement of this voice over the calibration text (the bundle manifest's
    # ``loudness``, speakd.request.loudness), so the device need not spend a synthesis on it; or
    # None
    loudness_record: dict[str, Any] | None

    def voices(self) -> list[VoiceInfo]: ...

    def default_voice(self) -> str: ...

    def normalize_text(self, text: str, lang: str | None = None) -> str:
        """The text as the model will read it; the cache key is built from this."""
        ...

    def audio_params(self, config: SynthesisConfig) -> dict[str, Any]:
        """Every resolved parameter that changes the audio (voice, speed, sampling, a language
        that changes how the text is read...)."""
        ...


class Engine(VoiceModel, Protocol):
    """A loaded model: a ``VoiceModel`` that synthesises."""

    def synthesize(
        self, text: str, config: SynthesisConfig, cancel: threading.Event | None = None
    ) -> Iterator[AudioChunk]: ...
