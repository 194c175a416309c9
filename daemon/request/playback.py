"""Playing one utterance: from its audio stream onto the sink, on the scheduler's play worker.

The worker opens the request's audio stream (``speakd.request.resolver``: a cache hit is whole at
once, a miss is filled by its synthesis thread) and reads it straight into the sink, so a cache hit
reaches the sink with one hand-off, and every wait is on an event, never a poll. Playback goes in
blocks of ``block_ms``; cancellation is checked between blocks, and a stop or cancel also
interrupts the sink's write (``Sink.interrupt``), so it takes effect at once, not at the end of the
block. A pause (of all requests, or of one client's) is checked there too: the playing utterance is
*parked* — what the sink holds plays out, its stream and its place in it are kept (``Playback``),
and it goes back to the queue. Which job plays, and when, is the queue's
(``speakd.request.scheduler``), as are the pause and the events' listeners.
"""

from __future__ import annotations

import logging
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from speakd.audio import AudioChunk, Word, scale_volume
from speakd.audio.sinks import Sink, SinkUnavailable
from speakd.machine.logcontext import request_context
from speakd.request import policy
from speakd.request.messages import (
    EventType,
    Priority,
    RequestError,
    SpeakRequest,
    error_data,
)
from speakd.request.resolver import Resolver
from speakd.request.stream import AudioStream, Cancel

log = logging.getLogger(__name__)

PARKED = "parked"  # _play's status for an utterance paused part-way (it goes back to the queue)


@dataclass(eq=False)
class Playback:
    """An utterance in flight: its audio stream and how far it has played. A parked (paused) job
    keeps it, so playback resumes where it stopped and synthesis is not redone."""

    stream: AudioStream
    position: int = 0  # chunks of the stream taken
    rest: AudioChunk | None = None  # the unplayed part of the chunk that was playing at the pause
    rest_marks: list[str] = field(default_factory=list)  # the marks before ``rest`` not sent yet
    on_sink: bool = False  # begun on the sink and not drained yet
    played: float = 0.0  # seconds of audio played
    samples: int = 0  # samples played: where a mark is
    rate: int = 0  # the sample rate of the chunk played last
    t0: float = field(default_factory=time.monotonic)

    def items(self, cancel: threading.Event) -> Iterator[tuple[AudioChunk, list[str]]]:
        """What is left to play, each chunk with the SSML marks just before it: the parked rest
        first (with the marks before it not sent before the pause), then the stream."""
        if self.rest is not None:
            rest, self.rest = self.rest, None
            yield rest, self.rest_marks
        for chunk in self.stream.read(cancel, start=self.position):
            marks = self.stream.marks_before(self.position)
            self.position += 1
            yield chunk, marks


@dataclass(eq=False)
class Job:
    """A request in the queue and, once picked, on the play worker."""

    request: SpeakRequest
    seq: int
    cancel: Cancel = field(default_factory=Cancel)
    cancel_status: str = "cancelled"  # "cancelled" | "interrupted" | "replaced" | "stopped"
    started: bool = False
    playback: Playback | None = None  # set once it is picked; kept while parked

    @property
    def id(self) -> str:
        return self.request.id

    @property
    def priority(self) -> Priority:
        return self.request.priority

    @property
    def entry(self) -> policy.Entry:
        return policy.Entry(self.id, self.priority, self.seq)

    def request_cancel(self, status: str) -> None:
        if not self.cancel.is_set():
            self.cancel_status = status
            self.cancel.set()


class Player(ABC):
    """The play worker's side of the scheduler: one job's audio onto the sink, in blocks, with its
    ``started``, marks and words on the way. The queue (``Scheduler``) supplies whether a job is
    paused (``_held``) and takes the events back to the loop (``_emit_threadsafe``)."""

    def __init__(
        self, resolver: Resolver, sink: Sink, *, block_ms: int, volume: float, tail_ms: int
    ) -> None:
        self.resolver = resolver
        self.sink = sink
        self.block_ms = block_ms
        self.volume = volume
        self.tail_ms = tail_ms
        self.fallback: AudioChunk | None = None  # played when the engine itself fails
        self._retired: list[Sink] = []  # replaced sinks still in use by the playing utterance

    @abstractmethod
    def _held(self, job: Job) -> bool:
        """Whether ``job`` is paused."""

    @abstractmethod
    def _emit_threadsafe(
        self, request: SpeakRequest, kind: EventType, data: dict[str, Any]
    ) -> None:
        """Send a request's event from the worker to its listeners on the loop."""

    def _play(self, job: Job) -> tuple[str, dict[str, Any] | None]:
        """Play one request, or the rest of a parked one; returns (final status or ``PARKED``,
        error event data or None)."""
        sink = self.sink  # a reload may swap self.sink meanwhile
        if job.playback is None:
            with request_context(job.id, job.request.config.voice or "default"):
                try:
                    stream = self.resolver.open(job.request)
                except Exception as e:  # not cached, or a request the engine refuses
                    stream = AudioStream.failed(e)
            job.playback = Playback(stream)
        playback = job.playback
        status = "error"
        job.cancel.add_hook(sink.interrupt)  # a stop cuts a paced write short
        try:
            status, error = self._stream(job, playback, sink)
            return status, error
        except SinkUnavailable as e:
            return "error", {"code": "audio_unavailable", "message": str(e)}
        except Exception as e:
            log.exception("playback of %s failed", job.id)
            return "error", error_data(e)
        finally:
            job.cancel.remove_hook(sink.interrupt)
            if status != PARKED:
                playback.stream.release()  # the last reader out cancels its synthesis
            self._release(sink, abort=playback.on_sink)

    def _stream(
        self, job: Job, playback: Playback, sink: Sink
    ) -> tuple[str, dict[str, Any] | None]:
        items = playback.items(job.cancel)
        while True:
            try:
                item = next(items, None)
            except Exception as e:
                return "error", self._synthesis_failed(job, playback, sink, e)
            if item is None:
                break
            chunk, marks = item
            written = self._write(job, playback, sink, chunk, marks)
            if written < len(chunk.pcm) and not job.cancel.is_set():  # paused between blocks
                playback.rest, playback.rest_marks = _rest(chunk, written), marks
                self._drain_sink(playback, sink)  # the sink is free for other utterances
                return PARKED, None
        if job.cancel.is_set():
            log.info(
                "request %s %s after %.2f s of audio", job.id, job.cancel_status, playback.played
            )
            return job.cancel_status, None
        self._tail(job, playback, sink)
        self._drain_sink(playback, sink)
        self._marks(job, playback, playback.stream.marks_before(playback.position))
        log.info(
            "request %s finished: %.2f s audio in %.2f s",
            job.id,
            playback.played,
            time.monotonic() - playback.t0,
        )
        return "done", None

    def _tail(self, job: Job, playback: Playback, sink: Sink) -> None:
        """``tail_ms`` of silence after the last sample on a sink that plays to a device
        (``pads_tail``), so a device (or a speaker behind it) that cuts its last buffer short, or
        powers down early, cuts silence and not the last word; files get none. A stop or cancel
        cuts it short like speech (``Sink.interrupt``)."""
        if not playback.on_sink or not self.tail_ms or not getattr(sink, "pads_tail", False):
            return
        silence = AudioChunk(bytes(2 * (playback.rate * self.tail_ms // 1000)), playback.rate)
        for block in _blocks(silence, self.block_ms):
            if job.cancel.is_set():
                return
            sink.write(block)

    def _marks(self, job: Job, playback: Playback, names: list[str]) -> None:
        for name in names:
            self._emit_threadsafe(
                job.request, EventType.MARK, {"name": name, "sample": playback.samples}
            )

    def _synthesis_failed(
        self, job: Job, playback: Playback, sink: Sink, e: Exception
    ) -> dict[str, Any]:
        """The error event's data; an engine fault before any audio plays the fallback prompt."""
        log.warning(
            "synthesis of %s failed: %s", job.id, e, exc_info=log.isEnabledFor(logging.DEBUG)
        )
        error = error_data(e)
        if not job.started and self.fallback is not None and _degrades(e):
            log.warning("request %s: %s; playing the fallback prompt", job.id, e)
            self._write(job, playback, sink, self.fallback)  # a pause cuts it short
            if not job.cancel.is_set():
                self._drain_sink(playback, sink)
            error["fallback"] = True
        return error

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

    def _write(
        self,
        job: Job,
        playback: Playback,
        sink: Sink,
        chunk: AudioChunk,
        marks: list[str] | None = None,
    ) -> int:
        """Play one chunk in blocks until it ends, the job is cancelled or it is paused; returns
        the bytes of ``chunk`` played. The ``marks`` just before it go out after ``started``
        (Speech Dispatcher's order: BEGIN, the marks, END or CANCELED), when the audio before
        them is on the sink; those not sent yet (paused before the chunk) stay in ``marks``."""
        request = job.request
        marks = [] if marks is None else marks
        written = 0
        base = playback.samples  # where the chunk starts in the utterance
        words = list(chunk.words) if request.words else []
        for block in _blocks(scale_volume(chunk, self.volume * request.volume), self.block_ms):
            if job.cancel.is_set() or self._held(job):
                words.clear()
                break
            if not playback.on_sink:
                (sink.resume if job.started else sink.begin)(job.id, chunk.sample_rate)
                playback.on_sink = True
            if not job.started:
                job.started = True
                latency = time.monotonic() - request.received
                started = {"latency_ms": round(latency * 1000, 1)}
                if playback.stream.voice_load_s is not None:  # a cold voice loaded first
                    started["voice_load_ms"] = round(playback.stream.voice_load_s * 1000, 1)
                self._emit_threadsafe(request, EventType.STARTED, started)
                log.info("request %s started after %.1f ms", job.id, latency * 1000)
            self._marks(job, playback, marks)
            marks.clear()
            end = (written + len(block)) // chunk.sample_width
            while words and words[0].start < end:  # reached in this block
                self._word(request, words.pop(0), base, chunk.sample_rate)
            sink.write(block)
            written += len(block)
            playback.rate = chunk.sample_rate
            playback.samples += len(block) // chunk.sample_width
            playback.played += len(block) / chunk.sample_width / chunk.sample_rate
        if not chunk.pcm and job.started and not job.cancel.is_set():  # no block to wait for
            self._marks(job, playback, marks)
            marks.clear()
        for word in words:  # a sentence's timing on the empty chunk after it
            self._word(request, word, base, chunk.sample_rate)
        return written

    def _word(self, request: SpeakRequest, word: Word, base: int, rate: int) -> None:
        self._emit_threadsafe(request, EventType(word.kind), word.event(base, rate))


def _degrades(e: BaseException) -> bool:
    """Failures of the engine itself (not of the request) fall back to the cached prompt."""
    from speakd.engines.base import EngineError
    from speakd.request.breaker import EngineTimeout, EngineUnavailable

    if isinstance(e, RequestError):
        return False
    return isinstance(e, EngineUnavailable | EngineTimeout) or not isinstance(e, EngineError)


def _rest(chunk: AudioChunk, written: int) -> AudioChunk:
    """What a pause left of ``chunk`` after ``written`` bytes: its audio, and the words not
    reached yet."""
    frames = written // chunk.sample_width
    words = tuple(w.shifted(-frames) for w in chunk.words if w.start >= frames)
    return AudioChunk(chunk.pcm[written:], chunk.sample_rate, chunk.channels, words=words)


def _blocks(chunk: AudioChunk, block_ms: int) -> Iterator[bytes]:
    step = max(1, chunk.sample_rate * block_ms // 1000) * 2
    pcm = chunk.pcm
    for i in range(0, len(pcm), step):
        yield pcm[i : i + step]
