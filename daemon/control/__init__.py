"""The daemon's face toward front-ends: build and prepare requests, play them or hand their audio
back, stop, cancel, status.

Every front-end goes through ``Control`` (never the engine or cache directly), so a JSON client,
an SSIP client, an MQTT publisher, a Wyoming or HTTP caller get the same validation, the same
voice-by-language rule, the same errors and the same audio for the same request. What a
request's fields may say, and how they become a prepared request, is ``fields.py``'s.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from speakd.cache.browse import Listing, browse
from speakd.cache.indexing import build_in_background
from speakd.control.fields import build, explain
from speakd.machine import priority
from speakd.markup.lexicon import Lexicon
from speakd.request.errors import InputWarning, RequestError
from speakd.request.messages import Event, EventType, SpeakRequest
from speakd.request.scheduler import Scheduler
from speakd.request.sounds import Sounds
from speakd.request.stream import AudioStream
from speakd.request.voices import VoiceLibrary

if TYPE_CHECKING:
    from speakd.cache.store import CacheStore, Clip
    from speakd.lifecycle.loopcare import LoopCare

log = logging.getLogger(__name__)

IDLE_CHECK_S = 1.0  # how often a job waiting for the engine to be idle looks at its halt flag


class Observer(Protocol):
    """Hears of every request played, streamed back or refused, whichever front-end made it
    (``speakd.control.metrics``); the outcome of a played one comes with the scheduler's events."""

    def said(self, request: SpeakRequest) -> None: ...

    def refused(self, origin: str, code: str) -> None: ...

    def pack_refused(self, reason: str) -> None: ...
    def warned(self, origin: str, code: str) -> None: ...

    def stream_waited(self, seconds: float) -> None: ...

    def stream_opened(self, request: SpeakRequest, stream: AudioStream) -> None: ...

    def stream_closed(
        self, request: SpeakRequest, stream: AudioStream | None, error: BaseException | None
    ) -> None: ...


@dataclass
class Control:
    scheduler: Scheduler
    max_text_chars: int
    max_streams: int = 4
    stream_wait_s: float = 30.0  # a stream past max_streams waits this long for its turn
    started: float = field(default_factory=time.monotonic)
    reloads: int = 0
    streaming: int = 0  # callers reading audio back right now
    counters: dict[str, int] = field(
        default_factory=lambda: {"streams": 0, "streams_waited": 0, "streams_refused": 0}
    )
    observer: Observer | None = None
    lexicon: Lexicon = field(default_factory=Lexicon)  # [lexicon] files; a reload replaces it
    mqtt_journal: Callable[[], dict[str, Any]] | None = None  # its status, when MQTT is on
    loop: LoopCare | None = None  # the loop-lag probe and idle collector, once READY
    _turns: collections.deque[asyncio.Future[None]] = field(default_factory=collections.deque)

    def build_request(self, fields: dict[str, Any], *, origin: str, **kw: Any) -> SpeakRequest:
        """Validate a request's fields and prepare it (``fields.build``); a refusal is counted. What
        it skips instead (``request.warnings``) is logged, counted and, before anything else,
        a ``warning`` event to its ``on_event``; front-ends without events read the list."""
        warnings: list[InputWarning] = []
        try:
            request = build(
                fields,
                library=self.library,
                lexicon=self.lexicon,
                sounds=self.sounds,
                max_text_chars=self.max_text_chars,
                origin=origin,
                warn=warnings.append,
                **kw,
            )
        except RequestError as e:
            self.refused(origin, e.code)
            raise
        request.warnings = tuple(dict.fromkeys(warnings))  # a clip named twice: one warning
        for warning in request.warnings:
            log.warning("request %s (%s): %s: %s", request.id, origin, *warning.to_dict().values())
            if self.observer is not None:
                self.observer.warned(origin, warning.code)
            if request.on_event is not None:
                request.on_event(Event(EventType.WARNING, request.id, warning.to_dict()))
        return request

    def refused(self, origin: str, code: str) -> None:
        """Tell the observer of a request turned away with error ``code``. Front-ends call this
        for what they refuse themselves before ``build_request`` (a line that is not JSON)."""
        if self.observer is not None:
            self.observer.refused(origin, code)

    def explain(self, request: SpeakRequest) -> dict[str, Any]:
        """What a prepared request will say, part by part (``fields.explain``)."""
        return explain(request)

    # ---- playing on the board ---------------------------------------------------------------

    def say(self, request: SpeakRequest, bounded: bool = True) -> None:
        """Not ``bounded``: past the queue limit (a say promised already: an MQTT say the
        journal holds, whose room ``queue_room`` checked before)."""
        if self.observer is not None:
            self.observer.said(request)
        self.scheduler.submit(request, bounded)

    def queue_room(self) -> int:
        """Places left in the queue."""
        return self.scheduler.room()

    def restore(self, request: SpeakRequest) -> None:
        """A request accepted before a restart: queued past every limit (Scheduler.restore)."""
        if self.observer is not None:
            self.observer.said(request)
        self.scheduler.restore(request)

    def knows(self, request_id: str) -> bool:
        """Is a request with this id queued or playing?"""
        return self.scheduler.knows(request_id)

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
        the last reader out cancels the synthesis. At most ``max_streams`` at once: one more
        waits its turn, in order of arrival, for up to ``stream_wait_s`` seconds, then is
        refused ("busy"). The ``observer`` hears how long each waited and how it went, refused,
        failed or read."""
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
        await self._take_turn(request)
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
            self._admit()

    async def _take_turn(self, request: SpeakRequest) -> None:
        """A place among the ``max_streams``: at once when one is free and nobody waits, else
        when an earlier stream ends (first come, first served), or ``busy`` after
        ``stream_wait_s``."""
        t0 = time.monotonic()
        if self.streaming < self.max_streams and not self._turns:
            self.streaming += 1
        else:
            turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._turns.append(turn)
            self.counters["streams_waited"] += 1
            log.info("request %s waits for an audio stream (%d ahead)", request.id, self.streaming)
            try:
                async with asyncio.timeout(self.stream_wait_s):
                    await turn
            except TimeoutError:
                if not _given(turn):
                    self.counters["streams_refused"] += 1
                    raise RequestError(
                        "busy",
                        f"{self.max_streams} audio streams ran for the {self.stream_wait_s:g} s "
                        "this one waited (limits.max_streams, limits.stream_wait_s)",
                    ) from None
            except BaseException:  # the caller left while waiting: a place given goes on
                if _given(turn):
                    self.streaming -= 1
                    self._admit()
                raise
            finally:
                with contextlib.suppress(ValueError):
                    self._turns.remove(turn)
        if self.observer is not None:
            self.observer.stream_waited(time.monotonic() - t0)

    def _admit(self) -> None:
        """Give the places free now to the streams waiting longest."""
        while self._turns and self.streaming < self.max_streams:
            turn = self._turns.popleft()
            if not turn.done():
                turn.set_result(None)
                self.streaming += 1

    # ---- what there is ----------------------------------------------------------------------

    @property
    def library(self) -> VoiceLibrary:
        """The voices requests choose from now (a reload may replace them)."""
        return self.scheduler.resolver.voices

    def voices(self) -> list[dict[str, Any]]:
        """Every voice: name, engine, languages, speakers, sample rate, precision, loaded,
        licence and the options its engine takes; the default voice first."""
        return self.library.listing()

    def default_voice(self) -> str:
        return self.library.default

    def set_default_voice(self, name: str) -> None:
        """Until the next reload or restart (``voices.default`` is the lasting one)."""
        library = self.library
        if name not in library.by_name:
            raise RequestError("unknown_voice", f"unknown voice {name!r} ({library.known()})")
        library.default = name

    def options(self) -> list[dict[str, Any]]:
        """The default voice's options, as clients send them in ``params`` (each voice in
        ``voices()`` lists its own)."""
        library = self.library
        return [o.describe() for o in library.by_name[library.default].model.options]

    def sample_rate(self, request: SpeakRequest) -> int:
        """The rate of the voice a prepared request speaks with (each voice has its own)."""
        library = self.library
        voice = library.by_bundle.get(request.prepared.bundle) if request.prepared else None
        return (voice or library.by_name[library.default]).model.sample_rate

    def bundles(self) -> set[str]:
        """The bundle ids of every voice: a prompt pack made for one of them plays here."""
        return set(self.library.by_bundle)

    def select_voice(self, voice: str | None, lang: str | None) -> tuple[str, str | None]:
        """(voice name, language) a request with these fields gets, or RequestError; for
        front-ends that check a voice before the text arrives (Wyoming's streaming)."""
        _, name, code = self.library.select(voice, lang)
        return name, code

    def listen(self, listener: Callable[[Event], None]) -> None:
        """Hear every played request's events, whoever made it (MQTT status, metrics)."""
        self.scheduler.listeners.append(listener)

    def unlisten(self, listener: Callable[[Event], None]) -> None:
        if listener in self.scheduler.listeners:
            self.scheduler.listeners.remove(listener)

    @property
    def sounds(self) -> Sounds:
        """The sounds requests name now (built-in chimes and the cache's pinned clips)."""
        return self.scheduler.resolver.sounds

    def chimes(self) -> list[str]:
        """The names a ``chime`` may take: the built-in chimes, then pinned clips' texts."""
        return self.sounds.names()

    async def wait_idle(self, halt: threading.Event) -> bool:
        """Until no synthesis is in flight (``Resolver.wait_idle``), for a background job that
        must not compete with requests someone waits for; False when ``halt`` was set first."""
        while not halt.is_set():
            if await asyncio.to_thread(self.scheduler.resolver.wait_idle, IDLE_CHECK_S):
                return not halt.is_set()
        return False

    async def index_cache(self, halt: threading.Event) -> None:
        """The cache's index for the totals and the page's listing, made in the background once
        no synthesis is in flight when it lacks it (``speakd.cache.indexing``)."""
        store = self.cache_store()
        if store is not None and await self.wait_idle(halt):
            build_in_background(store, halt)

    def cache_store(self) -> CacheStore | None:
        """The cache the daemon plays from now (a reload may replace it), None when it is off:
        where prompt packs arriving over MQTT are imported (mqtt/packs.py)."""
        return self.scheduler.resolver.store

    def resynthesis(self, key: str, *, origin: str) -> tuple[Clip, SpeakRequest]:
        """Clip ``key`` and the request that makes it anew with every parameter it was made with,
        whatever the cache holds (``Resolver.remade``), to read through ``stream``; blocking (it
        reads SQLite). Then ``resynthesized``."""
        old, prepared = self.scheduler.resolver.remade(key)
        config = prepared.asked or prepared.config
        request = SpeakRequest(
            old.text, config=config, origin=origin, prepared=prepared, fresh=True
        )
        return old, request

    def resynthesized(self, old: Clip, request: SpeakRequest) -> Clip:
        """The clip a ``resynthesis`` request stored, with ``old``'s pin; blocking."""
        assert request.prepared is not None
        return self.scheduler.resolver.replaced(old, request.prepared.key)

    def browse_cache(self, text: str, *, pinned_only: bool, limit: int) -> Listing | None:
        """The page's listing (``speakd.cache.browse``): beside the store, not behind its lock;
        blocking, None when there is no cache."""
        store = self.cache_store()
        return (
            None
            if store is None
            else browse(store, text=text, pinned_only=pinned_only, limit=limit)
        )

    def status(self) -> dict[str, Any]:
        state = self.scheduler.status()
        voices = self.library
        default = voices.by_name[voices.default].model
        return {
            **state,
            "engine": {
                "kind": default.kind,
                "bundle": default.bundle_id,
                "precision": default.precision,
                "sample_rate": default.sample_rate,
                "default_voice": voices.default,
                "nice": priority.status(self.scheduler.resolver.guard.nice),
            },
            "voices": voices.status(),
            "breaker": state["source"].get("breaker"),
            "streams": {
                "active": self.streaming,
                "waiting": len(self._turns),
                "max": self.max_streams,
                **self.counters,
            },
            "uptime_s": round(time.monotonic() - self.started, 1),
            "reloads": self.reloads,
            "chimes": self.chimes(),
            "lexicon": {  # what a reload read: the digest changes when an entry does
                lex.lang: {"file": lex.path, "digest": lex.digest[:16]}
                for lex in self.lexicon.languages
            },
            **({"mqtt_journal": self.mqtt_journal()} if self.mqtt_journal else {}),
            **({"loop": self.loop.status()} if self.loop else {}),
        }

    def idle(self) -> bool:
        """Nothing playing, queued, synthesizing or streaming: a pause now delays no audio."""
        state = self.scheduler.status()
        cache = state["source"].get("cache") or {}
        return state["state"] == "idle" and not self.streaming and not cache.get("inflight")


def _given(turn: asyncio.Future[None]) -> bool:
    """Whether a waiting stream's turn came (``Control._admit`` gave it a place)."""
    return turn.done() and not turn.cancelled()
