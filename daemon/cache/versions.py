"""The anti-replay record: the last signed pack version this board accepted per site, and which
pack that was, in the state directory (``[state] dir``/``pack-versions.db``).

It is state, not cache: deleting the cache, ``systemctl clean speakd``, a new ``cache.path`` or
the cache's own recovery from damage must not let an older signed pack retained on the broker in
again. A pack is *claimed* before it is installed: the version is checked and recorded in one
transaction here, then the cache takes the clips. A claim that is never installed (the import
failed) leaves the record one step ahead, which refuses nothing it should take: the same pack
(same id) is taken again, and any other needs a higher version anyway.

Boards that kept the record in the cache's ``meta`` table (before this file existed) have it
moved here by ``speakd.cache.packs.adopt_versions`` before any check, so the upgrade itself opens
no replay window. One small SQLite file: the daemon and ``speakd cache import`` may claim at the
same time, and SQLite's locking keeps them apart.
"""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

from speakd.cache.trust import REPLAYED, TrustError

FILE = "pack-versions.db"


class PackVersions:
    """The per-site record; thread-safe (one connection behind a lock)."""

    def __init__(self, path: Path | str) -> None:
        self.path = str(path)
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None  # opened on the first claim (or read of a
        # file that exists): a board that never takes a signed pack never makes the file

    def _db(self, create: bool = True) -> sqlite3.Connection | None:
        """Call with the lock held."""
        if self._conn is None:
            memory = self.path == ":memory:"
            if not create and not memory and not Path(self.path).exists():
                return None
            if not memory:
                Path(self.path).parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(
                self.path, check_same_thread=False, timeout=10.0, isolation_level=None
            )
            conn.execute("PRAGMA synchronous=FULL")  # a claim survives a power cut
            conn.execute(
                "CREATE TABLE IF NOT EXISTS versions"
                " (site TEXT PRIMARY KEY, version INTEGER NOT NULL, pack_id TEXT NOT NULL)"
            )
            self._conn = conn
        return self._conn

    @classmethod
    def in_state_dir(cls, state_dir: Path | str) -> PackVersions:
        return cls(Path(state_dir) / FILE)

    def last(self, site: str) -> tuple[int, str] | None:
        """(version, pack id) of the last signed pack accepted for ``site``."""
        with self._lock:
            db = self._db(create=False)
            row = (
                None
                if db is None
                else db.execute(
                    "SELECT version, pack_id FROM versions WHERE site = ?", [site]
                ).fetchone()
            )
        return (int(row[0]), str(row[1])) if row else None

    def check(self, site: str, version: int, pack_id: str) -> None:
        """TrustError (``replayed``) when the pack is not the last one taken for ``site`` and its
        version is not newer than that one's."""
        _check(site, version, pack_id, self.last(site))

    def claim(self, site: str, version: int, pack_id: str) -> None:
        """``check`` and record the pack as the last one for ``site``, in one transaction."""
        with self._lock:
            db = self._db()
            assert db is not None
            db.execute("BEGIN IMMEDIATE")
            try:
                row = db.execute(
                    "SELECT version, pack_id FROM versions WHERE site = ?", [site]
                ).fetchone()
                _check(site, version, pack_id, (int(row[0]), str(row[1])) if row else None)
                db.execute(
                    "INSERT OR REPLACE INTO versions (site, version, pack_id) VALUES (?, ?, ?)",
                    [site, version, pack_id],
                )
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")

    def raise_to(self, site: str, version: int, pack_id: str) -> None:
        """Record ``version`` for ``site`` unless a higher one is recorded (adopting a record)."""
        with self._lock:
            db = self._db()
            assert db is not None
            db.execute(
                "INSERT INTO versions (site, version, pack_id) VALUES (?, ?, ?)"
                " ON CONFLICT (site) DO UPDATE SET version = excluded.version,"
                " pack_id = excluded.pack_id WHERE excluded.version > versions.version",
                [site, version, pack_id],
            )

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None


def _check(site: str, version: int, pack_id: str, last: tuple[int, str] | None) -> None:
    if last is None or last[1] == pack_id:
        return
    if version <= last[0]:
        raise TrustError(
            REPLAYED,
            f"version {version} for site {site} is not newer than {last[0]}, "
            "the last one this board accepted",
        )
