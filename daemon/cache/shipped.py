"""The shipped pack: a read-only cache file installed with speakd (the Debian package's
``/usr/share/speakd/key-echo.db``, ``cache.shipped_pack``), which the resolver consults after the
writable cache. It makes key echo a hit from the first key of every user's daemon, whose own
cache starts empty, without copying it into each user's cache.

The file is opened ``immutable``: SQLite takes no lock and writes no ``-wal``/``-shm`` beside it
(``/usr/share`` is not writable, and the file changes only with the package). Its clips are
looked up by key like the cache's own, so a pack made with another voice, other settings or
other code simply does not match (``speakd doctor`` says how many of the key-echo clips match).
Nothing is written to it: no hit counts, no LRU, no eviction.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import urllib.parse
from pathlib import Path
from typing import Any

from speakd.cache.store import Clip

log = logging.getLogger(__name__)


class ShippedPack:
    """One read-only pack file; thread-safe (one connection behind a lock)."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        uri = f"file:{urllib.parse.quote(str(self.path.resolve()))}?mode=ro&immutable=1"
        self._lock = threading.Lock()
        self._db: sqlite3.Connection | None = sqlite3.connect(
            uri, uri=True, check_same_thread=False
        )
        self._db.row_factory = sqlite3.Row
        try:
            self.clips, self.bundles = self._summary()
        except sqlite3.Error:
            self.close()
            raise

    @classmethod
    def open(cls, path: str) -> ShippedPack | None:
        """The pack at ``path``; None (with a log line) when there is none or it cannot be read:
        the daemon then works as without one."""
        if not path:
            return None
        if not Path(path).is_file():
            log.info("no shipped pack at %s (cache.shipped_pack)", path)
            return None
        try:
            pack = cls(path)
        except sqlite3.Error as e:
            log.warning("shipped pack %s not used: %s", path, e)
            return None
        log.info("shipped pack %s: %d clips (%s)", path, pack.clips, ", ".join(pack.bundles))
        return pack

    def _summary(self) -> tuple[int, tuple[str, ...]]:
        assert self._db is not None
        rows = self._db.execute("SELECT bundle, COUNT(*) FROM clips GROUP BY bundle").fetchall()
        return sum(n for _, n in rows), tuple(sorted(b for b, _ in rows))

    def get(self, key: str) -> Clip | None:
        with self._lock:
            if self._db is None:
                return None
            row = self._db.execute("SELECT * FROM clips WHERE key = ?", [key]).fetchone()
        if row is None:
            return None
        clip = Clip.from_row(dict(row))
        clip.pinned, clip.expires = True, None  # nothing here ages: the file is the package's
        return clip

    def contains(self, key: str) -> bool:
        with self._lock:
            if self._db is None:
                return False
            row = self._db.execute("SELECT 1 FROM clips WHERE key = ?", [key]).fetchone()
        return row is not None

    def meta(self, key: str) -> str | None:
        with self._lock:
            if self._db is None:
                return None
            row = self._db.execute("SELECT value FROM meta WHERE key = ?", [key]).fetchone()
        return row[0] if row else None

    def status(self) -> dict[str, Any]:
        return {"path": str(self.path), "clips": self.clips, "bundles": list(self.bundles)}

    def close(self) -> None:
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None
