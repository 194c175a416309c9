"""The threads syntheses run on: each stays for the next synthesis once its own ends.

A thread started for each synthesis put a new line's first audio about 5 ms later (p50 of
``bench screenreader --phase nav``, two interleaved A/B pairs on 2 cores: 56.6 and 59.5 ms against
51.3 and 53.2 ms; docs/vits-engine.md, "Threads and memory"): the new thread starts cold beside
onnxruntime's pool threads, whose runs it joins. A thread that ran the last synthesis does not.

They are daemon threads, as the per-synthesis ones were: a hung engine's run must never hold the
process at exit. ``concurrent.futures.ThreadPoolExecutor`` cannot give that (its workers are joined
at interpreter exit), hence this small pool. ``speakd.lifecycle.process.exit_now`` waits for busy
workers (``wait_idle``) as it joins other daemon threads, and not for idle ones.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)


class SynthesisWorker(threading.Thread):
    """One daemon thread running what ``give`` hands it, one call at a time."""

    def __init__(self, name: str, done: Callable[[SynthesisWorker], None]) -> None:
        super().__init__(name=name, daemon=True)
        self._calls: queue.SimpleQueue[Callable[[], object]] = queue.SimpleQueue()
        self._done = done
        self._idle = threading.Event()
        self._idle.set()

    @property
    def busy(self) -> bool:
        return not self._idle.is_set()

    def give(self, call: Callable[[], object]) -> None:
        self._idle.clear()
        self._calls.put(call)

    def wait_idle(self, timeout: float) -> bool:
        """True once the call it runs has returned (at once when it runs none)."""
        return self._idle.wait(timeout)

    def run(self) -> None:
        while True:
            call = self._calls.get()
            try:
                call()
            except BaseException:  # the call handles its own errors; this keeps the thread
                log.exception("synthesis thread %s: an unhandled error", self.name)
            finally:
                self._idle.set()
                self._done(self)


class SynthesisWorkers:
    """Idle workers, the last one back first (its caches are warmest); a new one when all are
    busy, so a synthesis never waits for another to end."""

    def __init__(self, prefix: str = "speakd-synth") -> None:
        self._prefix = prefix
        self._lock = threading.Lock()
        self._idle: list[SynthesisWorker] = []
        self._made = 0

    def start(self, call: Callable[[], object]) -> None:
        with self._lock:
            if self._idle:
                worker = self._idle.pop()
            else:
                self._made += 1
                worker = SynthesisWorker(f"{self._prefix}-{self._made}", self._back)
                worker.start()
        worker.give(call)

    @property
    def threads(self) -> int:
        """Workers made so far (busy and idle)."""
        return self._made

    def _back(self, worker: SynthesisWorker) -> None:
        with self._lock:
            self._idle.append(worker)

    def _forked(self) -> None:
        """In a forked child: the workers are the parent's threads, which the child does not
        have (only the forking thread goes on), and the lock may have been held."""
        self._lock = threading.Lock()
        self._idle = []


WORKERS = SynthesisWorkers()  # one pool for the process: a reload's new resolver uses it too
os.register_at_fork(after_in_child=WORKERS._forked)
