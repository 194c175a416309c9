"""SSIP ``CANCEL`` → ``703 CANCELED``: how long a stop takes, on the realtime-paced null and WAV
sinks.

    speakd-tools bench cancel [--n 50] [--block-ms 50] [--json]

A real daemon (``python -m speakd serve``, the embedded voice, ``audio.realtime = true`` so the
sink plays at a device's pace) per sink. One SSIP client says a long sentence (a cache hit after
the first), waits for ``701 BEGIN``, waits a random 0–``--block-ms`` ms more (so the cancel lands
anywhere in a playback block), sends ``CANCEL self`` and times until the message's ``703`` line
is read (``time.perf_counter()``, client side, over the Unix socket). Prints p50/p99/max in ms
per sink, with the machine line and the load average.
"""

from __future__ import annotations

import argparse
import json
import random
import socket
import tempfile
import time
from pathlib import Path
from typing import Any

from ..harness.daemon import serve
from ..harness.machine import describe
from ..harness.machine import line as machine_line
from ..harness.stats import loadavg, summary

TEXT = "This sentence is long enough to be cancelled well before its end, every single time."


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--n", type=int, default=50, help="cancels per sink (default 50)")
    p.add_argument("--block-ms", type=int, default=50, help="audio.block_ms (default 50)")
    p.add_argument("--json", action="store_true", help="print the numbers as JSON")


class Ssip:
    """Just enough of an SSIP client: commands, and units read one at a time."""

    def __init__(self, path: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.settimeout(60)
        self.sock.connect(path)
        self.file = self.sock.makefile("rb")

    def unit(self) -> list[str]:
        lines: list[str] = []
        while True:
            line = self.file.readline().decode().rstrip("\r\n")
            if not line:
                raise ConnectionError("the SSIP connection closed")
            lines.append(line)
            if len(line) >= 4 and line[3] == " ":
                return lines

    def reply(self, command: str) -> list[str]:
        """A command's reply (events read meanwhile are dropped)."""
        self.sock.sendall(command.encode() + b"\r\n")
        while True:
            unit = self.unit()
            if not unit[-1].startswith("7"):
                return unit

    def speak(self, text: str) -> str:
        assert self.reply("SPEAK")[-1].startswith("230")
        unit = self.reply(f"{text}\r\n.")
        return unit[0][4:]

    def until(self, code: int, msg: str) -> None:
        while self.unit()[0] != f"{code}-{msg}":
            pass


def measure(ssip_path: str, n: int, block_ms: int) -> list[float]:
    c = Ssip(ssip_path)
    c.reply("SET self CLIENT_NAME bench:cancel:main")
    c.reply("SET self NOTIFICATION all on")
    out = []
    for _ in range(n):
        msg = c.speak(TEXT)
        c.until(701, msg)
        time.sleep(random.uniform(0, block_ms / 1000))
        t0 = time.perf_counter()
        c.sock.sendall(b"CANCEL self\r\n")
        c.until(703, msg)
        out.append((time.perf_counter() - t0) * 1000)
    return out


def run(args: argparse.Namespace) -> int:
    results: dict[str, Any] = {"machine": describe(bandwidth=False), "block_ms": args.block_ms}
    for sink in ("null", "wav"):
        with tempfile.TemporaryDirectory() as tmp:
            work = Path(tmp)
            ssip = str(work / "ssip.sock")
            audio = f'sink = "{sink}"\nrealtime = true\nblock_ms = {args.block_ms}\n'
            if sink == "wav":
                audio += f'wav_dir = "{work / "wav"}"\n'
            proc, _ = serve(work, audio=audio, ssip_path=ssip)
            try:
                results[sink] = summary(measure(ssip, args.n, args.block_ms), 1)
                results[sink]["loadavg"] = loadavg()
            finally:
                proc.terminate()
                proc.wait(30)
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    print(machine_line(results["machine"]))
    print(f"\nCANCEL → 703 CANCELED, block_ms = {args.block_ms}, realtime sinks:\n")
    print("| sink | n | p50 ms | p99 ms | max ms | load avg |")
    print("|---|---|---|---|---|---|")
    for sink in ("null", "wav"):
        r = results[sink]
        load = " ".join(str(x) for x in r["loadavg"])
        print(f"| {sink} | {r['n']} | {r['p50']} | {r['p99']} | {r['max']} | {load} |")
    return 0
