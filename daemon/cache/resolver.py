"""The cache in front of the engine: an ``AudioSource`` the scheduler plays from.

- hit: pinned clips come from RAM (prewarmed at start within ``prewarm_bytes``), others from
  SQLite; no synthesis, the clip is one chunk.
- miss: the engine runs in a *flight* thread that appends chunks to a shared buffer; the
  requester streams them as they come and the clip is stored once the engine has finished — never
  when it was cancelled or failed.
- single-flight: a second request for a key being synthesised joins the flight and streams the
  same chunks from the start of the buffer as they are produced. Joining (instead of waiting for
  the store and replaying from SQLite) gives the follower the leader's first-audio latency and
  costs nothing extra. A flight is cancelled only when its last listener leaves.
- stale-while-revalidate (optional): an expired unpinned clip is played at once and re-synthesised
  in the background.

Engine calls are serialised by one lock, so a cancelled flight that is still finishing its current
step never runs side by side with the next request's synthesis — unless the engine batches
(``concurrent_synthesis``, ChatTTS with ``batch_size`` > 1): then misses for different keys run
their flights at once and share decode steps, each cancellable alone (single-flight per key stays).
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import sqlite3
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from speakd.audio import AudioChunk, join_chunks
from speakd.cache.store import CacheError, CacheStore, Clip
from speakd.config import CacheConfig
from speakd.engines.base import Engine, EngineError
from speakd.messages import SpeakRequest
from speakd.source import with_default_seed

log = logging.getLogger(__name__)


class NotCachedError(EngineError):
    """A ``cache_only`` request whose clip is not in the cache (error code ``not_cached``)."""

    code = "not_cached"


@dataclass(eq=False)
class _Flight:
    key: str
    request: SpeakRequest
    detached: bool = False  # a background refresh: nobody listens, run to the end
    subscribers: int = 0
    chunks: list[AudioChunk] = field(default_factory=list)
    done: bool = False
    error: BaseException | None = None
    cancel: threading.Event = field(default_factory=threading.Event)
    cond: threading.Condition = field(default_factory=threading.Condition)
    thread: threading.Thread | None = None


class CachingSource:
    def __init__(
        self,
        engine: Engine,
        store: CacheStore,
        *,
        prewarm_bytes: int = 0,
        stale_while_revalidate: bool = False,
    ) -> None:
        self.engine = engine
        self.store = store
        self.stale_while_revalidate = stale_while_revalidate
        self.counters = {
            "hits": 0,
            "hits_ram": 0,
            "misses": 0,
            "synth": 0,  # engine syntheses started (flights)
            "shared": 0,  # misses that joined a flight already running
            "stored": 0,
            "not_stored": 0,  # flights cancelled or failed
            "stale_served": 0,
            "not_cached": 0,
            "errors": 0,
        }
        self._lock = threading.Lock()
        self._engine_lock = threading.Lock()
        self._inflight: dict[str, _Flight] = {}
        self._closed = False
        self._ram: dict[str, Clip] = {}
        self._prewarm(prewarm_bytes)
        self._store_stats: dict[str, Any] = {}
        self._refresh_stats()

    def _refresh_stats(self) -> None:
        """Snapshot the store's aggregate stats on a worker thread (at open and after each
        store), so ``status()`` — called on the event loop — never waits on SQLite."""
        try:
            stats = self.store.stats()
        except (CacheError, sqlite3.Error) as e:
            stats = {"error": str(e)}
        with self._lock:
            self._store_stats = stats

    @classmethod
    def from_config(cls, engine: Engine, config: CacheConfig) -> CachingSource:
        store = CacheStore(
            config.path,
            max_bytes=config.max_bytes,
            ttl_s=config.ttl_s,
            ttl_jitter=config.ttl_jitter,
        )
        return cls(
            engine,
            store,
            prewarm_bytes=config.prewarm_bytes,
            stale_while_revalidate=config.stale_while_revalidate,
        )

    def _prewarm(self, budget: int) -> None:
        t0, used, skipped = time.monotonic(), 0, 0
        for key, size in self.store.prewarm_order(self.engine.bundle_id):
            if used + size > budget:
                skipped += 1
                continue
            clip = self.store.get(key)
            if clip is not None:
                self._ram[key] = clip
                used += size
        self._ram_bytes = used
        foreign = {
            b: n for b, n in self.store.pinned_by_bundle().items() if b != self.engine.bundle_id
        }
        if foreign:
            log.warning(
                "cache %s: %d pinned clips were made with other bundles (%s) and cannot play "
                "with %s; rebuild those packs with this model (precompute --bundle)",
                self.store.path,
                sum(foreign.values()),
                ", ".join(sorted(foreign)),
                self.engine.bundle_id,
            )
        log.info(
            "cache %s: %d pinned clips (%d bytes) prewarmed into RAM in %.0f ms%s",
            self.store.path,
            len(self._ram),
            used,
            (time.monotonic() - t0) * 1000,
            f"; {skipped} left on disk (cache.prewarm_bytes = {budget})" if skipped else "",
        )

    # ---- AudioSource ------------------------------------------------------------------------

    def stream(self, request: SpeakRequest, cancel: threading.Event) -> Iterator[AudioChunk]:
        key, request = with_default_seed(self.engine, request)
        clip = self._lookup(key)
        if clip is not None:
            stale = clip.expired(time.time())
            if not stale or self.stale_while_revalidate:
                if stale:
                    self._count("stale_served")
                    self._refresh(key, request)
                yield from self._play(clip)
                return
        self._count("misses")
        if request.cache_only:
            self._count("not_cached")
            raise NotCachedError(f"{request.text[:60]!r} is not in the cache (cache_only)")
        yield from self._follow(self._join(key, request), cancel)

    def status(self) -> dict[str, Any]:
        with self._lock:
            info: dict[str, Any] = {
                "enabled": True,
                **self.counters,
                "prewarmed": len(self._ram),
                "prewarmed_bytes": self._ram_bytes,
                "inflight": len(self._inflight),
                "stale_while_revalidate": self.stale_while_revalidate,
                **self._store_stats,
            }
        info["recovered"] = info.get("recovered_from") is not None
        return {"cache": info}

    def close(self) -> None:
        """Stop background refreshes; the file closes once the last running flight has stored."""
        with self._lock:
            self._closed = True
            for flight in self._inflight.values():
                if flight.detached:
                    flight.cancel.set()
            idle = not self._inflight
        if idle:
            self.store.close()

    # ---- hits -------------------------------------------------------------------------------

    def _lookup(self, key: str) -> Clip | None:
        clip = self._ram.get(key)
        if clip is not None:
            self._count("hits_ram")
            return clip
        try:
            return self.store.get(key)
        except (CacheError, sqlite3.Error) as e:
            self._count("errors")
            log.warning("cache lookup failed, treating it as a miss: %s", e)
            return None

    def _play(self, clip: Clip) -> Iterator[AudioChunk]:
        self._count("hits")
        yield clip.chunk()
        # closed by a reload meanwhile: the hit counter is all that is lost
        with contextlib.suppress(CacheError, sqlite3.Error):
            self.store.touch(clip.key)

    # ---- misses -----------------------------------------------------------------------------

    def _join(self, key: str, request: SpeakRequest) -> _Flight:
        with self._lock:
            flight = self._inflight.get(key)
            if flight is not None and not flight.cancel.is_set():
                flight.subscribers += 1
                self.counters["shared"] += 1
                return flight
            flight = self._start(key, request, detached=False)
            flight.subscribers = 1
            return flight

    def _refresh(self, key: str, request: SpeakRequest) -> None:
        with self._lock:
            if key not in self._inflight and not self._closed:
                self._start(key, request, detached=True)

    def _start(self, key: str, request: SpeakRequest, *, detached: bool) -> _Flight:
        """Call with self._lock held."""
        flight = _Flight(key, request, detached=detached)
        flight.thread = threading.Thread(  # in the caller's context: logs name its request
            target=contextvars.copy_context().run,
            args=(self._synthesize, flight),
            name=f"speakd-cache-{key[:8]}",
            daemon=True,
        )
        self._inflight[key] = flight
        self.counters["synth"] += 1
        flight.thread.start()
        return flight

    def _follow(self, flight: _Flight, cancel: threading.Event) -> Iterator[AudioChunk]:
        i = 0
        try:
            while not cancel.is_set():
                with flight.cond:
                    while i >= len(flight.chunks) and not flight.done and not cancel.is_set():
                        flight.cond.wait(0.05)
                    if i < len(flight.chunks):
                        chunk = flight.chunks[i]
                        i += 1
                    elif flight.error is not None:
                        raise flight.error
                    elif flight.done and flight.cancel.is_set():
                        raise EngineError("synthesis was cancelled (cache closing)")
                    else:
                        return
                if not cancel.is_set():
                    yield chunk
        finally:
            self._leave(flight)

    def _leave(self, flight: _Flight) -> None:
        with self._lock:
            flight.subscribers -= 1
            if flight.subscribers == 0 and not flight.done and not flight.detached:
                flight.cancel.set()

    def _synthesize(self, flight: _Flight) -> None:
        request = flight.request
        lock = (
            contextlib.nullcontext()
            if getattr(self.engine, "concurrent_synthesis", False)
            else self._engine_lock
        )
        try:
            with lock:
                if not flight.cancel.is_set():
                    for chunk in self.engine.synthesize(
                        request.text, request.config, flight.cancel
                    ):
                        with flight.cond:
                            flight.chunks.append(chunk)
                            flight.cond.notify_all()
                        if flight.cancel.is_set():
                            break
        except Exception as e:
            flight.error = e
        with flight.cond:
            flight.done = True
            flight.cond.notify_all()
        if flight.error is None and not flight.cancel.is_set() and flight.chunks:
            self._store(flight)
        else:
            self._count("not_stored")
            log.debug(
                "clip %s not stored (%s)",
                flight.key[:12],
                "failed" if flight.error else "cancelled",
            )
        with self._lock:
            if self._inflight.get(flight.key) is flight:
                del self._inflight[flight.key]
            close_now = self._closed and not self._inflight
        if close_now:
            self.store.close()

    def _store(self, flight: _Flight) -> None:
        request = flight.request
        try:
            audio = join_chunks(flight.chunks)
            assert audio is not None
            params = {**self.engine.audio_params(request.config), "seed": request.config.seed}
            clip = Clip(
                key=flight.key,
                text=request.text,
                voice=request.config.voice or self.engine.default_voice(),
                params=params,
                bundle=self.engine.bundle_id,
                sample_rate=audio.sample_rate,
                audio=audio.pcm,
            )
            evicted = self.store.put(clip)
        except (CacheError, sqlite3.Error, ValueError, OSError) as e:
            self._count("errors")
            log.warning("clip %s not stored: %s", flight.key[:12], e)
            return
        self._count("stored")
        self._refresh_stats()
        log.debug(
            "stored clip %s (%.2f s)%s",
            flight.key[:12],
            clip.duration,
            f", evicted {len(evicted)}" if evicted else "",
        )

    def _count(self, name: str) -> None:
        with self._lock:
            self.counters[name] += 1
