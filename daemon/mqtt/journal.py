"""The MQTT say journal: QoS 1 says acknowledged to the broker but not yet spoken, on disk.

A QoS 1 say is PUBACKed only once its row is committed here, so a crash between arrival and the
end of playback loses nothing: the daemon replays the ``pending`` rows when it starts. A row turns
``done`` on the say's terminal event and stays for ``window_s`` so that a redelivery of the same
id (the broker re-sends a say whose PUBACK a crash cut off) is recognised as a duplicate even
across a restart: one acknowledged say is spoken once.

Its own SQLite file beside the cache, not a table in ``cache.db``: every accepted say is a commit
that must reach the disk before the PUBACK (``synchronous=FULL``, WAL), a cost the cache's bulk
writes should not share, and the cache may be cleared, rebuilt or disabled without touching
what was promised to MQTT clients.

Bounded: at most ``max_pending`` says wait here (past it, a say is refused as ``queue_full``,
which the client may retry) and at most ``max_done`` finished ids are remembered. A write that
fails (a full disk) is logged and the say is spoken all the same, only not kept across a crash:
speaking it now beats refusing it for the sake of a crash that may never come. A finished say
whose mark fails is marked again at the next write (else a crash would replay it).

Used only from the event loop's thread.
"""

from __future__ import annotations

import logging
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

MAX_PENDING = 1000  # says accepted but not yet finished
MAX_DONE = 1024  # finished ids remembered for duplicate suppression
WINDOW_S = 120.0  # longer than a reconnect: a say re-using an id later is spoken again

SCHEMA = """
CREATE TABLE IF NOT EXISTS says (
    key TEXT PRIMARY KEY,       -- the say's id, else its correlation data, else a random key
    topic TEXT NOT NULL,
    payload BLOB NOT NULL,
    response_topic TEXT,
    correlation BLOB,
    done REAL                   -- when it finished (wall clock); NULL while pending
)
"""


@dataclass(frozen=True)
class Entry:
    """A journaled say, as it arrived (replayed through the same path as a live one)."""

    key: str
    topic: str
    payload: bytes
    response_topic: str | None
    correlation: bytes | None


class JournalFull(Exception):
    pass


class Journal:
    def __init__(
        self,
        path: str,
        max_pending: int = MAX_PENDING,
        max_done: int = MAX_DONE,
        window_s: float = WINDOW_S,
    ) -> None:
        self.path = path
        self.max_pending, self.max_done, self.window_s = max_pending, max_done, window_s
        self._unmarked: set[str] = set()  # finished, but the mark did not reach the disk
        self._db = sqlite3.connect(path, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")  # committed = on disk, before the PUBACK
        self._db.execute("PRAGMA wal_autocheckpoint=64")  # a small WAL: rows are few and small
        self._db.execute(SCHEMA)

    @classmethod
    def open(cls, path: Path) -> Journal:
        """The journal at ``path``; in memory (at-most-once, as without it) when the file
        cannot be opened, so MQTT keeps serving."""
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            return cls(str(path))
        except (OSError, sqlite3.Error) as e:
            log.error("MQTT journal %s unusable (%s): says are not kept across a crash", path, e)
            return cls(":memory:")

    def seen(self, key: str) -> bool:
        """Is ``key`` pending, or finished within the window?"""
        try:
            row = self._db.execute(
                "SELECT 1 FROM says WHERE key = ? AND (done IS NULL OR done >= ?)",
                (key, time.time() - self.window_s),
            ).fetchone()
        except sqlite3.Error as e:
            log.warning("MQTT journal: cannot look up %s: %s", key, e)
            return False
        return row is not None

    def add(
        self,
        key: str,
        topic: str,
        payload: bytes,
        response_topic: str | None,
        correlation: bytes | None,
    ) -> None:
        """Record a say before it is acknowledged (``JournalFull`` past ``max_pending``)."""
        if self._unmarked:
            self._mark_finished()
        try:
            pending = self._db.execute("SELECT count(*) FROM says WHERE done IS NULL").fetchone()
            if pending[0] >= self.max_pending:
                raise JournalFull(f"{pending[0]} MQTT says are waiting to be spoken")
            self._db.execute(
                "INSERT OR REPLACE INTO says VALUES (?, ?, ?, ?, ?, NULL)",
                (key, topic, payload, response_topic, correlation),
            )
        except sqlite3.Error as e:
            log.warning("MQTT journal: say %s not kept across a crash: %s", key, e)

    def finish(self, key: str) -> None:
        """The say reached its outcome: remember its id for the window, drop its payload."""
        self._unmarked.add(key)
        self._mark_finished()

    def _mark_finished(self) -> None:
        for key in list(self._unmarked):
            if not self._write(
                "UPDATE says SET done = ?, payload = x'' WHERE key = ?", (time.time(), key)
            ):
                return
            self._unmarked.discard(key)
        self._write(
            "DELETE FROM says WHERE done IS NOT NULL AND (done < ? OR key NOT IN (SELECT key"
            " FROM says WHERE done IS NOT NULL ORDER BY done DESC, rowid DESC LIMIT ?))",
            (time.time() - self.window_s, self.max_done),
        )

    def forget(self, key: str) -> None:
        """A say refused for a passing reason (queue full): its retry must not count as a dup."""
        self._write("DELETE FROM says WHERE key = ?", (key,))

    def _write(self, sql: str, args: tuple[object, ...]) -> bool:
        try:
            self._db.execute(sql, args)
        except sqlite3.Error as e:
            log.warning("MQTT journal: %s", e)
            return False
        return True

    def pending(self) -> list[Entry]:
        """The says accepted but not finished, oldest first (replayed at start)."""
        rows = self._db.execute(
            "SELECT key, topic, payload, response_topic, correlation FROM says"
            " WHERE done IS NULL ORDER BY rowid"
        ).fetchall()
        return [Entry(k, t, bytes(p), r, c) for k, t, p, r, c in rows]

    def close(self) -> None:
        self._db.close()
