"""HTTP API bench: a cached ``POST /v1/audio/speech``, latency one at a time and under load.

    speakd-tools bench http [--requests 500] [--concurrency 8] [--seconds 10]
                            [--format wav] [--no-bandwidth] [--json]

A real ``python -m speakd serve`` (embedded voice, null sink, its cache in a temp dir, ``[http]``
on a loopback port; ``harness.daemon.serve``) gets one prompt once, so it is in the cache; then:

1. **sequential**: ``--requests`` requests one after another on one keep-alive connection;
   latency = send → the whole body read (``time.perf_counter``, client side);
2. **load**: ``--concurrency`` clients, each on its own keep-alive connection, request the prompt
   back to back for ``--seconds``: requests/s and the latency of each request meanwhile.

The client (aiohttp, one asyncio loop) runs on the same machine as the daemon and takes its share
of the cores: requests/s is what the machine serves with a client on it, not the daemon alone.
Prints a Markdown table (``--json``: the numbers) that starts with the machine line
(``machine.py``), bandwidth measured after the run unless ``--no-bandwidth``.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

from ..harness.daemon import free_port, serve, wait_for_port
from ..harness.machine import describe
from ..harness.machine import line as machine_line
from ..harness.stats import loadavg, peak_rss_mb, summary

PROMPT = "The front door is open."


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--requests", type=int, default=500, help="sequential requests (default 500)")
    p.add_argument("--concurrency", type=int, default=8, help="clients in the load phase")
    p.add_argument("--seconds", type=float, default=10.0, help="length of the load phase")
    p.add_argument("--format", default="wav", help="response_format (default wav)")
    p.add_argument("--no-bandwidth", action="store_true", help="skip the DRAM bandwidth probe")
    p.add_argument("--json", action="store_true", help="print the numbers as JSON")


async def _request(session: Any, url: str, body: dict[str, Any]) -> float:
    """One speech request: seconds from send to the whole body read."""
    t0 = time.perf_counter()
    async with session.post(url, json=body) as r:
        data = await r.read()
        if r.status != 200 or r.headers.get("X-Speakd-Cache") != "hit":
            raise RuntimeError(f"{r.status} {r.headers.get('X-Speakd-Cache')}: {data[:200]!r}")
    return time.perf_counter() - t0


async def _measure(url: str, body: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    import aiohttp

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        async with session.post(url, json=body) as r:  # the miss that fills the cache
            size = len(await r.read())
        sequential = [await _request(session, url, body) for _ in range(args.requests)]

        load: list[float] = []
        deadline = time.perf_counter() + args.seconds

        async def client() -> None:
            while time.perf_counter() < deadline:
                load.append(await _request(session, url, body))

        t0 = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(args.concurrency)))
        elapsed = time.perf_counter() - t0
    return {
        "body_bytes": size,
        "sequential_ms": _ms(sequential),
        "load": {
            "concurrency": args.concurrency,
            "seconds": round(elapsed, 2),
            "requests": len(load),
            "requests_per_s": round(len(load) / elapsed, 1),
            "latency_ms": _ms(load),
        },
    }


def _ms(seconds: list[float]) -> dict[str, float]:
    return summary([s * 1000 for s in seconds])


def measure(args: argparse.Namespace) -> dict[str, Any]:
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="speakd-bench-http-") as tmp:
        extra = f'\n[http]\nlisten = "127.0.0.1:{port}"\n[limits]\nmax_streams = 64\n'
        proc, _sock = serve(Path(tmp), extra=extra)
        try:
            wait_for_port(port)
            url = f"http://127.0.0.1:{port}/v1/audio/speech"
            body = {
                "model": "tts-1",
                "input": PROMPT,
                "voice": "alloy",
                "response_format": args.format,
            }
            result = asyncio.run(_measure(url, body, args))
            result["daemon_peak_rss_mb"] = peak_rss_mb(proc.pid)
        finally:
            proc.terminate()
            proc.wait(30)
    result.update(format=args.format, loadavg=loadavg(), machine=describe(not args.no_bandwidth))
    return result


def table(result: dict[str, Any]) -> str:
    seq, load = result["sequential_ms"], result["load"]
    lat = load["latency_ms"]
    return "\n".join(
        [
            machine_line(result["machine"]),
            "",
            f"Cached `POST /v1/audio/speech` ({result['format']}, {result['body_bytes']} bytes), "
            f"load average {result['loadavg']}, daemon peak RSS {result['daemon_peak_rss_mb']} MB:",
            "",
            "| phase | requests | p50 ms | p90 ms | p99 ms | max ms | requests/s |",
            "|---|---:|---:|---:|---:|---:|---:|",
            f"| sequential, 1 client | {seq['n']} | {seq['p50']} | {seq['p90']} | {seq['p99']} "
            f"| {seq['max']} | {round(1000 / seq['mean'], 1)} |",
            f"| {load['concurrency']} clients, {load['seconds']} s | {lat['n']} | {lat['p50']} "
            f"| {lat['p90']} | {lat['p99']} | {lat['max']} | {load['requests_per_s']} |",
        ]
    )
