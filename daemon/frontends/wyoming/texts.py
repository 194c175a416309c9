"""What a Wyoming connection is asked to speak, before any request is made of it: the jobs its
work task speaks in turn (``Say``, ``STOPPED``), a text streamed in (``TextStream``: a ``<speak>``
document told from plain text by its start), and a long whole text cut into sentences
(``whole_parts``). Nothing here reads or writes the connection: ``connection.py`` does."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from speakd.frontends.wyoming.sentences import SentenceSplitter
from speakd.markup.ssml import is_ssml


@dataclass(frozen=True)
class Say:
    """A job: one answer (audio-start … audio-stop) to speak, made into requests when its turn
    comes, so that a refusal is answered in order and a reload's new engine is the one that
    checks it. ``parts``: one text, or a long whole text's sentences, one request each."""

    parts: tuple[Any, ...]
    voice: dict[str, Any]  # the request's fields but its text
    first: dict[str, Any] = field(default_factory=dict)  # fields of the first part only (chime)
    streamed: bool = False  # a sentence of a text stream (see ``WyomingHandler._abort``)


STOPPED = None  # a job: the text stream's last sentence is out, send synthesize-stopped
Job = Say | None


@dataclass
class TextStream:
    """A ``synthesize-start`` … ``synthesize-stop`` in progress."""

    voice: dict[str, str]
    splitter: SentenceSplitter
    chime: dict[str, Any] = field(default_factory=dict)  # the first sentence's
    ssml: bool = False  # one document, spoken whole at synthesize-stop (see ``take``)
    document: str = ""  # an SSML document so far, or the start of a text not yet told apart
    undecided: bool = True  # plain text could still turn out to be a <speak> document
    sentences: int = 0
    hold: asyncio.TimerHandle | None = None  # a held sentence end, spoken when it runs out

    def take(self, chunk: str) -> str:
        """Tell a ``<speak>`` document from plain text by its start, however it was chunked
        (Home Assistant 2026 streams every text and says nothing of its format): a document is
        kept whole for synthesize-stop, plain text goes on to the sentence splitter at once.
        Returns the plain text to split now."""
        if not self.undecided:
            self.document += chunk if self.ssml else ""
            return chunk
        self.document += chunk
        start = self.document.lstrip()
        if not start or (start.startswith("<") and ">" not in start):
            return ""  # nothing yet, or the first tag is not complete
        self.undecided = False
        self.ssml = is_ssml(self.document)
        if self.ssml:
            self.voice = self.voice | {"format": "ssml"}
            return ""
        chunk, self.document = self.document, ""
        return chunk


def whole_parts(text: Any, fields: dict[str, Any], max_chars: int) -> tuple[Any, ...]:
    """A whole ``synthesize`` text: itself, or, when it is plain text over
    ``limits.max_text_chars``, its sentences (no longer than that), each a request of one
    answer. Home Assistant 2025.4 and every client that does not stream send a long text this
    way; what one event carries (``limits.max_line_bytes``) bounds it (docs/wyoming.md)."""
    if not isinstance(text, str) or "format" in fields or is_ssml(text):
        return (text,)
    if len(text.strip()) <= max_chars:
        return (text,)
    splitter = SentenceSplitter(max_chars)
    return tuple(splitter.feed(text) + splitter.finish())
