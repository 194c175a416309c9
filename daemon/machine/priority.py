"""Synthesis runs nicer than the rest of the daemon, so the event loop and playback preempt it.

On 2 cores onnxruntime's pool keeps both cores busy (spinning) for the whole of a run, and the
event loop (a key's echo, CANCEL, ``701 BEGIN``) and the play worker's sink writes wait for the
kernel to take a core back from it: the loop-lag probe (``speakd.lifecycle.loopcare``) saw 21–40
stalls of 5–20 ms in each navigation run of ``bench screenreader``, 6 with synthesis lowered
(docs/benchmarks.md, "New text"). On Linux a nice value belongs to one thread and a new thread
starts with its creator's, so the threads that run syntheses lower themselves
(:func:`lower_this_thread`), and an engine is built on a lowered thread (:func:`run_lowered`):
the onnxruntime pools it creates start lowered too, whatever thread loads it.

Raising one's own nice needs no privilege. The systemd unit starts the daemon at ``Nice=-5``, so
with the default ``engine.nice = 5`` the engine's threads run at 0, beside the board's other work
as before, and only the daemon's own short-lived threads move ahead. Where the OS refuses (another
kernel, a seccomp filter) synthesis runs as before; the refusal is logged once and counted in the
status (``engine.nice``).
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

_refused = 0


def base_nice() -> int:
    """The process's nice value: its main thread's (a thread's id is the process id there)."""
    return os.getpriority(os.PRIO_PROCESS, os.getpid())


def lower_this_thread(by: int) -> bool:
    """Make the calling thread ``by`` nicer than the process; False when the OS refused. A
    thread already that nice or nicer is left as it is (lowering it back needs a privilege)."""
    global _refused
    if by <= 0:
        return True
    try:
        tid = threading.get_native_id()
        target = min(MAX_NICE, base_nice() + by)
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
    """For the daemon's status: how much nicer synthesis is asked to run, and refusals."""
    return {"by": by, "refused": _refused}
