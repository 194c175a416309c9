"""Resolves a request to its audio stream: the cache when it has the clip, else one synthesis.

- hit: pinned clips come from RAM (prewarmed at start within ``prewarm_bytes``), others from
  SQLite, then from the shipped pack (``speakd.cache.shipped``, read-only: key echo for a fresh
  cache), as ``speakd.cache.hits`` finds them; the stream is whole at once (one chunk), nothing
  runs.
- miss: the engine runs on a *flight* thread that fills an ``AudioStream``; its readers follow
  it as chunks come, and the clip is stored once the engine has finished — never when it was
  cancelled or failed. Without a cache store every request is a miss and nothing is stored.
- single-flight: a request for a key that is being synthesised joins that stream, whoever reads
  it (a playback, a Wyoming or HTTP caller, a socket ``synth``): one synthesis, every reader from
  the first chunk. The synthesis is cancelled only when its last reader leaves.
- stale-while-revalidate (optional): an expired unpinned clip is served at once and
  re-synthesised in the background.
- the engine's health (``Guard``): an open breaker refuses at once; a hang, a crash or a crawl
  counts against it.

The audio comes from the voice the request chose (``speakd.request.voices``), loaded by its first
flight when it is not. A voice's engine calls are serialised by its lock, so a cancelled flight that
is still finishing its current step never runs side by side with the next request's synthesis —
unless the engine batches (``concurrent_synthesis``, ChatTTS with ``batch_size`` > 1): then misses
for different keys run their flights at once and share decode steps, each cancellable alone.
"""

from __future__ import annotations

import contextvars
import functools
import logging
import sqlite3
import threading
import time
from collections.abc import Iterator
from typing import Any

from speakd.audio import AudioChunk, join_chunks, scale_volume
from speakd.audio.pitch import by_resampling, shifted
from speakd.cache.hits import Hits
from speakd.cache.shipped import ShippedPack
from speakd.cache.store import CacheError, CacheStore, Clip
from speakd.config import CacheConfig
from speakd.engines.base import Engine, EngineError, SynthesisConfig
from speakd.engines.spans import Spans, recording
from speakd.machine.priority import lower_this_thread
from speakd.request.breaker import CircuitBreaker, Guard
from speakd.request.compose import compose
from speakd.request.errors import RequestError
from speakd.request.loudness import VOICES as LOUDNESS
from speakd.request.messages import SpeakRequest
from speakd.request.prepare import Prepared
from speakd.request.sounds import Sounds
from speakd.request.stream import AudioStream
from speakd.request.voices import VoiceLibrary
from speakd.request.workers import WORKERS

log = logging.getLogger(__name__)


class NotCachedError(EngineError):
    """A ``cache_only`` request whose clip is not in the cache (error code ``not_cached``)."""

    code = "not_cached"


class Resolver:
    def __init__(
        self,
        voices: VoiceLibrary | Engine,
        store: CacheStore | None = None,
        *,
        guard: Guard | None = None,
        prewarm_bytes: int = 0,
        stale_while_revalidate: bool = False,
        shipped: ShippedPack | None = None,
        unavailable: str = "",
    ) -> None:
        self.voices = voices if isinstance(voices, VoiceLibrary) else VoiceLibrary.of(voices)
        self.store = store
        self.shipped = shipped
        # Why the configured cache could not be opened ("" when it was, or is off): status
        # ``cache.unavailable``, the metric speakd_cache_unavailable and `speakd doctor` show it.
        self.unavailable = unavailable
        self.guard = guard or Guard(CircuitBreaker())
        self.stale_while_revalidate = stale_while_revalidate
        self.counters = {
            "hits": 0,
            "hits_ram": 0,
            "hits_shipped": 0,
            "misses": 0,
            "synth": 0,  # engine syntheses started (flights)
            "shared": 0,  # requests that joined a flight already running
            "stored": 0,
            "not_stored": 0,  # flights cancelled or failed
            "stale_served": 0,
            "not_cached": 0,
            "errors": 0,
        }
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)  # a flight ended or was cancelled
        self._inflight: dict[str, AudioStream] = {}
        self._finishing: set[AudioStream] = set()  # flights past their engine, not cancelled
        self._closed = False
        self.hits = Hits(
            store,
            shipped,
            self._count,
            bundles=self.voices.by_bundle,
            prewarm_bytes=prewarm_bytes,
        )
        self.sounds = Sounds(store, self.voices.loudness)  # chimes and pinned clips by name

    @classmethod
    def from_config(
        cls,
        voices: VoiceLibrary,
        config: CacheConfig,
        guard: Guard | None = None,
        current: CacheStore | None = None,
    ) -> Resolver:
        """The cache in front of the voices when configured (and openable), else the voices.

        ``current`` (on a reload: the running resolver's store) is kept, with the new limits, when
        it is open on the configured file. A second connection would cost the old one's
        descriptor: SQLite does not close a file while another connection of the process holds a
        lock on it (a WAL connection always does), so the closed one's stays open until the
        next one closes."""
        if not config.enabled:
            return cls(voices, guard=guard)
        shipped = ShippedPack.open(config.shipped_pack)
        if current is not None and current.is_open_on(config.path):
            store = current
            store.max_bytes, store.ttl_s = config.max_bytes, config.ttl_s
            store.ttl_jitter = config.ttl_jitter
        else:
            try:
                store = CacheStore(
                    config.path,
                    max_bytes=config.max_bytes,
                    ttl_s=config.ttl_s,
                    ttl_jitter=config.ttl_jitter,
                )
            except CacheError as e:  # never fatal: the shipped pack and the voices serve
                log.warning("audio cache disabled, requests are synthesized: %s", e)
                return cls(voices, guard=guard, shipped=shipped, unavailable=str(e))
        return cls(
            voices,
            store,
            guard=guard,
            prewarm_bytes=config.prewarm_bytes,
            stale_while_revalidate=config.stale_while_revalidate,
            shipped=shipped,
        )

    # ---- the request path -------------------------------------------------------------------

    def prepare(self, request: SpeakRequest) -> Prepared:
        """The request as prepared by its front-end, or anew when its voice is gone since (a
        reload replaced the model)."""
        prepared = request.prepared
        if prepared is None or (
            not prepared.parts and prepared.bundle not in self.voices.by_bundle
        ):
            prepared = self.voices.prepare(request.text, request.config)
        return prepared

    def open(self, request: SpeakRequest) -> AudioStream:
        """The request's audio stream with one reader attached: the caller reads it and then
        calls ``release`` (``stream`` does both). Raises NotCachedError for a ``cache_only``
        miss and RequestError for a request the engine cannot take."""
        prepared = self.prepare(request)
        if prepared.parts:
            return self._compose(prepared, request.cache_only)
        return self._open(prepared, request.cache_only, request.fresh)

    def _open(self, prepared: Prepared, cache_only: bool, fresh: bool = False) -> AudioStream:
        clip, shipped = (None, False) if fresh else self.hits.find(prepared.key)
        if clip is not None:
            stale = clip.expired(time.time())
            if not stale or self.stale_while_revalidate:
                if stale:
                    self._count("stale_served")
                    self._refresh(prepared)
                self._count("hits")
                if not shipped:  # nothing is counted in the shipped pack
                    self.hits.touch(clip.key)
                return AudioStream.complete(clip.key, clip.chunk(), shipped=shipped).attach()
        self._count("misses")
        if cache_only:
            self._count("not_cached")
            raise NotCachedError(f"{prepared.text[:60]!r} is not in the cache (cache_only)")
        return self._join(prepared)

    def _compose(self, prepared: Prepared, cache_only: bool) -> AudioStream:
        """Marked-up text: its parts' streams, each a hit or a shared synthesis as above, composed
        on a thread of its own into one stream (``speakd.request.compose``) at its first voice's
        rate."""
        voice = (
            self.voices.by_bundle.get(prepared.bundle) or self.voices.by_name[self.voices.default]
        )
        stream = AudioStream(prepared.key).attach()
        thread = threading.Thread(  # in the caller's context: logs name its request
            target=contextvars.copy_context().run,
            args=(
                compose,
                stream,
                prepared.parts,
                voice.model.sample_rate,
                lambda part: self._open(part, cache_only),
                lambda sound: self.sounds.audio(sound, self._lookup),
            ),
            name=f"speakd-compose-{prepared.key[:8]}",
            daemon=True,
        )
        thread.start()
        return stream

    def remade(self, key: str) -> tuple[Clip, Prepared]:
        """The page's re-synthesize: clip ``key`` and what it was made from (text, voice, speaker,
        speed, pitch, the engine's options, seed) prepared again, for a ``fresh`` request (a new
        key only if its voice changed since). RequestError ``not_found`` for no such clip,
        ``bad_request`` for one stored without its request."""
        old = None if self.store is None else self.store.get(key)
        if old is None:
            raise RequestError("not_found", "no clip with that key (evicted or dropped)")
        if old.request is None:
            raise RequestError(
                "bad_request",
                f"clip {key[:12]} was stored without what it was made from (a prompt pack or an "
                "older speakd): drop it, and the next request for it makes it anew",
            )
        return old, self.voices.prepare(old.text, SynthesisConfig(**old.request))

    def replaced(self, old: Clip, key: str) -> Clip:
        """After a re-synthesis of ``old`` stored clip ``key``: that clip, pinned if ``old`` was
        (the same key kept its pin, ``CacheStore.put``; a new key takes it, and only then does
        the old clip go)."""
        new = None if self.store is None else self.store.get(key)
        if new is None:
            raise RequestError(  # the cache failed meanwhile: logged and counted by _store
                "synthesis_failed", f"clip {key[:12]} was made but not stored"
            )
        assert self.store is not None
        if new.key != old.key:
            if old.pinned:
                new.pinned = self.store.pin(new.key)
            self.store.delete(old.key)
        return new

    def stream(self, request: SpeakRequest, cancel: threading.Event) -> Iterator[AudioChunk]:
        """Open, read to the end (or ``cancel``), release: for callers that read in one go."""
        stream = self.open(request)
        try:
            yield from stream.read(cancel)
        finally:
            stream.release()

    def status(self) -> dict[str, Any]:
        breaker = self.guard.breaker.status()
        shipped = None
        if self.shipped is not None:
            with self._lock:
                hits = self.counters["hits_shipped"]
            shipped = {
                **self.shipped.status(),
                "for_these_voices": bool(set(self.shipped.bundles) & set(self.voices.by_bundle)),
                "hits": hits,
            }
        if self.store is None:
            off = {"enabled": False, "unavailable": self.unavailable} if self.unavailable else None
            return {"cache": off, "shipped": shipped, "breaker": breaker}
        with self._lock:
            info: dict[str, Any] = {
                "enabled": True,
                **self.counters,
                "prewarmed": len(self.hits.ram),
                "prewarmed_bytes": self.hits.ram_bytes,
                "inflight": len(self._inflight),
                "stale_while_revalidate": self.stale_while_revalidate,
                **self.hits.store_stats,
            }
        info["recovered"] = info.get("recovered_from") is not None
        return {"cache": info, "shipped": shipped, "breaker": breaker}

    def close(self, successor: Resolver | None = None) -> None:
        """Stop background refreshes, and close the file once no flight can store into it any
        more: each has ended, or was cancelled before it finished (its readers left, or gave up
        on a hung engine, whose flight may never return). A ``successor`` (a reload) that plays
        from the same store keeps it open."""
        with self._lock:
            self._closed = True
            detached = [stream for stream in self._inflight.values() if stream.detached]
        for stream in detached:  # outside the lock: a cancel wakes the closer, which takes it
            stream.cancel.set()
        self.hits.close()  # and the shipped pack: a successor opened its own
        if self.store is None or (successor is not None and successor.store is self.store):
            return
        with self._lock:
            quiet = self._quiet()
        if quiet:
            self.store.close()
        else:
            closer = threading.Thread(
                target=self._close_when_quiet, name="speakd-cache-close", daemon=True
            )
            closer.start()

    def _quiet(self) -> bool:
        """No flight will store (call with self._lock held): a flight cancelled before its engine
        was done never does."""
        return not self._finishing and all(s.cancel.is_set() for s in self._inflight.values())

    def _close_when_quiet(self) -> None:
        assert self.store is not None
        with self._lock:
            while not self._quiet():
                self._changed.wait()
        self.store.close()

    def _cancelled(self) -> None:
        with self._lock:
            self._changed.notify_all()

    # ---- hits -------------------------------------------------------------------------------

    def _lookup(self, key: str) -> Clip | None:
        return self.hits.find(key)[0]

    def wait_idle(self, timeout: float) -> bool:
        """Wait until no synthesis is in flight: a background job (the key-echo prewarm) starts
        its next one only then, so it never competes with a request someone is waiting for.
        True when idle, False after ``timeout`` seconds."""
        with self._lock:
            return self._changed.wait_for(lambda: not self._inflight, timeout)

    # ---- misses -----------------------------------------------------------------------------

    def _join(self, prepared: Prepared) -> AudioStream:
        with self._lock:
            stream = self._inflight.get(prepared.key)
            if stream is not None and not stream.cancel.is_set() and not stream.done:
                self.counters["shared"] += 1
                return stream.attach()
            return self._start(prepared, detached=False).attach()

    def _refresh(self, prepared: Prepared) -> None:
        with self._lock:
            if prepared.key not in self._inflight and not self._closed:
                self._start(prepared, detached=True)

    def _start(self, prepared: Prepared, *, detached: bool) -> AudioStream:
        """Call with self._lock held."""
        stream = AudioStream(
            prepared.key,
            hang_timeout_s=self.guard.hang_timeout_s,
            detached=detached,
            on_hang=self._hung,
        )
        self._inflight[prepared.key] = stream
        stream.cancel.add_hook(self._cancelled)
        self.counters["synth"] += 1
        context = contextvars.copy_context()  # the caller's: logs name its request
        WORKERS.start(functools.partial(context.run, self._synthesize, stream, prepared))
        return stream

    def _hung(self, stream: AudioStream) -> None:
        self.guard.breaker.record_failure(str(stream.error))

    def _synthesize(self, stream: AudioStream, prepared: Prepared) -> None:
        error: BaseException | None = None
        admitted, t0 = False, 0.0
        parts: Spans | None = None
        lower_this_thread(self.guard.nice)  # it joins the engine's onnxruntime pools
        try:
            with self.voices.using(prepared.bundle, stream.loaded_voice) as engine:
                target = prepared.params.get("loudness", {}).get("lufs")
                gain = 1.0 if target is None else LOUDNESS.gain(engine, target)
                if not stream.cancel.is_set():
                    self.guard.admit()
                    admitted, t0 = True, time.monotonic()
                    stream.begin()
                    with recording() as parts:  # the engine's parts (speakd.engines.spans)
                        chunks = engine.synthesize(prepared.text, prepared.config, stream.cancel)
                        pitch = prepared.params.get("pitch")
                        if not by_resampling(engine, pitch):  # else the engine made it
                            chunks = shifted(chunks, pitch)
                        for chunk in chunks:
                            parts.chunk()
                            stream.put(scale_volume(chunk, gain))  # normalised before it is stored
                            if stream.cancel.is_set():
                                break
        except Exception as e:
            error = e
        with self._lock:  # decided under the lock: a closing resolver waits for what stores
            cancelled = stream.cancel.is_set()
            if not cancelled:
                self._finishing.add(stream)
        if admitted and not stream.done:  # judged before readers hear the end; a hang already was
            self.guard.judge(error, cancelled, time.monotonic() - t0, stream.duration, parts)
        # Stored before readers hear the end, so a repeat sent the moment the audio ends finds
        # the clip instead of synthesizing again. A stream the hang guard already ended (judged
        # failed) is not stored.
        if error is None and not cancelled and not stream.done and stream.chunks:
            self._store(stream, prepared)
            stream.finish()
        else:
            stream.finish(error)
            self._count("not_stored")
            log.debug(
                "clip %s not stored (%s)", prepared.key[:12], "failed" if error else "cancelled"
            )
        with self._lock:
            if self._inflight.get(prepared.key) is stream:
                del self._inflight[prepared.key]
            self._finishing.discard(stream)
            self._changed.notify_all()

    def _store(self, stream: AudioStream, prepared: Prepared) -> None:
        if self.store is None:
            return
        try:
            audio = join_chunks(stream.chunks)
            assert audio is not None
            clip = Clip(
                key=prepared.key,
                text=prepared.text,
                voice=prepared.config.voice or "",
                params={**prepared.params, "seed": prepared.config.seed},
                bundle=prepared.bundle,
                sample_rate=audio.sample_rate,
                audio=audio.pcm,
                words=audio.words,
                request=None if prepared.asked is None else prepared.asked.to_dict(),
            )
            evicted = self.store.put(clip)
        except (CacheError, sqlite3.Error, ValueError, OSError) as e:
            self._count("errors")
            log.warning("clip %s not stored: %s", prepared.key[:12], e)
            return
        self._count("stored")
        self.hits.refresh_stats()
        log.debug(
            "stored clip %s (%.2f s)%s",
            prepared.key[:12],
            clip.duration,
            f", evicted {len(evicted)}" if evicted else "",
        )

    # ---- bookkeeping ------------------------------------------------------------------------

    def _count(self, name: str) -> None:
        with self._lock:
            self.counters[name] += 1
