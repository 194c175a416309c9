"""Synthesis runs nicer than the rest of the daemon, so the event loop and playback preempt it.

On 2 cores onnxruntime's pool keeps both cores busy (spinning) for the whole of a run, and the
event loop (a key's echo, CANCEL, ``701 BEGIN``) and the play worker's sink writes wait for the
kernel to take a core back from it: the loop-lag probe (``speakd.lifecycle.loopcare``) saw 21–35
stalls of 5–20 ms in each navigation run of ``bench screenreader``, 6–17 with synthesis lowered
(docs/benchmarks.md, "New text"). On Linux a nice value belongs to one thread and a new thread
starts with its creator's, so the threads that run syntheses lower themselves
(:func:`lower_this_thread`), and an engine is built on a lowered thread (:func:`run_lowered`):
the onnxruntime pools it creates start lowered too, whatever thread loads it.

Synthesis is never lowered below ``BOARD_NICE``, the priority the board's other programs run at:
a screen reader's speech must not slow down against a busy browser because of this. So the
lowering uses what the daemon was started with above it: the systemd unit's ``Nice=-5`` gives
the loop and playback -5 and synthesis 0, as before; a daemon started at 0 (a user unit, the
image) keeps all its threads at 0. Raising one's own nice needs no privilege. Where the OS refuses
(another kernel, a seccomp filter) synthesis runs as before; the refusal is logged once and
counted in the status (``engine.nice``).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from typing import Any, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")
MAX_NICE = 19
BOARD_NICE = 0  # the board's other programs: synthesis never goes below them

_refused = 0


def base_nice() -> int:
    """The process's nice value: its main thread's (a thread's id is the process id there)."""
    return os.getpriority(os.PRIO_PROCESS, os.getpid())


def synthesis_nice(by: int) -> int:
    """The nice value synthesis runs at: ``by`` above the process's, but not above
    ``BOARD_NICE`` unless the process already is."""
    base = base_nice()
    return min(MAX_NICE, base + by, max(base, BOARD_NICE))


def lower_this_thread(by: int) -> bool:
    """Give the calling thread :func:`synthesis_nice`; False when the OS refused. A thread
    already that nice or nicer is left as it is (lowering it back needs a privilege)."""
    global _refused
    if by <= 0:
        return True
    try:
        tid = threading.get_native_id()
        target = synthesis_nice(by)
        if os.getpriority(os.PRIO_PROCESS, tid) < target:
            os.setpriority(os.PRIO_PROCESS, tid, target)
        return True
    except (OSError, AttributeError) as e:  # AttributeError: no getpriority (not POSIX)
        _refused += 1
        if _refused == 1:
            log.warning("synthesis threads keep the daemon's priority: %s (engine.nice)", e)
        return False


def run_lowered(fn: Callable[[], T], by: int) -> T:
    """``fn()`` on a new thread ``by`` nicer than the process: the threads it starts (an
    onnxruntime session's pool) inherit that. Its exception is raised here."""
    if by <= 0:
        return fn()
    out: list[Any] = []

    def run() -> None:
        lower_this_thread(by)
        try:
            out.append((True, fn()))
        except BaseException as e:  # handed to the caller, as if fn had run on its thread
            out.append((False, e))

    thread = threading.Thread(target=run, name="speakd-load", daemon=True)
    thread.start()
    thread.join()
    ok, value = out[0]
    if not ok:
        raise value
    return value  # type: ignore[no-any-return]


def status(by: int) -> dict[str, int]:
    """For the daemon's status: ``engine.nice``, the nice values of the daemon and of its
    synthesis, and how often the OS refused."""
    try:
        daemon, synthesis = base_nice(), synthesis_nice(by)
    except (OSError, AttributeError):
        daemon = synthesis = 0
    return {"by": by, "daemon": daemon, "synthesis": synthesis, "refused": _refused}
