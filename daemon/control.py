"""The daemon's face toward front-ends: build and prepare requests, play them or hand their audio
back, stop, cancel, status.

Every front-end goes through ``Control`` (never the engine or cache directly), so a JSON client,
an SSIP client, an MQTT publisher, a Wyoming or HTTP caller get the same validation, the same
voice-by-language rule, the same errors and the same audio for the same request.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from speakd.engines.base import Engine, SynthesisConfig
from speakd.messages import EventCallback, Priority, RequestError, SpeakRequest, validate_text
from speakd.prepare import prepare
from speakd.scheduler import Scheduler
from speakd.stream import AudioStream

if TYPE_CHECKING:
    from speakd.cache.store import CacheStore

log = logging.getLogger(__name__)

MAX_ID_CHARS = 128


class Observer(Protocol):
    """Hears of every request played or streamed back, whichever front-end made it
    (``speakd.metrics``); the outcome of a played one comes with the scheduler's events."""

    def said(self, request: SpeakRequest) -> None: ...

    def stream_opened(self, request: SpeakRequest, stream: AudioStream) -> None: ...

    def stream_closed(
        self, request: SpeakRequest, stream: AudioStream | None, error: BaseException | None
    ) -> None: ...


@dataclass
class Control:
    scheduler: Scheduler
    engine: Engine
    max_text_chars: int
    max_streams: int = 4
    started: float = field(default_factory=time.monotonic)
    reloads: int = 0
    streaming: int = 0  # callers reading audio back right now
    counters: dict[str, int] = field(default_factory=lambda: {"streams": 0, "streams_refused": 0})
    observer: Observer | None = None

    def build_request(
        self,
        fields: dict[str, Any],
        *,
        origin: str,
        client: str = "",
        on_event: EventCallback | None = None,
        strict_lang: bool = True,
    ) -> SpeakRequest:
        """Validate a request's fields (every front-end maps onto these names) and prepare it:
        ``text``, ``id``, ``voice``, ``lang``, ``priority``, ``speed``, ``volume``, ``seed``,
        ``params`` (the engine's options), ``cache_only``."""
        text = validate_text(fields.get("text"), self.max_text_chars)
        voice, lang = _string(fields, "voice"), _string(fields, "lang")
        speed = _number(fields, "speed", 0.25, 4.0)
        volume = _number(fields, "volume", 0.0, 4.0)
        seed = fields.get("seed")
        if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool) or seed < 0):
            raise RequestError("bad_field", "seed must be a non-negative integer")
        config = SynthesisConfig(
            voice=voice, speed=speed, seed=seed, lang=lang, extra=fields.get("params") or {}
        )
        prepared = prepare(self.engine, text, config, strict_lang=strict_lang)
        request = SpeakRequest(
            text=text,
            priority=Priority.parse(fields.get("priority")),
            config=config,
            volume=1.0 if volume is None else volume,
            origin=origin,
            client=client,
            on_event=on_event,
            cache_only=bool(fields.get("cache_only", False)),
            prepared=prepared,
        )
        request_id = fields.get("id")
        if request_id is not None:
            request.id = _request_id(request_id)
        return request

    # ---- playing on the board ---------------------------------------------------------------

    def say(self, request: SpeakRequest) -> None:
        if self.observer is not None:
            self.observer.said(request)
        self.scheduler.submit(request)

    def stop(self) -> int:
        return self.scheduler.stop()

    def cancel(self, request_id: str | None = None, client: str | None = None) -> int:
        return self.scheduler.cancel(request_id, client)

    def pause(self, client: str | None = None) -> None:
        self.scheduler.pause(client)

    def resume(self, client: str | None = None) -> bool:
        return self.scheduler.resume(client)

    # ---- handing the audio back -------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def stream(self, request: SpeakRequest) -> AsyncIterator[AudioStream]:
        """The request's audio for a caller that wants it back, not played on the board: from the
        cache on a hit, else a synthesis shared with any playback of the same key. Read it with
        ``async for chunk in stream.aread()``; leaving the block (a caller gone) releases it, and
        the last reader out cancels the synthesis. At most ``max_streams`` at once ("busy").
        The ``observer`` hears how each stream went, refused, failed or read."""
        opened: AudioStream | None = None
        error: BaseException | None = None
        try:
            async with self._stream(request) as opened:
                if self.observer is not None:
                    self.observer.stream_opened(request, opened)
                yield opened
        except BaseException as e:  # the caller's too (gone, cancelled): the observer counts it
            error = e
            raise
        finally:
            if self.observer is not None:
                self.observer.stream_closed(request, opened, error)

    @contextlib.asynccontextmanager
    async def _stream(self, request: SpeakRequest) -> AsyncIterator[AudioStream]:
        if self.streaming >= self.max_streams:
            self.counters["streams_refused"] += 1
            raise RequestError(
                "busy", f"{self.max_streams} audio streams are running (limits.max_streams)"
            )
        self.streaming += 1
        self.counters["streams"] += 1
        try:
            resolver = self.scheduler.resolver
            opened = await asyncio.to_thread(resolver.open, request)  # may read SQLite
            log.info(
                "request %s streams back (%s, origin %s)",
                request.id,
                "cached" if opened.from_cache else "synthesis",
                request.origin,
            )
            try:
                yield opened
            finally:
                opened.release()
        finally:
            self.streaming -= 1

    # ---- what there is ----------------------------------------------------------------------

    def voices(self) -> list[dict[str, Any]]:
        return [
            {
                "name": v.name,
                "language": v.language,
                "languages": list(v.languages),
                "description": v.description,
            }
            for v in self.engine.voices()
        ]

    def options(self) -> list[dict[str, Any]]:
        """The engine's declared options, as clients send them in ``params``."""
        return [o.describe() for o in self.engine.options]

    def cache_store(self) -> CacheStore | None:
        """The cache the daemon plays from now (a reload may replace it), None when it is off:
        where prompt packs arriving over MQTT are imported (frontends/mqtt_packs.py)."""
        return self.scheduler.resolver.store

    def status(self) -> dict[str, Any]:
        state = self.scheduler.status()
        return {
            **state,
            "engine": {
                "kind": self.engine.kind,
                "bundle": self.engine.bundle_id,
                "precision": self.engine.precision,
                "sample_rate": self.engine.sample_rate,
                "default_voice": self.engine.default_voice(),
            },
            "breaker": state["source"].get("breaker"),
            "streams": {"active": self.streaming, "max": self.max_streams, **self.counters},
            "uptime_s": round(time.monotonic() - self.started, 1),
            "reloads": self.reloads,
        }


def _request_id(value: Any) -> str:
    if not isinstance(value, str | int) or isinstance(value, bool):
        raise RequestError("bad_field", "id must be a string")
    value = str(value)
    if not 0 < len(value) <= MAX_ID_CHARS or not value.isprintable():
        raise RequestError("bad_field", f"id must be 1..{MAX_ID_CHARS} printable characters")
    return value


def _string(fields: dict[str, Any], key: str) -> str | None:
    value = fields.get(key)
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise RequestError("bad_field", f"{key} must be a string")
    return value


def _number(fields: dict[str, Any], key: str, lo: float, hi: float) -> Any:
    value = fields.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise RequestError("bad_field", f"{key} must be a number")
    if isinstance(value, float) and not math.isfinite(value):  # (a huge int overflows isfinite)
        raise RequestError("bad_field", f"{key} must be a finite number")
    if not lo <= value <= hi:
        raise RequestError("bad_field", f"{key} must be within {lo}..{hi}, got {value}")
    return value
