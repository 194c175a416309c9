"""What the soak counts: every request, its terminal events, its audio, and the kills it lived
through; the traffic gate that pauses the drivers (quiet points, restarts, the end)."""

from __future__ import annotations

import itertools
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

FRONTENDS = ("json", "ssip", "mqtt", "wyoming", "http", "faults")


@dataclass
class Request:
    frontend: str
    kind: str
    id: str
    sent: float
    ended: float | None = None
    outcome: str | None = None  # "done", "stopped", … or an error code; None = no terminal
    terminals: int = 0
    audio_s: float | None = None  # what the client got (streams) or the daemon played (says)
    expect: list[tuple[str, str]] = field(default_factory=list)  # (voice, text) of each clip
    tolerance_s: float = 0.01
    abandoned: bool = False  # the client left on purpose: no terminal event is owed
    survives_kill: bool = False  # owed a terminal event after a SIGKILL too (MQTT QoS 1 says)
    note: str = ""
    info: Any = None  # an MQTT say's publish (its PUBACK)


class Ledger:
    def __init__(self, deadline: float) -> None:
        self.deadline = deadline
        self.requests: list[Request] = []
        self.kills: list[tuple[float, float]] = []  # (killed, serving again)
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._inflight = 0
        self._open = threading.Event()
        self._ids = itertools.count()

    # ---- the gate -----------------------------------------------------------------------

    def open(self) -> None:
        self._open.set()

    def close(self) -> None:
        self._open.clear()

    def turn(self) -> bool:
        """Wait until traffic may flow; False once the run is over."""
        while time.monotonic() < self.deadline:
            if self._open.wait(0.5):
                return time.monotonic() < self.deadline
        return False

    def quiesce(self, timeout: float) -> bool:
        """Close the gate and wait for every request in flight to end."""
        self.close()
        with self._idle:
            return self._idle.wait_for(lambda: self._inflight == 0, timeout)

    # ---- requests -----------------------------------------------------------------------

    def begin(self, frontend: str, kind: str, **fields: Any) -> Request:
        req = Request(frontend, kind, f"soak-{frontend}-{next(self._ids)}", time.monotonic())
        for name, value in fields.items():
            setattr(req, name, value)
        with self._lock:
            self.requests.append(req)
            self._inflight += 1
        return req

    def end(
        self, req: Request, outcome: str | None, audio_s: float | None = None, terminals: int = 1
    ) -> None:
        """``outcome`` None: no terminal event came (a dead connection, a timeout)."""
        req.ended = time.monotonic()
        req.outcome = outcome
        req.terminals = terminals if outcome is not None else 0
        if audio_s is not None:
            req.audio_s = audio_s
        self._done()

    def abandon(self, req: Request) -> None:
        req.ended, req.abandoned = time.monotonic(), True
        self._done()

    def _done(self) -> None:
        with self._idle:
            self._inflight -= 1
            self._idle.notify_all()

    def gone_with_a_kill(self, req: Request, grace_s: float) -> bool:
        """A request the daemon took just before a SIGKILL, still unanswered ``grace_s`` after
        the restart: some clients (``spd-say -w``, an MQTT publisher) would wait forever."""
        return bool(self.kills) and req.sent <= self.kills[-1][1] < time.monotonic() - grace_s

    def hit_by_kill(self, req: Request) -> bool:
        """Was the daemon killed (or down) while this request was in flight?"""
        end = req.ended or time.monotonic()
        return any(req.sent <= up and killed <= end for killed, up in self.kills)

    # ---- the tally ----------------------------------------------------------------------

    def tally(self, references: dict[tuple[str, str], float]) -> dict[str, dict[str, Any]]:
        rows: dict[str, dict[str, Any]] = {}
        for req in self.requests:
            row = rows.setdefault(req.frontend, _row())
            row["sent"] += 1
            if req.abandoned:
                row["abandoned"] += 1
                continue
            if req.terminals == 1:
                row["terminal"] += 1
                row["outcomes"][req.outcome] += 1
            elif self.hit_by_kill(req) and not req.survives_kill:
                row["lost_to_kill"] += 1
            elif req.terminals == 2 and req.survives_kill and self.hit_by_kill(req):
                # docs/reliability.md's window: its outcome reached the broker, the kill came
                # before its row was marked done, so the next process spoke it again
                row["twice_by_kill"] += 1
                row["problems"].append(f"{req.id} ({req.kind}): twice, across a kill")
            elif req.terminals > 1:
                row["duplicate"] += 1
                row["problems"].append(f"{req.id} ({req.kind}): {req.terminals} terminal events")
            else:
                row["missing"] += 1
                row["problems"].append(f"{req.id} ({req.kind}): no terminal event {req.note}")
            if req.outcome != "done" or req.audio_s is None or not req.expect:
                continue
            refs = [references.get(e) for e in req.expect]
            if any(r is None for r in refs):
                row["audio_unchecked"] += 1
                continue
            expected = sum(r for r in refs if r is not None)
            row["audio_s"] += req.audio_s
            row["expected_s"] += expected
            if abs(req.audio_s - expected) > req.tolerance_s:
                row["audio_wrong"] += 1
                row["problems"].append(
                    f"{req.id} ({req.kind}): {req.audio_s:.3f} s of audio, expected {expected:.3f}"
                )
        for row in rows.values():
            row["outcomes"] = dict(sorted(row["outcomes"].items()))
            row["audio_s"], row["expected_s"] = (
                round(row["audio_s"], 2),
                round(row["expected_s"], 2),
            )
        return {name: rows[name] for name in FRONTENDS if name in rows}


def _row() -> dict[str, Any]:
    return {
        "sent": 0,
        "terminal": 0,
        "missing": 0,
        "duplicate": 0,
        "lost_to_kill": 0,
        "twice_by_kill": 0,
        "abandoned": 0,
        "outcomes": Counter(),
        "audio_s": 0.0,
        "expected_s": 0.0,
        "audio_wrong": 0,
        "audio_unchecked": 0,
        "problems": [],
    }
