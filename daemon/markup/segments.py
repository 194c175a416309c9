"""The canonical, engine-neutral form of what a request says.

A request's markup becomes a list of segments: runs of text with their voice, prosody and
language (``Text``), phonemes to say as written (``Phonemes``), silences (``Break``), points to
report when playback reaches them (``Mark``) and pinned clips (``Audio``). Equivalent markup
gives equal segments, so ``canonical`` — the string the audio key is built from — is the same for
markup that differs only in whitespace, attribute order or units (``500ms`` and ``0.5s``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from speakd.engines.keys import canonical_json

_SPACE = re.compile(r"\s+")
_SPACE_BEFORE_PUNCTUATION = re.compile(r"\s+(?=[.,!?;:…。，、！？；：])")


@dataclass(frozen=True)
class Style:
    """How a run of text is spoken. ``rate`` and ``volume`` are factors (1.0 = unchanged),
    ``pitch`` a shift in semitones; ``voice`` and ``lang`` None mean the request's own."""

    voice: str | None = None
    lang: str | None = None
    rate: float = 1.0
    volume: float = 1.0
    pitch: float = 0.0

    def to_json(self) -> dict[str, Any]:
        """Only what differs from the request's defaults, so plain text keys stay short."""
        out: dict[str, Any] = {}
        if self.voice is not None:
            out["voice"] = self.voice
        if self.lang is not None:
            out["lang"] = self.lang
        if self.rate != 1.0:
            out["rate"] = self.rate
        if self.volume != 1.0:
            out["volume"] = self.volume
        if self.pitch != 0.0:
            out["pitch"] = self.pitch
        return out


@dataclass(frozen=True)
class Text:
    text: str
    style: Style = field(default_factory=Style)

    def to_json(self) -> dict[str, Any]:
        return {"type": "text", "text": self.text, **self.style.to_json()}


@dataclass(frozen=True)
class Phonemes:
    """IPA to speak as written (Piper voices); ``text`` is what an engine without phoneme input
    says instead."""

    ph: str
    text: str
    style: Style = field(default_factory=Style)

    def to_json(self) -> dict[str, Any]:
        return {"type": "phonemes", "ph": self.ph, "text": self.text, **self.style.to_json()}


@dataclass(frozen=True)
class Break:
    ms: int

    def to_json(self) -> dict[str, Any]:
        return {"type": "break", "ms": self.ms}


@dataclass(frozen=True)
class Mark:
    name: str

    def to_json(self) -> dict[str, Any]:
        return {"type": "mark", "name": self.name}


@dataclass(frozen=True)
class Audio:
    """A pinned clip by name; ``alt`` is said when there is no such clip."""

    src: str
    alt: tuple[Segment, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"type": "audio", "src": self.src, "alt": [s.to_json() for s in self.alt]}


Segment = Text | Phonemes | Break | Mark | Audio


def canonical(segments: Iterable[Segment]) -> str:
    """The one string for a segment list: what the audio key of marked-up text is built from."""
    return canonical_json([s.to_json() for s in segments])


def clean(text: str) -> str:
    """Whitespace runs as one space, none before punctuation ("twelve ." is "twelve.")."""
    return _SPACE_BEFORE_PUNCTUATION.sub("", _SPACE.sub(" ", text)).strip()


def speakable(text: str) -> bool:
    """Whether a run of text has anything to say (a letter, digit or CJK character)."""
    return any(c.isalnum() for c in text)


def tidy(segments: Iterable[Segment]) -> list[Segment]:
    """Whitespace collapsed (``clean``), empty runs dropped, neighbours of one style and adjacent
    breaks joined: one canonical list for every equivalent way of writing it. Punctuation alone
    stays (it ends the sentence before it); a run with nothing to say is skipped when planned."""
    out: list[Segment] = []
    for seg in segments:
        if isinstance(seg, Text):
            seg = replace(seg, text=clean(seg.text))
            if not seg.text:
                continue
        elif isinstance(seg, Phonemes):
            seg = replace(seg, ph=seg.ph.strip(), text=_SPACE.sub(" ", seg.text).strip())
        elif isinstance(seg, Break) and seg.ms <= 0:
            continue
        last = out[-1] if out else None
        if isinstance(seg, Text) and isinstance(last, Text) and last.style == seg.style:
            out[-1] = replace(last, text=clean(f"{last.text} {seg.text}"))
        elif isinstance(seg, Break) and isinstance(last, Break):
            out[-1] = Break(last.ms + seg.ms)
        else:
            out.append(seg)
    return out
