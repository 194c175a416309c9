"""speakd's own parts of each new text in ``bench screenreader --phase nav``, read from the lines a
daemon with ``engine.trace_parts`` logs (``speakd.engines.spans``), set beside the client's first
audio: what the engine took up to its first chunk, part by part, and what the daemon added."""

from __future__ import annotations

import re
import statistics
import time
from pathlib import Path
from typing import Any

from ..harness import loopstall
from .screenreader_nav import NavTrial, WavOffsets

LINE = re.compile(r"\[(\S+) voice=[^\]]*\] synthesis parts, ms: first ([\d.]+) ms \(([^)]*)\)")
KINDS = {"line": "line", "menu": "menu item", "say_all": "say-all's first clause"}  # floor's


def parse(log: str) -> dict[str, dict[str, float]]:
    """Request id → its first synthesis' parts up to the first chunk, ms (``first chunk``: the
    whole wait for it). A request said as several syntheses keeps its first."""
    out: dict[str, dict[str, float]] = {}
    for m in LINE.finditer(log):
        if m.group(1) in out:
            continue
        parts = {k: float(v) for k, v in (p.rsplit(" ", 1) for p in m.group(3).split(", ") if p)}
        out[m.group(1)] = {**parts, "first chunk": float(m.group(2))}
    return out


def by_kind(nav: NavTrial, parsed: dict[str, dict[str, float]]) -> dict[str, dict[str, Any]]:
    """Per kind of text, medians in ms: each part, the engine's first chunk, SPEAK → first audio,
    and the daemon's own share (first audio less the first chunk, message by message)."""
    out: dict[str, dict[str, Any]] = {}
    for phase, kind in KINDS.items():
        rows, own, heard = [], [], []
        for m in nav.spoken:
            at = nav.first.get(m.msg_id)
            parts = parsed.get(f"ssip-{m.msg_id}")
            if m.phase != phase or parts is None or at is None:
                continue
            rows.append(parts)
            heard.append((at - m.sent) * 1000)
            own.append(heard[-1] - parts["first chunk"])
        if rows:
            names = [k for k in rows[0] if all(k in r for r in rows)]
            out[kind] = {
                "n": len(rows),
                "parts": {k: round(statistics.median(r[k] for r in rows), 2) for k in names},
                "first_audio": round(statistics.median(heard), 2),
                "daemon_own": round(statistics.median(own), 2),
            }
    return out


class SpeakdFigures(WavOffsets):
    """speakd's WAV sink for first audio (``WavOffsets``), and its own figures of the run: the
    parts its log gives and the worst stall of its event loop (``loopstall``)."""

    def __init__(self, wav_dir: Path, socket: str, log: Path) -> None:
        super().__init__(wav_dir)
        self.socket, self.log = socket, log
        self._start, self._before = 0.0, None

    def _loop(self) -> dict[str, Any] | None:
        from speakd.library.client import Client

        with Client(self.socket, timeout=30) as c:
            return c.request({"op": "status"}).get("loop")

    def mark(self) -> None:
        self._start, self._before = time.monotonic(), self._loop()

    def figures(self, nav: NavTrial) -> dict[str, Any]:
        return {
            "loop": loopstall.during(self._before, self._loop(), self._start),
            "parts": by_kind(nav, parse(self.log.read_text(errors="replace"))),
        }


def parts_table(parts: dict[str, Any], floors: dict[str, Any] | None) -> list[str]:
    """speakd's new texts by kind, p50 ms: its engine's parts up to the first chunk (its log),
    the daemon's own share of first audio and, with ``--floor``, bench floor's engine on the same
    texts and its floor: the engine's ratio to its floor in the daemon and alone."""
    names = list(next(iter(parts.values()))["parts"])
    head = [*names, "SPEAK → first audio", "daemon's own"]
    if floors:
        head += ["bench floor's engine", "floor", "× floor (daemon)", "× floor (alone)"]
        peak = max(floors["gemm_gflops"].values())
    out = [
        "speakd by kind of text, p50 ms (engine parts from its log up to the first chunk; "
        "daemon's own = first audio less the engine's first chunk):",
        "",
        "| text (n) | " + " | ".join(head) + " |",
        "|---|" + "---:|" * len(head),
    ]
    for kind, k in parts.items():
        cells = [f"{k['parts'][n]:.1f}" for n in names]
        cells += [f"{k['first_audio']:.1f}", f"{k['daemon_own']:.1f}"]
        f = (floors or {}).get("kinds", {}).get(kind)
        if floors and f:
            alone = sum(p["ms"] for p in f["parts"].values())
            floor_ms = sum(p["gflop"] for p in f["parts"].values()) / peak * 1000
            engine = k["parts"]["first chunk"]
            cells += [f"{alone:.1f}", f"{floor_ms:.1f}", f"{engine / floor_ms:.2f}×"]
            cells.append(f"{alone / floor_ms:.2f}×")
        out.append(f"| {kind} ({k['n']}) | " + " | ".join(cells) + " |")
    return out
