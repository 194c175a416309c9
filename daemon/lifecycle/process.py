"""The process the daemon runs in: how much memory it may hold (``limits.max_rss_mb``, for kernels
without a memory cgroup), the debug wedge that blocks its event loop for watchdog drills, and how
it leaves (``exit_now``, without interpreter teardown). ``speakd-tools`` leaves the same way."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import NoReturn

from speakd.config import ConfigError
from speakd.lifecycle.notify import notify
from speakd.request.workers import SynthesisWorker

log = logging.getLogger(__name__)

DEBUG_WEDGE_ENV = "SPEAKD_DEBUG_WEDGE"  # seconds SIGUSR2 blocks the event loop (watchdog tests)
EXIT_GRACE_S = 1.0  # how long cancelled engine threads get to leave onnxruntime at exit
MEMORY_CHECK_S = 5.0  # how often limits.max_rss_mb is checked


async def memory_guard(limit_mb: Callable[[], int]) -> None:
    """limits.max_rss_mb: the in-process stand-in for MemoryMax= where the kernel has no memory
    cgroup. Returns once resident memory is over ``limit_mb()`` (read at every check: a reload
    may change it), having said so in the log and in STATUS=; the caller then stops."""
    if not _memory_cgroup_enabled():
        log.warning(
            "the kernel's memory cgroup is disabled: MemoryMax= is not enforced%s",
            "" if limit_mb() else "; set limits.max_rss_mb instead",
        )
    while True:
        await asyncio.sleep(MEMORY_CHECK_S)
        limit, rss = limit_mb(), _rss_mb()
        if limit and rss > limit:
            log.error(
                "resident memory %.0f MiB is over limits.max_rss_mb = %d: exiting to be restarted",
                rss,
                limit,
            )
            notify(f"STATUS=exiting: {rss:.0f} MiB resident, over limits.max_rss_mb {limit}")
            return


def install_debug_wedge(loop: asyncio.AbstractEventLoop) -> None:
    """With $SPEAKD_DEBUG_WEDGE=<seconds>, SIGUSR2 blocks the event loop that long (tests and
    drills: the watchdog pings must stop and systemd must restart the daemon). Off otherwise."""
    value = os.environ.get(DEBUG_WEDGE_ENV)
    if not value:
        return
    try:
        seconds = float(value)
    except ValueError:
        raise ConfigError(f"${DEBUG_WEDGE_ENV}: expected seconds, got {value!r}") from None
    log.warning("debug: SIGUSR2 blocks the event loop for %.1f s ($%s)", seconds, DEBUG_WEDGE_ENV)
    loop.add_signal_handler(signal.SIGUSR2, time.sleep, seconds)


def _rss_mb() -> float:
    with open("/proc/self/statm", encoding="ascii") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _memory_cgroup_enabled() -> bool:
    """False when the kernel runs with cgroup_disable=memory (/proc/cgroups: enabled 0)."""
    try:
        with open("/proc/cgroups", encoding="ascii") as f:
            rows = [line.split() for line in f if line.startswith("memory")]
    except OSError:
        return True  # cannot tell: do not warn
    return not rows or rows[0][-1] != "0"


def exit_now(code: int) -> NoReturn:
    """Leave without interpreter teardown once shutdown() has closed everything that holds outside
    state (sockets, SQLite, MQTT, the sink). What teardown would still do is free onnxruntime
    sessions and modules — about 1 s of a stop on a loaded 2-core board — and, under a cancelled
    synthesis that is still running, abort the process (SIGABRT, a failure to systemd).
    Cancelled synthesis threads get EXIT_GRACE_S first, so a cache write in flight completes (a
    synthesis worker is waited for while it runs one, ``speakd.request.workers``)."""
    deadline = time.monotonic() + EXIT_GRACE_S
    for thread in threading.enumerate():
        if thread.daemon and thread is not threading.current_thread():
            wait = thread.wait_idle if isinstance(thread, SynthesisWorker) else thread.join
            wait(max(0.0, deadline - time.monotonic()))
    busy = [t.name for t in threading.enumerate() if t.daemon and _busy(t)]
    if busy:
        log.warning("exiting without waiting for busy threads: %s", ", ".join(busy))
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _busy(thread: threading.Thread) -> bool:
    """Alive, and for a synthesis worker (alive while idle too) running a synthesis."""
    return thread.busy if isinstance(thread, SynthesisWorker) else thread.is_alive()
