"""Does a hostile client grow the daemon? RSS of a real daemon while every request over the JSON
socket carries a pitch, a speed and a volume no request sent before.

    speakd-tools bench values [--requests 10000] [--warmup 100] [--seed 1] [--json]

A real ``python -m speakd serve`` on a null sink (not paced), the embedded Piper voice. Each
request is a ``say`` with ``wait`` of one short sentence, with a pitch drawn uniformly from the
whole range a request may ask (±12 semitones: resampled by the voice up to ±6, Rubber Band
beyond), a speed from 0.5–2 and a volume from 0–2, unrounded floats, so each is a new audio key,
a new resampling step and a new gain. Whatever the daemon keeps per distinct value (a resampling
kernel was 65 KB a pitch) shows as growth from the RSS after ``--warmup`` requests (the voice,
Rubber Band and the arenas loaded) to the end; issue 53 bounds it at 16 MB. RSS is read as
``bench memory`` reads it (idle, the lowest of a few reads).
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from ..harness.daemon import serve
from ..harness.machine import describe
from ..harness.machine import line as machine_line
from ..harness.stats import loadavg
from .memory import memory, settled

TEXT = "Hello there."
PITCH = (-12.0, 12.0)  # speakd.audio.pitch.PITCH_RANGE
SPEED = (0.5, 2.0)
VOLUME = (0.0, 2.0)


def fields(rng: random.Random) -> dict[str, float]:
    """One request's pitch, speed and volume: floats no request is likely to have sent."""
    return {
        "pitch": rng.uniform(*PITCH),
        "speed": rng.uniform(*SPEED),
        "volume": rng.uniform(*VOLUME),
    }


def drive(sock: str, pid: int, requests: int, warmup: int, seed: int) -> dict[str, Any]:
    """Send ``warmup`` then ``requests`` says on one connection; RSS after each part."""
    from speakd.library.client import Client

    rng = random.Random(seed)
    outcomes: Counter[str] = Counter()
    points: dict[str, Any] = {}
    t0 = time.monotonic()
    with Client(sock, timeout=600) as c:
        for n in range(warmup + requests):
            if n == warmup:
                points["warmup"] = {"requests": n, **settled(pid)}
                t0 = time.monotonic()
            for event in c.say({"text": TEXT, **fields(rng)}, wait=True):
                if event["event"] in ("finished", "error"):
                    outcomes[event.get("status") or event.get("code") or event["event"]] += 1
    points["seconds"] = round(time.monotonic() - t0, 1)
    points["end"] = {"requests": warmup + requests, **settled(pid)}
    return {**points, "outcomes": dict(outcomes)}


def measure(args: argparse.Namespace) -> dict[str, Any]:
    result: dict[str, Any] = {"requests": args.requests, "warmup": args.warmup}
    result["loadavg_start"] = loadavg()
    with tempfile.TemporaryDirectory(prefix="bench-values-") as tmp:
        # a loaded machine must not trip the hang timer or the speed limit (then the breaker)
        proc, sock = serve(Path(tmp), "hang_timeout_s = 600\nmax_rtf = 1000\n")
        try:
            result["ready"] = memory(proc.pid)
            result.update(drive(sock, proc.pid, args.requests, args.warmup, args.seed))
        finally:
            proc.terminate()
            proc.wait(60)
    result["growth_mb"] = round(result["end"]["rss_mb"] - result["warmup"]["rss_mb"], 1)
    result["loadavg_end"] = loadavg()
    result["machine"] = describe(bandwidth=False)
    return result


def table(r: dict[str, Any]) -> str:
    lines = [
        machine_line(r["machine"]),
        "",
        "| point | requests | RSS MB | anon MB | file MB | peak MB |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, key in (("READY", "ready"), ("after warm-up", "warmup"), ("end", "end")):
        p = r[key]
        lines.append(
            f"| {name} | {p.get('requests', 0)} | {p['rss_mb']} | {p['anon_mb']} | "
            f"{p['file_mb']} | {p['peak_mb']} |"
        )
    outcomes = ", ".join(f"{k} {v}" for k, v in sorted(r["outcomes"].items()))
    lines += [
        "",
        f"Growth after warm-up: {r['growth_mb']} MB over {r['requests']} requests, each a new "
        f"pitch, speed and volume ({r['seconds']} s). Outcomes: {outcomes}. Load average "
        f"{r['loadavg_start']} → {r['loadavg_end']}.",
    ]
    return "\n".join(lines)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--requests", type=int, default=10_000, help="requests after the warm-up")
    p.add_argument("--warmup", type=int, default=100, help="requests before the first RSS")
    p.add_argument("--seed", type=int, default=1, help="the values' random seed")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
