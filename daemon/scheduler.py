"""The one queue every front-end feeds: priorities, interruption, stop/cancel, and playback.

Policy (SSIP's): important > message > text > notification. An important request interrupts
whatever non-important speech is playing; a new text request replaces pending and playing text;
a notification is spoken only when nothing else is, and anything else interrupts it. The queue is
bounded: past ``max_queue`` pending requests a new one is rejected with ``queue_full``.

Threads: the queue logic runs on the asyncio loop; each utterance plays on a worker thread while a
second thread pulls chunks from the audio source (engine or cache), so synthesis runs ahead of
playback and the loop never blocks. Playback goes in blocks of ``block_ms``; cancellation is checked
between blocks, so stop/cancel take effect within one block. A pause (of all requests, or of one
client's) is checked there too: the playing utterance is *parked* — what the sink holds plays out,
its synthesis and unplayed rest are kept, and it goes back to the queue — so the worker moves on to
other clients' requests (speech-dispatcher's PAUSE). Paused requests are not started; after
``resume`` a parked one continues where it stopped.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from speakd.audio import AudioChunk, scale_volume
from speakd.logcontext import request_context
from speakd.messages import (
    Event,
    EventCallback,
    EventType,
    Priority,
    RequestError,
    SpeakRequest,
)
from speakd.sinks import Sink, SinkUnavailable
from speakd.source import AudioSource

log = logging.getLogger(__name__)

_END = object()
PARKED = "parked"  # _play's status for an utterance paused part-way (it goes back to the queue)


@dataclass(eq=False)
class Playback:
    """An utterance in flight: its synthesis thread and what it has not played yet. A parked
    (paused) job keeps it, so playback resumes where it stopped and synthesis is not redone."""

    chunks: queue.Queue[Any]
    producer: threading.Thread
    rest: AudioChunk | None = None  # the unplayed part of the chunk that was playing at the pause
    on_sink: bool = False  # begun on the sink and not drained yet
    played: float = 0.0  # seconds of audio played
    t0: float = field(default_factory=time.monotonic)

    def items(self, cancel: threading.Event) -> Iterator[Any]:
        """What is left to play: the parked rest first, then the synthesis queue."""
        if self.rest is not None:
            rest, self.rest = self.rest, None
            yield rest
        yield from _drain(self.chunks, cancel)


@dataclass(eq=False)
class Job:
    request: SpeakRequest
    seq: int
    cancel: threading.Event = field(default_factory=threading.Event)
    cancel_status: str = "cancelled"  # "cancelled" | "interrupted" | "replaced" | "stopped"
    started: bool = False
    playback: Playback | None = None  # set once it is picked; kept while parked

    @property
    def id(self) -> str:
        return self.request.id

    @property
    def priority(self) -> Priority:
        return self.request.priority

    def request_cancel(self, status: str) -> None:
        if not self.cancel.is_set():
            self.cancel_status = status
            self.cancel.set()


class Scheduler:
    def __init__(
        self,
        source: AudioSource,
        sink: Sink,
        *,
        max_queue: int = 32,
        block_ms: int = 50,
        volume: float = 1.0,
    ) -> None:
        self.source = source
        self.sink = sink
        self.max_queue = max_queue
        self.block_ms = block_ms
        self.volume = volume
        self._pending: list[Job] = []
        self._current: Job | None = None
        self._seq = 0
        self._wakeup = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="speakd-play")
        self._closing = False
        self.fallback: AudioChunk | None = None  # played when the engine itself fails
        self._retired: list[Sink] = []  # replaced sinks still in use by the playing utterance
        self._paused_all = False
        self._paused_clients: set[str] = set()
        self.counters = {"accepted": 0, "rejected": 0, "finished": 0, "cancelled": 0, "errors": 0}
        # Called with every request's events, on the loop thread (e.g. MQTT publishes status).
        self.listeners: list[EventCallback] = []

    # ---- front-end API (call on the loop thread) -------------------------------------------

    def submit(self, request: SpeakRequest) -> None:
        """Queue a request; its origin hears ``queued`` or a terminal ``error``/``finished``."""
        try:
            self._admit(request)
        except RequestError as e:
            self.counters["rejected"] += 1
            log.info("request %s rejected (%s): %s", request.id, e.code, e)
            self._emit(request, EventType.ERROR, {"code": e.code, "message": str(e)})
            return
        job = Job(request, self._seq)
        self._seq += 1
        self._apply_policy(job)
        if job.cancel.is_set():  # a notification that arrived while something else plays
            self._finish(job, job.cancel_status)
            return
        self._pending.append(job)
        self.counters["accepted"] += 1
        self._emit(request, EventType.QUEUED, {"position": self._position(job)})
        log.info(
            "request %s queued: priority=%s voice=%s chars=%d origin=%s",
            request.id,
            request.priority.name.lower(),
            request.config.voice or "default",
            len(request.text),
            request.origin,
        )
        self._wakeup.set()

    def stop(self) -> int:
        """Silence now: stop the current utterance and drop everything queued."""
        jobs = [*self._pending, *([self._current] if self._current else [])]
        for job in self._pending:
            job.request_cancel("stopped")
            self._finish(job, "stopped")
        self._pending.clear()
        if self._current:
            self._current.request_cancel("stopped")
        return len(jobs)

    def cancel(self, request_id: str | None = None, client: str | None = None) -> int:
        """Cancel one request by id, every request of a client, or (neither) the current one."""
        if request_id is None and client is None:
            targets = [self._current] if self._current else []
        else:
            targets = [
                j
                for j in [*self._pending, *([self._current] if self._current else [])]
                if (request_id is not None and j.id == request_id)
                or (client is not None and j.request.client == client)
            ]
        for job in targets:
            job.request_cancel("cancelled")
            if job in self._pending:
                self._pending.remove(job)
                self._finish(job, "cancelled")
        return len(targets)

    def pause(self, client: str | None = None) -> None:
        """Hold playback of every request (``client`` None) or of one client's requests."""
        if client is None:
            self._paused_all = True
        else:
            self._paused_clients.add(client)

    def resume(self, client: str | None = None) -> bool:
        """Lift a pause (all of them when ``client`` is None); False when none was set."""
        if client is None:
            was = self._paused_all or bool(self._paused_clients)
            self._paused_all = False
            self._paused_clients.clear()
        else:
            was = client in self._paused_clients
            self._paused_clients.discard(client)
        self._wakeup.set()
        return was

    def replace_sink(self, sink: Sink) -> Sink | None:
        """Swap the sink (reload); returns the old one for the caller to close, or None when an
        utterance is playing on it — then it is closed as soon as that utterance ends."""
        old, self.sink = self.sink, sink
        if self._current is None:
            return old
        self._retired.append(old)
        return None

    def knows(self, request_id: str) -> bool:
        return any(j.id == request_id for j in self._jobs())

    def status(self) -> dict[str, Any]:
        current = self._current
        return {
            "state": "speaking" if current and current.started else ("busy" if current else "idle"),
            "current": current.id if current else None,
            "current_priority": current.priority.name.lower() if current else None,
            "queue": [j.id for j in sorted(self._pending, key=_order)],
            "queue_length": len(self._pending),
            "max_queue": self.max_queue,
            "audio": self.sink.status(),
            "source": self.source.status(),
            "counters": dict(self.counters),
            "paused": self._paused_all or sorted(self._paused_clients),
            "fallback_ready": self.fallback is not None,
        }

    # ---- the loop ---------------------------------------------------------------------------

    async def run(self) -> None:
        self._loop = asyncio.get_running_loop()
        while not self._closing:
            ready = [j for j in self._pending if not self._held(j)]
            if not ready:
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            job = min(ready, key=_order)
            self._pending.remove(job)
            self._current = job
            if job.playback is not None and job.started:
                log.info("request %s resumed", job.id)
                self._emit(job.request, EventType.RESUMED, {})
            try:
                status, error = await self._loop.run_in_executor(self._executor, self._play, job)
            finally:
                self._current = None
            if status == PARKED:
                self._park(job)
            elif error is not None:
                self.counters["errors"] += 1
                self._emit(job.request, EventType.ERROR, error)
            else:
                self._finish(job, status)

    async def close(self) -> None:
        self._closing = True
        self.stop()
        self._wakeup.set()
        await asyncio.get_running_loop().run_in_executor(None, self._executor.shutdown)

    # ---- policy -----------------------------------------------------------------------------

    def _admit(self, request: SpeakRequest) -> None:
        if self._closing:
            raise RequestError("shutting_down", "speakd is shutting down")
        if self.knows(request.id):
            raise RequestError(
                "duplicate_id", f"a request with id {request.id!r} is already queued"
            )
        if len(self._pending) >= self.max_queue:
            raise RequestError(
                "queue_full", f"queue is full ({self.max_queue} pending); try again later"
            )

    def _apply_policy(self, job: Job) -> None:
        p = job.priority
        current = self._current
        if p >= Priority.NOTIFICATION:
            for other in [j for j in self._pending if j.priority >= Priority.NOTIFICATION]:
                self._drop_pending(other, "replaced")
            if current is not None or self._pending:
                job.request_cancel("discarded")
            return
        if p == Priority.TEXT:
            for other in [j for j in self._pending if j.priority == Priority.TEXT]:
                self._drop_pending(other, "replaced")
        if current is None:
            return
        if (
            (p == Priority.IMPORTANT and current.priority != Priority.IMPORTANT)
            or (p == Priority.TEXT and current.priority == Priority.TEXT)
            or current.priority >= Priority.NOTIFICATION
        ):
            log.info("request %s interrupts %s", job.id, current.id)
            current.request_cancel("interrupted" if p != Priority.TEXT else "replaced")

    def _park(self, job: Job) -> None:
        """A paused utterance goes back to the queue (it keeps its place) until resumed."""
        if job.cancel.is_set():  # stopped while it was being parked
            self._finish(job, job.cancel_status)
            return
        self._pending.append(job)
        if job.started:
            assert job.playback is not None
            log.info("request %s paused after %.2f s of audio", job.id, job.playback.played)
            self._emit(job.request, EventType.PAUSED, {})
        self._wakeup.set()  # the worker is free for other clients

    def _drop_pending(self, job: Job, status: str) -> None:
        self._pending.remove(job)
        job.request_cancel(status)
        self._finish(job, status)

    def _held(self, job: Job) -> bool:
        return self._paused_all or job.request.client in self._paused_clients

    def _position(self, job: Job) -> int:
        return sorted(self._pending, key=_order).index(job) + (1 if self._current else 0)

    def _jobs(self) -> list[Job]:
        return [*self._pending, *([self._current] if self._current else [])]

    # ---- events -----------------------------------------------------------------------------

    def _finish(self, job: Job, status: str) -> None:
        self.counters["finished" if status == "done" else "cancelled"] += 1
        self._emit(job.request, EventType.FINISHED, {"status": status})

    def _emit(self, request: SpeakRequest, kind: EventType, data: dict[str, Any]) -> None:
        event = Event(kind, request.id, data)
        for callback in [request.on_event, *self.listeners]:
            if callback is None:
                continue
            try:
                callback(event)
            except Exception:  # a front-end's bug must not take the queue down
                log.exception("event handler for %s failed", request.id)

    def _emit_threadsafe(
        self, request: SpeakRequest, kind: EventType, data: dict[str, Any]
    ) -> None:
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self._emit, request, kind, data)

    # ---- playback (worker thread) -----------------------------------------------------------

    def _play(self, job: Job) -> tuple[str, dict[str, Any] | None]:
        """Play one request, or the rest of a parked one; returns (final status or ``PARKED``,
        error event data or None)."""
        sink = self.sink  # a reload may swap self.sink meanwhile
        if job.playback is None:
            job.playback = self._synthesize(job)
        playback = job.playback
        status = "error"
        try:
            status, error = self._stream(job, playback, sink)
            return status, error
        except SinkUnavailable as e:
            return "error", {"code": "audio_unavailable", "message": str(e)}
        except Exception as e:
            log.exception("playback of %s failed", job.id)
            return "error", _error_data(e)
        finally:
            if status != PARKED:
                job.cancel.set()  # stops the producer if it is still running
                playback.producer.join()
            self._release(sink, abort=playback.on_sink)

    def _synthesize(self, job: Job) -> Playback:
        chunks: queue.Queue[Any] = queue.Queue(maxsize=256)
        producer = threading.Thread(
            target=self._produce, args=(job, chunks), name=f"speakd-synth-{job.id}", daemon=True
        )
        producer.start()
        return Playback(chunks, producer)

    def _stream(
        self, job: Job, playback: Playback, sink: Sink
    ) -> tuple[str, dict[str, Any] | None]:
        for chunk in playback.items(job.cancel):
            if isinstance(chunk, BaseException):
                error = _error_data(chunk)
                if not job.started and self.fallback is not None and _degrades(chunk):
                    log.warning("request %s: %s; playing the fallback prompt", job.id, chunk)
                    self._write(job, playback, sink, self.fallback)  # a pause cuts it short
                    if not job.cancel.is_set():
                        self._drain_sink(playback, sink)
                    error["fallback"] = True
                return "error", error
            written = self._write(job, playback, sink, chunk)
            if written < len(chunk.pcm) and not job.cancel.is_set():  # paused between blocks
                playback.rest = AudioChunk(chunk.pcm[written:], chunk.sample_rate, chunk.channels)
                self._drain_sink(playback, sink)  # the sink is free for other utterances
                return PARKED, None
        if job.cancel.is_set():
            log.info(
                "request %s %s after %.2f s of audio", job.id, job.cancel_status, playback.played
            )
            return job.cancel_status, None
        self._drain_sink(playback, sink)
        log.info(
            "request %s finished: %.2f s audio in %.2f s",
            job.id,
            playback.played,
            time.monotonic() - playback.t0,
        )
        return "done", None

    @staticmethod
    def _drain_sink(playback: Playback, sink: Sink) -> None:
        if playback.on_sink:
            sink.drain()
            playback.on_sink = False

    def _release(self, sink: Sink, abort: bool) -> None:
        """Drop what a stopped or failed utterance left in the sink; close sinks a reload
        replaced while this utterance was playing (only now is nobody writing to them)."""
        try:
            if abort:
                sink.abort()
            while self._retired:
                self._retired.pop().close()
        except Exception:  # the device may be gone; the next utterance reopens it
            log.warning("releasing the audio sink failed", exc_info=True)

    def _write(self, job: Job, playback: Playback, sink: Sink, chunk: AudioChunk) -> int:
        """Play one chunk in blocks until it ends, the job is cancelled or it is paused; returns
        the bytes of ``chunk`` played."""
        request = job.request
        written = 0
        for block in _blocks(scale_volume(chunk, self.volume * request.volume), self.block_ms):
            if job.cancel.is_set() or self._held(job):
                break
            if not playback.on_sink:
                (sink.resume if job.started else sink.begin)(job.id, chunk.sample_rate)
                playback.on_sink = True
            if not job.started:
                job.started = True
                latency = time.monotonic() - request.received
                self._emit_threadsafe(
                    request, EventType.STARTED, {"latency_ms": round(latency * 1000, 1)}
                )
                log.info("request %s started after %.1f ms", job.id, latency * 1000)
            sink.write(block)
            written += len(block)
            playback.played += len(block) / chunk.sample_width / chunk.sample_rate
        return written

    def _produce(self, job: Job, chunks: queue.Queue[Any]) -> None:
        """Synthesis thread: what the engine and the cache log here names the request."""
        with request_context(job.id, job.request.config.voice or "default"):
            try:
                for chunk in self.source.stream(job.request, job.cancel):
                    if not _put(chunks, chunk, job.cancel):
                        return
                    if job.cancel.is_set():
                        return
                _put(chunks, _END, job.cancel)
            except Exception as e:
                if not job.cancel.is_set():
                    log.warning(
                        "synthesis of %s failed: %s",
                        job.id,
                        e,
                        exc_info=log.isEnabledFor(logging.DEBUG),
                    )
                _put(chunks, e, job.cancel)


def _order(job: Job) -> tuple[int, int]:
    return (int(job.priority), job.seq)


def _degrades(e: BaseException) -> bool:
    """Failures of the engine itself (not of the request) fall back to the cached prompt."""
    from speakd.breaker import EngineTimeout, EngineUnavailable
    from speakd.engines.base import EngineError

    return isinstance(e, EngineUnavailable | EngineTimeout) or not isinstance(e, EngineError)


def _error_data(e: BaseException) -> dict[str, Any]:
    from speakd.engines.base import EngineError, UnknownVoiceError

    if isinstance(e, UnknownVoiceError):
        return {"code": "unknown_voice", "message": str(e)}
    if isinstance(e, EngineError):  # subclasses may name their own code (cache: not_cached)
        return {"code": getattr(e, "code", "synthesis_failed"), "message": str(e)}
    return {"code": "internal_error", "message": f"{type(e).__name__}: {e}"}


def _put(chunks: queue.Queue[Any], item: Any, cancel: threading.Event) -> bool:
    while not cancel.is_set():
        try:
            chunks.put(item, timeout=0.05)
            return True
        except queue.Full:
            continue
    return False


def _drain(chunks: queue.Queue[Any], cancel: threading.Event) -> Iterator[Any]:
    while not cancel.is_set():
        try:
            item = chunks.get(timeout=0.02)
        except queue.Empty:
            continue
        if item is _END:
            return
        yield item


def _blocks(chunk: AudioChunk, block_ms: int) -> Iterator[bytes]:
    step = max(1, chunk.sample_rate * block_ms // 1000) * 2
    pcm = chunk.pcm
    for i in range(0, len(pcm), step):
        yield pcm[i : i + step]
