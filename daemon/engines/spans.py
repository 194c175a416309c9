"""Per-part timing of one synthesis: where its time goes inside the daemon.

An engine marks its parts (``with span("decoder"): ...``); the resolver records a synthesis
(``recording()``) around the loop that pulls its chunks, on the thread that pulls them, and tells
it each chunk (``Spans.chunk``) so the parts up to the first chunk are kept apart: a new line
waits for those. Outside a recording ``span`` costs one context-variable read, so the engines
mark their parts always; a recording costs two clock reads per part run (a few per window).

``bench floor`` times the same parts through the engine's sessions alone, so the two can be
compared on the same texts (docs/benchmarks.md, "New text"): the daemon's own share is what its
parts and its chunk path take beyond that.
"""

from __future__ import annotations

import contextvars
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

_current: contextvars.ContextVar[Spans | None] = contextvars.ContextVar(
    "speakd_spans", default=None
)


@dataclass
class Spans:
    """Seconds per part of one synthesis: in all, and up to its first chunk."""

    started: float = field(default_factory=time.perf_counter)
    parts: dict[str, float] = field(default_factory=dict)
    first: dict[str, float] | None = None  # the parts as they stood at the first chunk
    first_s: float | None = None  # start → first chunk
    total_s: float = 0.0  # start → the end of the recording

    def add(self, part: str, seconds: float) -> None:
        self.parts[part] = self.parts.get(part, 0.0) + seconds

    def chunk(self) -> None:
        """A chunk left the engine: the first one closes the first-chunk figures."""
        if self.first is None:
            self.first_s = time.perf_counter() - self.started
            self.first = dict(self.parts)

    def summary(self) -> str:
        """One log line's worth: ``first 33.1 ms (prior 18.0, flow 6.5, …); all 410.2 ms (…)``."""

        def ms(parts: dict[str, float]) -> str:
            return ", ".join(f"{k} {v * 1e3:.1f}" for k, v in parts.items())

        head = "no chunk" if self.first_s is None else f"first {self.first_s * 1e3:.1f} ms"
        whole = f"all {self.total_s * 1e3:.1f} ms ({ms(self.parts)})"
        return f"{head} ({ms(self.first or {})}); {whole}"


@contextmanager
def span(part: str) -> Iterator[None]:
    """Time the block as ``part`` of the synthesis being recorded (nothing when none is)."""
    spans = _current.get()
    if spans is None:
        yield
        return
    t0 = time.perf_counter()
    try:
        yield
    finally:
        spans.add(part, time.perf_counter() - t0)


@contextmanager
def recording() -> Iterator[Spans]:
    """Record the parts the engine marks in this block (on this thread and in this context)."""
    spans = Spans()
    token = _current.set(spans)
    try:
        yield spans
    finally:
        _current.reset(token)
        spans.total_s = time.perf_counter() - spans.started
