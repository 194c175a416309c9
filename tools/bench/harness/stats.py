"""What every benchmark shares: percentiles, a call's median time, the load average, and peak
memory measured right.

Peak memory is each process's own ``VmHWM`` (``/proc/<pid>/status``), never ``ru_maxrss``:
``RUSAGE_CHILDREN`` is the largest of all children ever waited for, and Linux carries a parent's
high-water mark over fork + exec into the child's ``RUSAGE_SELF``, so a child that measures itself
with ``ru_maxrss`` reports at least its parent's peak. A benchmark that wants a contender's own
peak runs it with ``in_child``: a fresh interpreter that prints its result, peak included, as the
last line of its output.
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

QUANTILES = (50, 90, 99)


def percentile(values: list[float], q: float) -> float:
    """The ``q``-th percentile by nearest rank: a value that was measured, never interpolated."""
    if not values:
        raise ValueError("percentile of no values")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def summary(values: list[float], digits: int = 3) -> dict[str, float]:
    """n, p50, p90, p99, max and mean of latencies (the unit is the caller's, named in its key)."""
    return {
        "n": len(values),
        **{f"p{q}": round(percentile(values, q), digits) for q in QUANTILES},
        "max": round(max(values), digits),
        "mean": round(statistics.fmean(values), digits),
    }


def median_s(call: Callable[[], object], runs: int, warmup: int = 5) -> float:
    """Seconds of ``call``'s median run, after ``warmup`` untimed runs (first-run allocations,
    thread pools waking)."""
    for _ in range(warmup):
        call()
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def loadavg() -> list[float]:
    """The 1/5/15-minute load average, recorded with every phase: the machines are shared."""
    return [round(x, 2) for x in os.getloadavg()]


def status(pid: int | str) -> dict[str, float]:
    """The numeric fields of ``/proc/<pid>/status`` (``VmRSS`` in kB, ``Threads``…), read once."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        with contextlib.suppress(ValueError, IndexError):
            fields[key] = float(value.split()[0])
    return fields


def status_kb(pid: int | str, key: str) -> float:
    """A ``kB`` field of ``/proc/<pid>/status`` (``VmHWM``, ``VmRSS``…); NaN when absent."""
    return status(pid).get(key, float("nan"))


def peak_rss_mb(pid: int | str = "self") -> float:
    """Peak resident memory of one process (``VmHWM``), in MB. Read it from the process itself
    before it exits, or from its parent while it runs: the kernel forgets it at exit."""
    return round(status_kb(pid, "VmHWM") / 1024, 1)


def in_child(argv: list[str], timeout: float | None = None) -> dict[str, Any]:
    """Run ``speakd-tools bench ARGV`` in a fresh interpreter and return the JSON object its last
    output line holds: a contender alone in its process, so its peak memory is its own."""
    cmd = [sys.executable, "-m", "speakd_tools.cli", "bench", *argv]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[:2])} failed ({p.returncode}): {p.stderr[-3000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])
