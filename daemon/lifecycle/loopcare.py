"""The event loop's own pauses: a probe that measures them, and garbage collections kept off speech.

Every request's events, key echo and CANCEL go through one event loop, so anything that holds it
(or holds the GIL from any thread) delays them all. Python's cyclic garbage collector is the
largest such pause here: a full (generation 2) collection walks every tracked object, and a
loaded voice, its graph's Python objects and the caches are hundreds of thousands of them: 16–25
ms on 2 cores, landing wherever the allocation count happened to trip it (issue 54). So:

* **freeze** (``gc.freeze``) what start-up allocated, once READY: those objects live as long as
  the daemon, and a collection no longer walks them;
* **no automatic full collection** (generation 2's threshold out of reach); the young generations
  stay as they are (a fraction of a millisecond each);
* **a full collection when idle**: nothing playing, queued or streaming, checked every
  ``IDLE_CHECK_S``, at most every ``IDLE_GC_S``; a daemon that is never idle still gets one every
  ``FORCED_GC_S``, so cycles never pile up.

The **probe** is a timer of fixed period (``PROBE_PERIOD_S``) that records how late it fires.
``status()["loop"]`` gives the worst lateness since READY, counts of latenesses by bucket
(``BUCKETS_MS``, cumulative: two reads give a run's own) and the last ``KEEP_STALLS`` latenesses
of at least ``STALL_MS`` with their monotonic instants, from which ``bench screenreader`` and the
soak take the worst stall of their own run.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections import deque
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

PROBE_PERIOD_S = 0.01
BUCKETS_MS = (2, 5, 10, 20, 50, 100)  # latenesses counted: "≥ 5" of at least 5 ms (below 2:
# the timer's own jitter)
STALL_MS = 5.0  # latenesses kept with their instants (issue 54's bound for the worst stall)
KEEP_STALLS = 32  # the status is published over MQTT on every event: kept small
DEFAULT_GEN2 = gc.get_threshold()[2]  # what the process had before a daemon took it
GEN2_OFF = 1_000_000  # generation 2's threshold: never reached, so collected only here
IDLE_CHECK_S = 1.0
IDLE_GC_S = 30.0
FORCED_GC_S = 600.0


class LoopCare:
    """The probe and the collector of one daemon; ``idle`` says nothing would wait for a pause."""

    def __init__(self, idle: Callable[[], bool]) -> None:
        self.idle = idle
        self.stalls: deque[tuple[float, float]] = deque(maxlen=KEEP_STALLS)
        self.worst_ms = 0.0
        self.counts = dict.fromkeys(BUCKETS_MS, 0)
        self.collections = 0
        self.frozen = 0  # objects frozen at READY or the last reload
        self.last_collection_ms = 0.0
        self.longest_collection_ms = 0.0
        self._collected_at = time.monotonic()

    def start(self) -> list[asyncio.Task[None]]:
        """Freeze start-up's objects, take full collections off the allocation count, and start
        the probe and the idle collector on the running loop (their tasks, for shutdown)."""
        self.freeze()
        young, middle, _old = gc.get_threshold()
        gc.set_threshold(young, middle, GEN2_OFF)  # until the collector stops (see _collector)
        return [
            asyncio.create_task(self._probe(), name="loop-probe"),
            asyncio.create_task(self._collector(), name="idle-gc"),
        ]

    def freeze(self) -> None:
        """Freeze what is alive now; at start-up and again after a reload, which thawed first so
        that the objects a new model or config replaced, cycles included, can be collected. The
        count is kept for the status: ``gc.get_freeze_count`` walks every frozen object (0.45 ms
        for 80 000), and the MQTT front-end builds a status for each burst of events."""
        gc.unfreeze()
        gc.collect()
        gc.freeze()
        self.frozen = gc.get_freeze_count()
        log.info("gc: %d objects frozen; full collections when idle", self.frozen)

    async def _probe(self) -> None:
        loop = asyncio.get_running_loop()
        due = loop.time() + PROBE_PERIOD_S
        while True:
            await asyncio.sleep(max(0.0, due - loop.time()))
            now = loop.time()
            self.note((now - due) * 1e3)
            due = max(due + PROBE_PERIOD_S, now)  # a long stall counts once, not as many misses

    def note(self, late_ms: float) -> None:
        """One firing ``late_ms`` after its time."""
        self.worst_ms = max(self.worst_ms, late_ms)
        for edge in BUCKETS_MS:
            self.counts[edge] += late_ms >= edge
        if late_ms >= STALL_MS:
            self.stalls.append((time.monotonic(), round(late_ms, 2)))

    async def _collector(self) -> None:
        try:
            while True:
                await asyncio.sleep(IDLE_CHECK_S)
                since = time.monotonic() - self._collected_at
                if since >= FORCED_GC_S or (since >= IDLE_GC_S and self.idle()):
                    self.collect()
        finally:  # a daemon in a longer-lived process (the library's, a test's) gives it back
            young, middle, _off = gc.get_threshold()
            gc.set_threshold(young, middle, DEFAULT_GEN2)
            gc.unfreeze()

    def collect(self) -> None:
        t0 = time.perf_counter()
        found = gc.collect()
        ms = (time.perf_counter() - t0) * 1e3
        self._collected_at = time.monotonic()
        self.collections += 1
        self.last_collection_ms = ms
        self.longest_collection_ms = max(self.longest_collection_ms, ms)
        log.debug("gc: full collection in %.1f ms, %d unreachable", ms, found)

    def status(self) -> dict[str, Any]:
        return {
            "probe_period_ms": PROBE_PERIOD_S * 1e3,
            "worst_stall_ms": round(self.worst_ms, 2),
            "at_least_ms": {str(edge): n for edge, n in self.counts.items()},
            "stalls": [list(s) for s in self.stalls],  # [monotonic s, ms late], the last ones
            "gc": {
                "frozen": self.frozen,
                "threshold": list(gc.get_threshold()),
                "idle_collections": self.collections,
                "last_ms": round(self.last_collection_ms, 2),
                "longest_ms": round(self.longest_collection_ms, 2),
            },
        }
