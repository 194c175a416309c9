"""Cache bench: precompute throughput, and `say` of a cached clip → first sample at the sink.

    speakd-tools bench cache [--prompts 24] [--jobs 1,2] [--says 200] [--misses 5]
                             [--bundle PATH] [--pack PACK] [--json]

1. ``precompute`` of N short device prompts into a fresh pack, once per ``--jobs`` value
   (clips/s = synthesised clips / synthesis wall time; engine load time excluded and reported).
2. The pack is imported into a fresh cache and a real ``python -m speakd serve`` is started
   (null sink, not paced), then ``--says`` JSON-socket ``say`` requests of cached prompts are sent
   one after another. Two latencies per request:
   - server: the ``started`` event's ``latency_ms`` — from the daemon receiving the request to
     the sink having been opened, immediately before its first write (the scheduler's clock);
   - client: send of the ``say`` line → ``started`` event read back (an upper bound: it adds the
     socket round trip and the client's JSON parsing).
3. For contrast, ``--misses`` requests of texts that are not cached (synthesised by the engine).

Timings are wall-clock on whatever else the machine runs; the report says p50/p99/max.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

from ..harness.daemon import serve
from ..harness.stats import summary

PROMPTS = [
    "The front door is open.",
    "The back door is open.",
    "Battery low.",
    "Battery fully charged.",
    "Timer finished.",
    "Your laundry is done.",
    "Motion detected in the garden.",
    "The garage door is closing.",
    "Good morning.",
    "Good night.",
    "Wi-Fi connection lost.",
    "Connection restored.",
    "The kettle has boiled.",
    "Someone is at the door.",
    "The window in the kitchen is open.",
    "Rain is expected this afternoon.",
    "The freezer temperature is too high.",
    "Water leak detected under the sink.",
    "Smoke alarm test successful.",
    "The alarm is armed.",
    "The alarm is disarmed.",
    "Update installed, restarting now.",
    "The dishwasher has finished.",
    "Please close the fridge door.",
]


def bench_precompute(
    prompts: list[str], bundle: Path | None, jobs: int, out: Path, threads: int
) -> dict[str, Any]:
    import functools

    from speakd.engines import load_engine
    from speakd.library.synth import engine_config_for
    from speakd_tools.precompute import Prompt, precompute

    factory = functools.partial(load_engine, engine_config_for(bundle, max(1, threads // jobs)))
    report = precompute([Prompt(p) for p in prompts], out, factory, jobs=jobs, progress=False)
    return {
        "jobs": jobs,
        "threads_per_job": max(1, threads // jobs),
        "clips": report.synthesized,
        "audio_s": round(report.audio_s, 2),
        "synth_s": round(report.synth_s, 2),
        "clips_per_s": round(report.clips_per_s, 2),
        "realtime_factor": round(report.audio_s / report.synth_s, 2) if report.synth_s else None,
        "load_and_keys_s": round(report.wall_s - report.synth_s, 2),
    }


def _say(sock: str, text: str, rid: str) -> tuple[float, float]:
    """(server latency_ms, client send → started ms) for one request."""
    from speakd.library.client import Client

    with Client(sock, timeout=120) as c:
        t0 = time.perf_counter()
        for event in c.say({"text": text, "id": rid, "priority": "message"}, wait=True):
            if event["event"] == "started":
                client_ms = (time.perf_counter() - t0) * 1000
                server_ms = float(event["latency_ms"])
            if event["event"] == "error":
                raise RuntimeError(f"{rid}: {event}")
    return server_ms, client_ms


def measure(args: argparse.Namespace) -> dict[str, Any]:
    from speakd.cache.packs import import_pack
    from speakd.cache.store import CacheStore
    from speakd.library.client import Client

    prompts = PROMPTS[: args.prompts]
    result: dict[str, Any] = {"precompute": []}
    with tempfile.TemporaryDirectory(prefix="speakd-bench-cache-") as tmp:
        work = Path(tmp)
        for jobs in [] if args.pack else args.jobs:  # a fresh pack each time
            out = work / f"pack-{jobs}.db"
            result["precompute"].append(
                bench_precompute(prompts, args.bundle, jobs, out, args.threads)
            )
        with CacheStore(work / "cache.db") as store:
            import_pack(store, args.pack or work / f"pack-{args.jobs[0]}.db")
            if args.pack:
                prompts = [row["text"] for row in store.listing(pinned_only=True)]
        proc, sock = serve(work, f'bundle = "{args.bundle}"\n' if args.bundle else "")
        try:
            for i, text in enumerate(prompts[:3]):  # warm-up: first connection, first block
                _say(sock, text, f"warm{i}")
            hits = [_say(sock, prompts[i % len(prompts)], f"hit{i}") for i in range(args.says)]
            miss = [
                _say(sock, f"Uncached sentence number {i}.", f"miss{i}") for i in range(args.misses)
            ]
            with Client(sock) as c:
                cache = c.request({"op": "status"})["source"]["cache"]
        finally:
            proc.terminate()
            proc.wait(30)
    result["hit_server_ms"] = summary([s for s, _ in hits])
    result["hit_client_ms"] = summary([c for _, c in hits])
    if miss:
        result["miss_server_ms"] = summary([s for s, _ in miss])
    result["daemon_cache_counters"] = {
        k: cache[k] for k in ("hits", "hits_ram", "misses", "synth", "prewarmed")
    }
    return result


def table(result: dict[str, Any]) -> str:
    lines = ["precompute (embedded VITS unless --bundle):"] if result["precompute"] else []
    for r in result["precompute"]:
        lines.append(
            f"  jobs={r['jobs']} threads/job={r['threads_per_job']}: {r['clips']} clips, "
            f"{r['audio_s']} s audio in {r['synth_s']} s → {r['clips_per_s']} clips/s, "
            f"{r['realtime_factor']}x realtime (load+keys {r['load_and_keys_s']} s)"
        )
    for name, label in [
        ("hit_server_ms", "cached say, server (receipt → sink first write)"),
        ("hit_client_ms", "cached say, client (send → started event)"),
        ("miss_server_ms", "uncached say, server (receipt → sink first write)"),
    ]:
        if name in result:
            s = result[name]
            lines.append(
                f"{label}: p50 {s['p50']} ms, p99 {s['p99']} ms, max {s['max']} ms (n={s['n']})"
            )
    lines.append(f"daemon counters: {result['daemon_cache_counters']}")
    return "\n".join(lines)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--prompts", type=int, default=len(PROMPTS), help="how many prompts (max 24)")
    p.add_argument(
        "--jobs",
        type=lambda s: [int(x) for x in s.split(",")],
        default=[1, 2],
        help="precompute worker counts to try, e.g. 1,2",
    )
    p.add_argument("--threads", type=int, default=2, help="onnxruntime threads in total")
    p.add_argument("--says", type=int, default=200, help="cached say requests")
    p.add_argument("--misses", type=int, default=5, help="uncached say requests")
    p.add_argument("--bundle", type=Path, default=None, help="model bundle (default: embedded)")
    p.add_argument(
        "--pack", type=Path, default=None, help="use this pack (made with --bundle), skip step 1"
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
