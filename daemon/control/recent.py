"""The last minutes' requests as the page draws them (``GET /v1/recent``): when each arrived,
from which front-end, whether it played on the board (say) or went back to its caller (stream),
from the cache or synthesized, and how long it took to its first audio. ``speakd.control.metrics``
feeds it from the same hooks that fill ``speakd_first_audio_seconds``; it keeps a bounded window
in memory, nothing on disk."""

from __future__ import annotations

import collections
import time
from dataclasses import asdict, dataclass
from typing import Any

from speakd.request.messages import SpeakRequest

WINDOW_S = 600.0  # what the page shows: the last ten minutes
MAX_KEPT = 1000  # and never more than this many
MAX_PENDING = 256  # said requests waiting for their first audio
TEXT_CHARS = 80  # the page shows the start of each text


@dataclass(frozen=True)
class Served:
    at: float  # wall clock when it arrived
    id: str
    frontend: str
    kind: str  # "say" (played on the board) | "stream" (audio handed back)
    source: str  # "cache" | "synthesis" | "" (a say: played as it came)
    first_audio_ms: float
    voice: str
    text: str


class Recent:
    def __init__(self, window_s: float = WINDOW_S) -> None:
        self.window_s = window_s
        self._served: collections.deque[Served] = collections.deque(maxlen=MAX_KEPT)
        self._pending: dict[str, SpeakRequest] = {}  # said, not sounding yet

    def said(self, request: SpeakRequest) -> None:
        if len(self._pending) >= MAX_PENDING:  # never started (refused late, cancelled)
            self._pending.pop(next(iter(self._pending)))
        self._pending[request.id] = request

    def started(self, request_id: str, frontend: str, latency_ms: float) -> None:
        request = self._pending.pop(request_id, None)
        if request is not None:
            self.add(request, frontend, "say", "", latency_ms)

    def ended(self, request_id: str) -> None:
        self._pending.pop(request_id, None)

    def add(
        self, request: SpeakRequest, frontend: str, kind: str, source: str, latency_ms: float
    ) -> None:
        arrived = time.time() - (time.monotonic() - request.received)
        self._served.append(
            Served(
                at=round(arrived, 3),
                id=request.id,
                frontend=frontend,
                kind=kind,
                source=source,
                first_audio_ms=round(latency_ms, 1),
                voice=request.config.voice or "",
                text=request.text[:TEXT_CHARS],
            )
        )

    def listing(self, now: float | None = None) -> dict[str, Any]:
        now = time.time() if now is None else now
        while self._served and self._served[0].at < now - self.window_s:
            self._served.popleft()
        return {
            "window_s": self.window_s,
            "now": now,
            "requests": [asdict(s) for s in self._served],
        }
