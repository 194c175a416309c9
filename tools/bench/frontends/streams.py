"""The daemon under N concurrent audio-returning streams of distinct, uncached texts.

    speakd-tools bench streams --bundle BUNDLE [--streams 8] [--steps 520] [--batch-size 8]
        [--max-streams 8] [--threads 2]

A real ``speakd serve`` (null sink, its own cache) with Wyoming, HTTP and the JSON socket on;
streams take turns by kind (Wyoming ``synthesize``, HTTP ``POST /v1/audio/speech`` as WAV, socket
``synth``), each a sentence no one asked before (identical texts would share one synthesis). The
bundle is used through a copy of its folder whose manifest fixes every sentence at ``--steps``
decode steps (``min_new_token = max_new_token``: random weights never end a sentence), so each
stream carries the same audio length whatever its front-end.

First, one stream of each kind alone (its first audio alone); then all N at once. Per stream:
first audio (request sent → first audio byte), and what a listener starting at its first sample
hears (``engine.playback``: total gap, the earliest gapless start); then the aggregate audio
seconds per wall second and the daemon's peak RSS (VmHWM). Random weights: speed, not voice.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from ..engine.engine import playback
from ..harness.daemon import free_port, serve
from ..harness.machine import describe, line
from ..harness.stats import loadavg, peak_rss_mb, status_kb
from .wyoming import new_sentence

KINDS = ("wyoming", "http", "socket")
RATE, WIDTH = 24000, 2


def bench_bundle(src: Path, dst: Path, steps: int) -> Path:
    """``dst``: links to ``src``'s files, manifest defaults at exactly ``steps`` steps."""
    dst.mkdir()
    for f in src.iterdir():
        if f.is_file() and f.name != "manifest.json":
            (dst / f.name).symlink_to(f.resolve())
    manifest = json.loads((src / "manifest.json").read_text())
    manifest["defaults"] |= {"max_new_token": steps, "min_new_token": steps}
    (dst / "manifest.json").write_text(json.dumps(manifest))
    return dst


async def _wyoming(port: int, text: str, t0: float, got: list[tuple[float, float]]) -> None:
    from wyoming.audio import AudioChunk
    from wyoming.client import AsyncTcpClient
    from wyoming.tts import Synthesize

    async with AsyncTcpClient("127.0.0.1", port, read_timeout=600) as client:
        await client.write_event(Synthesize(text).event())
        while (event := await client.read_event()) is not None:
            if AudioChunk.is_type(event.type):
                chunk = AudioChunk.from_event(event)
                got.append((time.perf_counter() - t0, len(chunk.audio) / (chunk.rate * 2)))
            elif event.type in ("audio-stop", "error"):
                break


async def _http(port: int, text: str, t0: float, got: list[tuple[float, float]]) -> None:
    import aiohttp

    body = {"model": "tts-1", "input": text, "voice": "default", "response_format": "pcm"}
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        url = f"http://127.0.0.1:{port}/v1/audio/speech"
        async with session.post(url, json=body) as r:
            if r.status != 200:
                raise RuntimeError(f"HTTP {r.status}: {(await r.read())[:200]!r}")
            async for data in r.content.iter_any():
                got.append((time.perf_counter() - t0, len(data) / (RATE * WIDTH)))


def _socket(sock: str, text: str, t0: float, got: list[tuple[float, float]]) -> None:
    from speakd.library.client import Client

    with Client(sock, timeout=600) as c:
        c.send({"op": "synth", "text": text})
        for event in c.events():
            if event["event"] == "audio":
                n = len(base64.b64decode(event["data"]))
                got.append((time.perf_counter() - t0, n / (event["format"]["rate"] * WIDTH)))
            elif event["event"] in ("finished", "error"):
                if event["event"] == "error":
                    raise RuntimeError(f"synth: {event}")
                break


async def stream(kind: str, ports: dict[str, Any], text: str) -> dict[str, Any]:
    got: list[tuple[float, float]] = []
    t0 = time.perf_counter()
    if kind == "wyoming":
        await _wyoming(ports["wyoming"], text, t0, got)
    elif kind == "http":
        await _http(ports["http"], text, t0, got)
    else:
        await asyncio.to_thread(_socket, ports["socket"], text, t0, got)
    if not got:
        raise RuntimeError(f"{kind}: no audio for {text!r}")
    heard = playback(got)
    return {
        "kind": kind,
        "first_audio_s": round(got[0][0], 3),
        "last_audio_s": round(got[-1][0], 3),
        "audio_s": round(sum(s for _, s in got), 2),
        "stall_s": round(heard["stall_s"], 3),
        "gapless_first_audio_s": round(heard["gapless_first_audio_s"], 3),
        "chunks": len(got),
    }


async def _run(ports: dict[str, Any], n: int, salt: int) -> dict[str, Any]:
    await stream("socket", ports, new_sentence(salt + 99))  # first-run allocations out of it
    alone = {}
    for i, kind in enumerate(KINDS):  # each kind alone, one after the other
        alone[kind] = await stream(kind, ports, new_sentence(salt + i))
    t0 = time.perf_counter()
    together = await asyncio.gather(
        *(stream(KINDS[i % 3], ports, new_sentence(salt + 100 + i)) for i in range(n))
    )
    wall = time.perf_counter() - t0
    for s in together:
        s["vs_alone"] = round(s["first_audio_s"] / alone[s["kind"]]["first_audio_s"], 2)
    return {
        "alone": alone,
        "together": list(together),
        "wall_s": round(wall, 2),
        "audio_s_per_s": round(sum(s["audio_s"] for s in together) / wall, 2),
    }


def measure(args: argparse.Namespace) -> dict[str, Any]:
    machine = describe(threads=args.threads)
    with tempfile.TemporaryDirectory(prefix="speakd-bench-streams-") as tmp:
        work = Path(tmp)
        bundle = bench_bundle(args.bundle.resolve(), work / args.bundle.name, args.steps)
        wy, http = free_port(), free_port()
        engine = (
            f'kind = "chattts"\nbundle = "{bundle}"\nthreads = {args.threads}\n'
            f'precision = "exact"\nbatch_size = {args.batch_size}\n'
        )
        extra = (
            f'\n[wyoming]\nuri = "tcp://127.0.0.1:{wy}"\n'
            f'\n[http]\nlisten = "127.0.0.1:{http}"\n'
            f"\n[limits]\nmax_streams = {args.max_streams}\n"
        )
        (work / "run").mkdir()
        proc, sock = serve(work / "run", engine, extra)
        try:
            ready = round(status_kb(proc.pid, "VmRSS") / 1024, 1)
            la0 = loadavg()
            result = asyncio.run(_run({"wyoming": wy, "http": http, "socket": sock}, args.streams,
                                      int(time.time()) % 100000))  # fmt: skip
            peak, end = peak_rss_mb(proc.pid), round(status_kb(proc.pid, "VmRSS") / 1024, 1)
        finally:
            proc.terminate()
            proc.wait(30)
    return {
        "bundle": str(args.bundle),
        "steps": args.steps,
        "streams": args.streams,
        "batch_size": args.batch_size,
        "max_streams": args.max_streams,
        "threads": args.threads,
        "machine": machine,
        "loadavg_before": la0,
        "loadavg_after": loadavg(),
        "rss_ready_mb": ready,
        "rss_peak_mb": peak,
        "rss_end_mb": end,
        **result,
    }


def table(r: dict[str, Any]) -> str:
    out = [
        line(r["machine"]),
        f"{r['bundle']}: {r['streams']} streams of {r['steps']} steps, batch_size"
        f" {r['batch_size']}, max_streams {r['max_streams']}, load average"
        f" {r['loadavg_before']} → {r['loadavg_after']}",
        "alone: "
        + ", ".join(
            f"{k} first audio {a['first_audio_s']:.3f} s, gaps {a['stall_s']:.2f} s"
            for k, a in r["alone"].items()
        ),
        "",
        "| stream | kind | first audio s | ÷ alone | gaps s | gapless start s | last audio s |",
        "|---:|---|---:|---:|---:|---:|---:|",
    ]
    for i, s in enumerate(r["together"]):
        out.append(
            f"| {i + 1} | {s['kind']} | {s['first_audio_s']:.3f} | {s['vs_alone']:.2f}× |"
            f" {s['stall_s']:.2f} | {s['gapless_first_audio_s']:.3f} | {s['last_audio_s']:.2f} |"
        )
    out.append(
        f"\naggregate {r['audio_s_per_s']} audio s per s over {r['wall_s']} s; daemon RSS at"
        f" READY {r['rss_ready_mb']} MB, peak {r['rss_peak_mb']} MB, end {r['rss_end_mb']} MB"
    )
    return "\n".join(out)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--bundle", type=Path, required=True, help="the bundle the daemon loads")
    p.add_argument("--streams", type=int, default=8)
    p.add_argument("--steps", type=int, default=520, help="decode steps per sentence")
    p.add_argument("--batch-size", type=int, default=8, help="[engine] batch_size")
    p.add_argument("--max-streams", type=int, default=8, help="limits.max_streams")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--json", action="store_true")
