"""The MQTT say journal: every say taken from the broker and not yet finished, on disk.

The promise (docs/reliability.md, "MQTT says across a crash, a stop and an upgrade"): a say the
daemon acknowledged (PUBACK) is spoken, once, whatever happens to the process — SIGKILL,
SIGTERM, an upgrade's restart. So a say is acknowledged only after its row is committed here;
the daemon queues the ``pending`` rows again when it starts (in their order, past every queue
limit); a clean stop leaves the rows of says it did not finish, so they are spoken after the
next start. A say that ended keeps its outcome in its row (``outcome``) until the broker has
acknowledged it (``sayFinished``, the reply): the row turns ``done`` only then, so a crash or a
broker away never loses an outcome, and a start publishes the kept outcomes instead of speaking
those says again.

A say that cannot be journaled (the file cannot be opened or written) is refused with the
retryable ``journal_unavailable`` on every reply path, then acknowledged: the client hears that
it was not taken. Holding the PUBACK instead (for the broker to redeliver on a reconnect) would
fill the broker's in-flight window (mosquitto's default is 20) while the disk stays full, and
behind it stop and cancel would stall too.

Redeliveries: the broker re-sends a say whose PUBACK it did not get (a crash or a dropped
connection between our commit and the PUBACK), with the DUP flag and its original packet
identifier. Such a say is a redelivery when the journal holds, unfinished or finished within
``window_s``, a say with the same packet identifier and the same topic and payload; it is then
answered ``duplicate`` and not spoken. Anything else is a new say and is spoken, even one that
reuses an ``id`` ("Door open" twice), and even a QoS 0 say (QoS 0 has no redelivery). QoS 0
says are journaled too: they come in order with QoS 1 ones, and a restart should not drop a
say the daemon took, whichever QoS it came with.

Its own SQLite file in the state directory (``[state] dir``): the cache may be wiped, rebuilt or
disabled without touching what was promised to MQTT clients. The parts: the file's schema and its
migrations (``schema.py``), moving in a journal an older version left beside the cache
(``movein.py``), what is pending and what a redelivery repeats, in memory (``index.py``), and the
thread that writes the file (``writer.py``).

Bounded: at most ``max_pending`` says wait here (past it a say is refused as ``queue_full``) and
at most ``max_done`` finished ones are remembered for ``window_s``.
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from typing import Any

from speakd.mqtt.journal.index import Index
from speakd.mqtt.journal.schema import Entry, Identity, digest
from speakd.mqtt.journal.writer import Done, Op, Writer

__all__ = ["Entry", "Journal", "digest"]  # what front-ends and tests use

MAX_PENDING = 1000  # says accepted but not yet finished
MAX_DONE = 1024  # finished says remembered for redeliveries
WINDOW_S = 120.0  # longer than a reconnect: the broker redelivers within it


class Journal:
    """Loop side: the index (what is pending, what a redelivery would repeat) lives in memory
    and is only touched by the caller's thread; the SQLite file only by the writer thread."""

    def __init__(
        self,
        path: Path | str,
        legacy: Path | None = None,
        max_pending: int = MAX_PENDING,
        max_done: int = MAX_DONE,
        window_s: float = WINDOW_S,
    ) -> None:
        """Open (migrate, move in ``legacy``) and read the file: blocking, so call it off the
        loop. A file that cannot be opened leaves the journal refusing says until it can."""
        self.path = str(path)
        self._index = Index(max_pending, max_done, window_s)
        self._writer = Writer(self.path, legacy, max_done, window_s)
        # pending at open, oldest first: the start speaks them, or publishes their outcome
        self.replay: list[Entry] = []
        try:
            self.replay = self._index.load(self._writer.open())
        except (OSError, sqlite3.Error) as e:
            self._writer.db = None
            self._writer.failed("cannot be opened", e)
            # Rows the file may hold are replayed at the next start; the says taken meanwhile
            # must not take their numbers when it opens later: start past any of them.
            self._index.next_seq = time.time_ns() // 1000
        self._writer.start()

    @property
    def full(self) -> bool:
        return len(self._index.pending) >= self._index.max_pending

    @property
    def pending(self) -> int:
        return len(self._index.pending)

    def redelivery(self, identity: Identity) -> bool:
        """Does the journal hold the say this DUP-flagged one repeats (see the module doc)?"""
        return self._index.redelivery(identity)

    def add(
        self,
        topic: str,
        payload: bytes,
        response_topic: str | None,
        correlation: bytes | None,
        packet: int | None,
        done: Done,
    ) -> int:
        """Journal a say; ``done`` hears how its commit went. Returns its ``seq``."""
        seq, self._index.next_seq = self._index.next_seq, self._index.next_seq + 1
        entry = Entry(seq, topic, payload, response_topic, correlation, packet)
        self._index.add(entry)
        self._writer.put(Op("add", entry, done=done))
        return seq

    def report(self, seq: int, outcome: str) -> None:
        """The say ended with ``outcome`` (kept until ``finish``: a restart publishes it and
        does not speak the say again; a failed write is retried with the next commit)."""
        self._writer.put(Op("report", seq=seq, outcome=outcome))

    def finish(self, seq: int) -> None:
        """The broker has the say's final outcome: remember it for ``window_s``, drop its payload (a
        mark that fails is retried with the next commit)."""
        now = time.time()
        self._index.finish(seq, now)
        self._writer.put(Op("finish", seq=seq, at=now))

    def forget(self, seq: int) -> None:
        """A say whose commit failed: it was never journaled (its redelivery is a new say)."""
        self._index.forget(seq)

    def barrier(self, done: Done) -> None:
        """``done`` runs after every operation queued before it."""
        self._writer.put(Op("barrier", done=done))

    def status(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "pending": len(self._index.pending),
            "failures": self._writer.failures,
            "error": self._writer.error,
        }

    def close(self) -> None:
        """Commit what is queued, then close (blocking: call it off the loop)."""
        self._writer.close()
