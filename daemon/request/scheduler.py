"""The one queue every front-end feeds: priorities, interruption, stop/cancel, pause.

What to do with a new request — admit, replace, interrupt, discard — is decided by
``speakd.request.policy`` (SSIP's rules, as pure functions); this module carries the decisions out.

Threads: the queue logic runs on the asyncio loop; each utterance plays on one worker thread
(``speakd.request.playback``: from its audio stream onto the sink, in blocks). A pause (of all
requests, or of one client's) *parks* the playing utterance: its stream and its place in it are
kept, and it goes back to the queue, so the worker moves on to other clients' requests
(speech-dispatcher's PAUSE). Paused requests are not started; after ``resume`` a parked one
continues where it stopped.
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from speakd.audio.sinks import Sink
from speakd.request import policy
from speakd.request.messages import Event, EventCallback, EventType, SpeakRequest
from speakd.request.playback import PARKED, Job, Player
from speakd.request.resolver import Resolver

log = logging.getLogger(__name__)


class Scheduler(Player):
    def __init__(
        self,
        resolver: Resolver,
        sink: Sink,
        *,
        max_queue: int = 32,
        block_ms: int = 50,
        volume: float = 1.0,
        tail_ms: int = 0,
    ) -> None:
        super().__init__(resolver, sink, block_ms=block_ms, volume=volume, tail_ms=tail_ms)
        self.max_queue = max_queue
        self._pending: list[Job] = []
        self._current: Job | None = None
        self._seq = 0
        self._wakeup = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="speakd-play")
        self._closing = False
        self._paused_all = False
        self._paused_clients: set[str] = set()
        self.counters = {"accepted": 0, "rejected": 0, "finished": 0, "cancelled": 0, "errors": 0}
        # Called with every request's events, on the loop thread (e.g. MQTT publishes status).
        self.listeners: list[EventCallback] = []

    # ---- front-end API (call on the loop thread) -------------------------------------------

    def submit(self, request: SpeakRequest, bounded: bool = True) -> None:
        """Queue a request; its origin hears ``queued`` or a terminal ``error``/``finished``.
        Not ``bounded``: past the queue limit (promised already: an MQTT say journaled)."""
        job = Job(request, self._seq)
        decision = policy.decide(self._state(bounded), job.entry)
        if decision.reject is not None:
            code, message = decision.reject
            self.counters["rejected"] += 1
            log.info("request %s rejected (%s): %s", request.id, code, message)
            self._emit(request, EventType.ERROR, {"code": code, "message": message})
            return
        self._seq += 1
        for other in [j for j in self._pending if j.id in decision.replace]:
            self._drop_pending(other, "replaced")
        if decision.interrupt is not None and self._current is not None:
            log.info("request %s interrupts %s", job.id, self._current.id)
            self._current.request_cancel(decision.interrupt)
        if decision.discard:  # a notification that arrived while something else plays
            self._finish(job, "discarded")
            return
        self._enqueue(job)

    def restore(self, request: SpeakRequest) -> None:
        """Queue a request accepted before a restart (the MQTT journal's): promised, so no limit,
        replace, discard or interrupt applies; it keeps its priority and waits its turn."""
        if self._closing:
            message = "speakd is shutting down"
            self._emit(request, EventType.ERROR, {"code": "shutting_down", "message": message})
            return
        self._seq, job = self._seq + 1, Job(request, self._seq)
        self._enqueue(job)

    def _enqueue(self, job: Job) -> None:
        request = job.request
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

    def room(self) -> int:  # places left in the queue (negative past the limit)
        return self.max_queue - len(self._pending)

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
            "source": self.resolver.status(),
            "counters": dict(self.counters),
            "paused": self._paused_all or sorted(self._paused_clients),
            "fallback_ready": self.fallback is not None,
        }

    # ---- the loop ---------------------------------------------------------------------------

    async def run(self) -> None:
        self._loop = asyncio.get_running_loop()
        while not self._closing:
            ready = {j.entry: j for j in self._pending if not self._held(j)}
            if not ready:
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            job = ready[policy.next_entry(list(ready))]
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

    def _state(self, bounded: bool = True) -> policy.QueueState:
        return policy.QueueState(
            [j.entry for j in self._pending],
            self._current.entry if self._current else None,
            self.max_queue if bounded else len(self._pending) + 1,
            self._closing,
        )

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


def _order(job: Job) -> tuple[int, int]:
    return (int(job.priority), job.seq)
