"""The worst stall of a daemon's event loop during a run, from two reads of its status' ``loop``
(``speakd.lifecycle.loopcare``: a probe timer every 10 ms records how late it fires)."""

from __future__ import annotations

from typing import Any

STALL_MS = 5  # speakd.lifecycle.loopcare lists the stalls of at least this many ms


def during(
    before: dict[str, Any] | None, after: dict[str, Any] | None, start: float
) -> dict[str, Any] | None:
    """The run's own stalls between two ``status()["loop"]`` reads of one process, the first at
    ``start`` (``time.monotonic()``: the same clock in every process): how many of at least each
    bucket's ms, and the worst; None without a probe. When more stalls came than the status keeps,
    ``worst_ms`` is a lower bound and ``complete`` False (the buckets still bound it)."""
    if not before or not after:
        return None
    counts = {
        edge: n - before["at_least_ms"].get(edge, 0) for edge, n in after["at_least_ms"].items()
    }
    kept = [ms for t, ms in after["stalls"] if t >= start]
    listed = counts.get(str(int(STALL_MS)), 0)  # the bucket of the stalls the status lists
    above = [int(edge) for edge, n in counts.items() if n]
    return {  # worst None and complete: every stall was under STALL_MS
        "worst_ms": max(kept) if kept else None,
        "at_least_ms": counts,
        "largest_bucket_ms": max(above, default=0),
        "complete": len(kept) >= listed,
        "probe_period_ms": after["probe_period_ms"],
        "gc": after["gc"],
    }


def describe(d: dict[str, Any] | None) -> str:
    """One line: ``worst 3.1 ms (probe every 10 ms); ≥ 2 ms: 4, ≥ 5 ms: 0, …; full GC …``."""
    if d is None:
        return "no loop probe"
    if not d["complete"]:  # more stalls than the status lists: the buckets say how bad
        worst = f"≥ {max(d['worst_ms'] or 0, d['largest_bucket_ms']):.1f} ms"
    elif d["worst_ms"] is None:
        worst = f"< {STALL_MS} ms"
    else:
        worst = f"{d['worst_ms']:.1f} ms"
    buckets = ", ".join(f"≥ {k} ms: {n}" for k, n in d["at_least_ms"].items())
    gc = d["gc"]
    return (
        f"worst {worst} (probe every {d['probe_period_ms']:g} ms); {buckets}; full GC when "
        f"idle: {gc['idle_collections']} (longest {gc['longest_ms']} ms), {gc['frozen']} objects "
        "frozen at READY"
    )
