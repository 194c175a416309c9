"""One synthesis, many readers: the audio stream every consumer of a request reads.

A prepared request opens an ``AudioStream`` (``speakd.request.resolver``). One producer fills it — a
synthesis thread, or the cache handing over a stored clip at once — and any number of readers
follow it from its first chunk: the playback worker, a socket ``synth`` client, a Wyoming or HTTP
caller, ``speakd synth`` and precompute. A reader that joins late starts from the beginning.

Every wait is event-driven: producers notify a condition (threads) and wake asyncio readers with
``call_soon_threadsafe``; a ``Cancel`` wakes the reader it belongs to. Errors and hangs surface
here, in one place: a producer's exception is raised in every reader, and a stream that started
synthesising but has produced nothing for ``hang_timeout_s`` fails with ``EngineTimeout``. The
synthesis is cancelled when its last reader leaves (unless it is *detached*: a background refresh
that nobody listens to).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator

from speakd.audio import AudioChunk
from speakd.engines.base import EngineError

log = logging.getLogger(__name__)


class EngineTimeout(EngineError):
    """The engine started but produced no audio within the hang timeout."""

    code = "engine_timeout"


class Cancel(threading.Event):
    """A ``threading.Event`` that also runs hooks when set, so a reader blocked on a stream's
    condition wakes at once instead of polling the event."""

    def __init__(self) -> None:
        super().__init__()
        self._hooks: list[Callable[[], None]] = []
        self._hooks_lock = threading.Lock()

    def set(self) -> None:
        super().set()
        with self._hooks_lock:
            hooks = list(self._hooks)
        for hook in hooks:
            hook()

    def add_hook(self, hook: Callable[[], None]) -> None:
        with self._hooks_lock:
            self._hooks.append(hook)
        if self.is_set():
            hook()

    def remove_hook(self, hook: Callable[[], None]) -> None:
        with self._hooks_lock:
            if hook in self._hooks:
                self._hooks.remove(hook)


class AudioStream:
    """The chunks of one request's audio, kept until the stream is dropped (a cache store and a
    late reader both need all of them)."""

    def __init__(
        self,
        key: str,
        *,
        hang_timeout_s: float | None = None,
        detached: bool = False,
        on_hang: Callable[[AudioStream], None] | None = None,
    ) -> None:
        self.key = key
        self.hang_timeout_s = hang_timeout_s
        self.detached = detached
        self.chunks: list[AudioChunk] = []
        self.marks: list[tuple[int, str]] = []  # (index of the chunk a mark precedes, its name)
        self.voice_load_s: float | None = None  # its voice was loaded for it, in this long
        self.done = False
        self.error: BaseException | None = None
        self.cancel = Cancel()  # the producer's: set when the last reader leaves
        self.readers = 0
        self.from_cache = False
        self.shipped = False  # a hit in the shipped pack (speakd.cache.shipped)
        self._on_hang = on_hang
        self._progress: float | None = None  # monotonic time of the last sign of life
        self._hang_unreported = False
        self._cond = threading.Condition()
        self._wakers: set[Callable[[], None]] = set()  # asyncio readers

    @classmethod
    def complete(cls, key: str, chunk: AudioChunk, *, shipped: bool = False) -> AudioStream:
        """A stream that is whole already (a cache hit): no producer, nothing to wait for."""
        stream = cls(key)
        stream.chunks.append(chunk)
        stream.done = True
        stream.from_cache, stream.shipped = True, shipped
        return stream

    @classmethod
    def failed(cls, error: BaseException) -> AudioStream:
        """A stream that could not be opened: its readers get ``error``."""
        stream = cls("")
        stream.done, stream.error = True, error
        return stream

    # ---- producer ---------------------------------------------------------------------------

    def begin(self) -> None:
        """The producer started real work: from now on silence counts towards the hang timeout.
        Readers already asleep (they came first: the voice was loading, the machine was busy)
        slept without a timeout; they are woken to take it up."""
        with self._cond:
            self._progress = time.monotonic()
            self._cond.notify_all()
        self._wake()

    def put(self, chunk: AudioChunk) -> None:
        with self._cond:
            if self.done:
                return
            self.chunks.append(chunk)
            self._progress = time.monotonic()
            self._cond.notify_all()
        self._wake()

    def mark(self, name: str) -> None:
        """A mark at this point of the audio, before the next chunk put
        (``speakd.request.compose``)."""
        with self._cond:
            if not self.done:
                self.marks.append((len(self.chunks), name))

    def loaded_voice(self, seconds: float) -> None:
        """Its voice was not in memory and loaded for it first (a cold voice's first request
        tells its caller why its first audio came late)."""
        self.voice_load_s = seconds

    def finish(self, error: BaseException | None = None) -> bool:
        """End the stream (with ``error``, or cleanly); False when it had ended already."""
        with self._cond:
            if self.done:
                return False
            self.done, self.error = True, error
            self._cond.notify_all()
        self._wake()
        if error is not None:
            self.cancel.set()
        return True

    @property
    def duration(self) -> float:
        return sum(c.duration for c in self.chunks)

    def marks_before(self, index: int) -> list[str]:
        """The marks a reader passes before chunk ``index`` (``len(chunks)``: at the end)."""
        with self._cond:
            return [name for i, name in self.marks if i == index]

    # ---- readers ----------------------------------------------------------------------------

    def attach(self) -> AudioStream:
        with self._cond:
            self.readers += 1
        return self

    def release(self) -> None:
        """A reader leaves; the last one cancels an unfinished synthesis nobody else wants."""
        with self._cond:
            self.readers -= 1
            orphaned = self.readers <= 0 and not self.done and not self.detached
        if orphaned:
            self.cancel.set()

    def read(self, cancel: threading.Event | None = None, start: int = 0) -> Iterator[AudioChunk]:
        """Chunks from index ``start`` on, blocking (on a worker thread) until each is made.
        Returns when the stream ends or ``cancel`` is set; raises the producer's error."""
        i = start
        wake = self._notify
        if isinstance(cancel, Cancel):
            cancel.add_hook(wake)
        try:
            while cancel is None or not cancel.is_set():
                with self._cond:
                    while not self._ready(i) and (cancel is None or not cancel.is_set()):
                        self._cond.wait(self._wait_s())
                        if self._expire():
                            break
                    chunk = self.chunks[i] if i < len(self.chunks) else None
                self._after_hang()
                if cancel is not None and cancel.is_set():
                    return
                if chunk is None:
                    self._raise_end()
                    return
                i += 1
                yield chunk
        finally:
            if isinstance(cancel, Cancel):
                cancel.remove_hook(wake)

    async def aread(self, start: int = 0) -> AsyncIterator[AudioChunk]:
        """The same chunks for an asyncio reader: the producer wakes it through its loop."""
        loop = asyncio.get_running_loop()
        event = asyncio.Event()

        def waker() -> None:
            loop.call_soon_threadsafe(event.set)

        with self._cond:
            self._wakers.add(waker)
        try:
            i = start
            while True:
                with self._cond:
                    self._expire()
                    ready = self._ready(i)
                    chunk = self.chunks[i] if i < len(self.chunks) else None
                    if not ready:
                        event.clear()
                    timeout = self._wait_s()
                self._after_hang()
                if chunk is not None:
                    i += 1
                    yield chunk
                elif ready:
                    self._raise_end()
                    return
                else:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(event.wait(), timeout)
        finally:
            with self._cond:
                self._wakers.discard(waker)

    # ---- internals (call with self._cond held unless said otherwise) -------------------------

    def _ready(self, i: int) -> bool:
        return i < len(self.chunks) or self.done

    def _raise_end(self) -> None:
        if self.error is not None:
            raise self.error

    def _wait_s(self) -> float | None:
        """How long a reader may sleep before it must look for a hang (None: until woken)."""
        if self.hang_timeout_s is None or self._progress is None:
            return None
        return max(0.0, self._progress + self.hang_timeout_s - time.monotonic()) + 0.001

    def _expire(self) -> bool:
        """End the stream with EngineTimeout when its producer has gone silent too long."""
        if self.done or self.hang_timeout_s is None or self._progress is None:
            return False
        if time.monotonic() - self._progress < self.hang_timeout_s:
            return False
        self.done = True
        self.error = EngineTimeout(
            f"synthesis timed out: no audio for {self.hang_timeout_s:g} s (engine hung)"
        )
        self._hang_unreported = True
        self._cond.notify_all()
        return True

    def _after_hang(self) -> None:
        """Outside the lock, once: wake the other readers, stop the producer, tell the guard."""
        with self._cond:
            if not self._hang_unreported:
                return
            self._hang_unreported = False
        log.warning("stream %s: %s", self.key[:12], self.error)
        self._wake()
        self.cancel.set()
        if self._on_hang is not None:
            self._on_hang(self)

    def _notify(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def _wake(self) -> None:
        with self._cond:
            wakers = list(self._wakers)
        for waker in wakers:
            waker()
