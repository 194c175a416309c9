"""What the MQTT journal knows without reading its file: the says pending, and the says a
broker's redelivery may repeat (unfinished, or finished within ``window_s``).

Only the caller's thread (the event loop) touches it, so the loop answers "is this a
redelivery?" and "is the journal full?" at once, while the file is written on the writer thread.
"""

from __future__ import annotations

import sqlite3
import time
from collections import OrderedDict

from speakd.mqtt.journal.schema import Entry, Identity, pending_rows


class Index:
    def __init__(self, max_pending: int, max_done: int, window_s: float) -> None:
        self.max_pending, self.max_done, self.window_s = max_pending, max_done, window_s
        self.next_seq = 1
        self.pending: dict[int, Identity | None] = {}  # seq → identity, for every unfinished say
        self._done: OrderedDict[Identity, float] = OrderedDict()  # finished, oldest first
        self._unfinished: dict[Identity, int] = {}

    def load(self, db: sqlite3.Connection) -> list[Entry]:
        """Read the file as it was opened; returns its pending says, oldest first."""
        self.next_seq = db.execute("SELECT coalesce(max(seq), 0) + 1 FROM says").fetchone()[0]
        pending = pending_rows(db)
        for entry in pending:
            self.pending[entry.seq] = entry.identity
            if entry.identity is not None:
                self._unfinished[entry.identity] = entry.seq
        for packet, dig, at in db.execute(
            "SELECT packet, digest, done FROM says WHERE done >= ? AND packet IS NOT NULL"
            " ORDER BY done",
            (time.time() - self.window_s,),
        ):
            self._done[(packet, bytes(dig))] = at
        return pending

    def redelivery(self, identity: Identity) -> bool:
        if identity in self._unfinished:
            return True
        at = self._done.get(identity)
        return at is not None and time.time() - at <= self.window_s

    def add(self, entry: Entry) -> None:
        self.pending[entry.seq] = entry.identity
        if entry.identity is not None:
            self._unfinished[entry.identity] = entry.seq

    def finish(self, seq: int, now: float) -> None:
        """Remembered as finished for ``window_s``, at most ``max_done`` of them."""
        identity = self.pending.pop(seq, None)
        if identity is not None:
            if self._unfinished.get(identity) == seq:
                del self._unfinished[identity]
            self._done[identity] = now
            self._done.move_to_end(identity)
            while len(self._done) > self.max_done:
                self._done.popitem(last=False)

    def forget(self, seq: int) -> None:
        identity = self.pending.pop(seq, None)
        if identity is not None and self._unfinished.get(identity) == seq:
            del self._unfinished[identity]
