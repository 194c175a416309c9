"""The page open on a large cache: a cached hit's latency with and without the page's listing.

    speakd-tools bench page [--clips 20000] [--clip-s 1.0] [--rounds 3] [--seconds 20]
                            [--rate 20] [--interval 3] [--no-bandwidth] [--json]

A real ``python -m speakd serve`` (embedded voice, null sink, ``[http]`` on a loopback port; its
cache in a temp dir, ``harness.daemon.serve``) and a real cache of ``--clips`` clips of ``--clip-s``
seconds each: ``--hit-texts`` of them are the keys the daemon gives prompts (its ``explain``), the
rest filler with their own keys, all unpinned (so a hit is read from the file, not from RAM) and
last used at random over the past week (the page lists them in that order). They are written by this
process through its own ``CacheStore`` on the same file, as ``speakd cache import`` would.

Then ``--rounds`` rounds of two phases of ``--seconds`` each (alternating, so a change in the shared
machine's load falls on both alike; each phase's hits pooled over the rounds), the same open-loop
load in both: a cached
``POST /v1/audio/speech`` (wav) every ``1/--rate`` s, each on its own schedule (latency = the
scheduled send → the whole body read, so a stalled request does not hide the ones behind it):

1. **page closed**: the hits alone;
2. **page open**: the hits while a client asks ``GET /v1/cache/clips`` every ``--interval`` s, as
   the page does while it is open (its listing's own time is reported too).

Prints both p99s and their ratio (the target: page open within 1.2× of page closed) under the
machine line (``machine.py``); ``--json``: the numbers.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import tempfile
import time
from pathlib import Path
from typing import Any

from ..harness.daemon import free_port, serve, wait_for_port
from ..harness.machine import describe
from ..harness.machine import line as machine_line
from ..harness.stats import loadavg, summary

RATE = 22050  # the embedded voice's
WEEK_S = 7 * 86400


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--clips", type=int, default=20_000, help="clips in the cache (default 20000)")
    p.add_argument("--clip-s", type=float, default=1.0, help="seconds of audio per clip")
    p.add_argument("--hit-texts", type=int, default=200, help="distinct prompts the hits ask for")
    p.add_argument("--rounds", type=int, default=3, help="rounds of page closed, page open")
    p.add_argument("--seconds", type=float, default=20.0, help="length of each phase")
    p.add_argument("--rate", type=float, default=20.0, help="cached requests per second")
    p.add_argument("--interval", type=float, default=3.0, help="the page's refresh, seconds")
    p.add_argument("--no-bandwidth", action="store_true", help="skip the DRAM bandwidth probe")
    p.add_argument("--json", action="store_true", help="print the numbers as JSON")


def fill(work: Path, sock: str, args: argparse.Namespace) -> list[str]:
    """The cache's clips written beside the running daemon; returns the texts it will hit."""
    from speakd.cache.store import CacheStore, Clip
    from speakd.library.client import Client

    texts = [f"Cached prompt number {i}, read from the file." for i in range(args.hit_texts)]
    with Client(sock, timeout=60) as c:
        keys = [c.request({"op": "explain", "text": t})["key"] for t in texts]
    rng = random.Random(53)
    audio = os.urandom(int(args.clip_s * RATE) * 2)
    now = time.time()
    named = list(zip(keys, texts, strict=True))
    filler = [(f"{i:064x}", f"Filler clip {i}.") for i in range(args.clips - len(named))]
    with CacheStore(work / "cache.db", max_bytes=1 << 40, ttl_s=0) as store:
        rows = named + filler
        for start in range(0, len(rows), 500):
            store.put_many(
                [
                    Clip(
                        key=key,
                        text=text,
                        voice="bench",
                        params={},
                        bundle="bench",
                        sample_rate=RATE,
                        audio=audio,
                        last_used=now - rng.uniform(0, WEEK_S),
                    )
                    for key, text in rows[start : start + 500]
                ]
            )
        assert store.stats()["clips"] >= args.clips
    return texts


async def _phase(
    base: str, texts: list[str], args: argparse.Namespace, page: bool
) -> tuple[list[float], list[float]]:
    """Seconds of each hit (scheduled send → body read) and of each listing, for one phase."""
    import aiohttp

    hits: list[float] = []
    listings: list[float] = []
    n = int(args.seconds * args.rate)

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:

        async def hit(i: int, due: float) -> None:
            await asyncio.sleep(max(0.0, due - time.perf_counter()))
            body = {"input": texts[i % len(texts)], "response_format": "wav"}
            async with session.post(base + "/v1/audio/speech", json=body) as r:
                data = await r.read()
                if r.status != 200 or r.headers.get("X-Speakd-Cache") != "hit":
                    raise RuntimeError(
                        f"{r.status} {r.headers.get('X-Speakd-Cache')}: {data[:200]!r}"
                    )
            hits.append(time.perf_counter() - due)

        async def open_page(until: float) -> None:
            while time.perf_counter() < until:
                t0 = time.perf_counter()
                async with session.get(base + "/v1/cache/clips") as r:
                    assert r.status == 200, await r.text()
                    await r.read()
                listings.append(time.perf_counter() - t0)
                await asyncio.sleep(max(0.0, args.interval - (time.perf_counter() - t0)))

        t0 = time.perf_counter() + 0.5
        tasks = [hit(i, t0 + i / args.rate) for i in range(n)]
        if page:
            tasks.append(open_page(t0 + args.seconds))
        await asyncio.gather(*tasks)
    return hits, listings


def _ms(seconds: list[float]) -> dict[str, float]:
    return summary([s * 1000 for s in seconds])


def measure(args: argparse.Namespace) -> dict[str, Any]:
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="speakd-bench-page-") as tmp:
        work = Path(tmp)
        extra = f'max_bytes = {1 << 40}\n\n[http]\nlisten = "127.0.0.1:{port}"\n'
        proc, sock = serve(work, extra=extra)
        try:
            wait_for_port(port)
            t0 = time.perf_counter()
            texts = fill(work, sock, args)
            fill_s = time.perf_counter() - t0
            base = f"http://127.0.0.1:{port}"
            closed: list[float] = []
            opened: list[float] = []
            listings: list[float] = []
            for _ in range(args.rounds):
                closed += asyncio.run(_phase(base, texts, args, page=False))[0]
                hits, listed = asyncio.run(_phase(base, texts, args, page=True))
                opened += hits
                listings += listed
        finally:
            proc.terminate()
            proc.wait(30)
    return {
        "clips": args.clips,
        "clip_s": args.clip_s,
        "fill_s": round(fill_s, 1),
        "rate": args.rate,
        "interval_s": args.interval,
        "rounds": args.rounds,
        "seconds": args.seconds,
        "page_closed": {"hit_ms": _ms(closed)},
        "page_open": {"hit_ms": _ms(opened), "listing_ms": _ms(listings)},
        "p99_ratio": round(_ms(opened)["p99"] / _ms(closed)["p99"], 2),
        "loadavg": loadavg(),
        "machine": describe(not args.no_bandwidth),
    }


def table(result: dict[str, Any]) -> str:
    closed, opened = result["page_closed"]["hit_ms"], result["page_open"]["hit_ms"]
    listing = result["page_open"]["listing_ms"]
    return "\n".join(
        [
            machine_line(result["machine"]),
            "",
            f"A cached `POST /v1/audio/speech` (wav, read from the file) {result['rate']}/s, "
            f"{result['rounds']} rounds of {result['seconds']} s page closed then open; "
            f"cache of {result['clips']} clips of {result['clip_s']} s (filled in "
            f"{result['fill_s']} s), load average {result['loadavg']}:",
            "",
            "| page | hits | p50 ms | p99 ms | max ms |",
            "|---|---:|---:|---:|---:|",
            f"| closed | {closed['n']} | {closed['p50']} | {closed['p99']} | {closed['max']} |",
            f"| open, listing every {result['interval_s']} s | {opened['n']} | {opened['p50']} "
            f"| {opened['p99']} | {opened['max']} |",
            "",
            f"p99 page open / page closed: **{result['p99_ratio']}×** (target ≤ 1.2×); "
            f"the listing itself: p50 {listing['p50']} ms, max {listing['max']} ms "
            f"(n={listing['n']}).",
        ]
    )
