"""The audio cache database: one SQLite file, written through sqlite-utils.

Crash safety comes from SQLite itself, used carefully: WAL journal, ``synchronous=FULL`` (a
committed clip survives power loss, not only a killed process), every change in one transaction,
and no file is ever rewritten in place. A file that is not a database or is damaged is moved aside
to ``<name>.corrupt-<UTC time>`` and a fresh cache is created, with an error log line and
``status()["recovered_from"]``.

Audio is stored as raw PCM16 (``encoding = "pcm_s16le"``): a hit is then a memcpy to the sink with
no decoder on the path, speech at 16–24 kHz costs only 32–48 kB/s, and the device needs no codec
library (python FLAC/Opus bindings are thin, unevenly maintained on ARM, and would add decode time
to every hit to save disk space the byte budget already bounds).

One connection serves every thread behind a lock; other processes (``speakd cache import`` while
the daemon runs) are serialised by SQLite's own locking with a busy timeout.

This module holds the clips and every query (a clip itself and its row are ``speakd.cache.clip``);
the file itself (opening it, its schema and migrations, telling and moving aside a damaged one) is
``speakd.cache.schema``, which also defines ``CacheError``, the error of both.
"""

from __future__ import annotations

import logging
import os
import random
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager, suppress
from pathlib import Path
from typing import Any, TypeVar

from sqlite_utils import Database

from speakd.audio import SAMPLE_WIDTH
from speakd.cache.clip import ENCODING, Clip
from speakd.cache.schema import (
    BUSY_S,
    RECENT_INDEX,
    SCHEMA_VERSION,
    CacheError,
    connect,
    connect_readonly,
    has_recent_index,
    is_corruption,
    move_aside,
    write_transaction,
)

log = logging.getLogger(__name__)

TOUCH_FLUSH_S = 30.0  # hit bookkeeping is batched: fewer fsyncs, less SD-card wear

T = TypeVar("T")


class CacheStore:
    """The cache file. Thread-safe; every public method is one transaction."""

    def __init__(
        self,
        path: Path | str,
        *,
        max_bytes: int = 268_435_456,
        ttl_s: float = 604_800,
        ttl_jitter: float = 0.1,
        recover: bool = True,
        rng: random.Random | None = None,
    ) -> None:
        self.path = Path(path)
        self.max_bytes = max_bytes
        self.ttl_s = ttl_s
        self.ttl_jitter = ttl_jitter
        self.recover = recover
        self.recovered_from: str | None = None
        self._rng = rng or random.Random()
        self._lock = threading.RLock()
        self._touches: dict[str, tuple[int, float]] = {}
        self._last_flush = time.monotonic()
        self._over_budget = False
        self._db: Database | None = None
        self._file: tuple[int, int] | None = None  # (device, inode) of the file connected to
        self._open()

    # ---- lifecycle --------------------------------------------------------------------------

    def _open(self) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise CacheError(f"{self.path.parent}: cannot create the cache directory: {e}") from e
        try:
            try:
                self._db, self._file = connect(self.path)
            except sqlite3.DatabaseError as e:
                if not (is_corruption(e) and self.recover):
                    raise
                self.recovered_from = move_aside(self.path, str(e))
                self._db, self._file = connect(self.path)
        except (sqlite3.Error, OSError) as e:  # damaged beyond recovery, or not ours to open
            raise CacheError(f"{self.path}: cannot open the cache database: {e}") from e

    def close(self) -> None:
        with self._lock:
            if self._db is None:
                return
            try:
                self._flush_touches()
            except sqlite3.Error as e:
                log.warning("cache %s: hit counters not saved on close: %s", self.path, e)
            self._db.close()
            self._db = None

    @property
    def closed(self) -> bool:
        return self._db is None

    def is_open_on(self, path: Path | str) -> bool:
        """Open, and on the file at ``path`` now: the same file under another spelling counts, a
        file removed or replaced since does not."""
        try:
            st = os.stat(path)
        except OSError:
            return False
        return not self.closed and (st.st_dev, st.st_ino) == self._file

    def __enter__(self) -> CacheStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def _guard(self) -> Iterator[Database]:
        """The lock, and recovery when SQLite reports the file damaged mid-operation."""
        with self._lock:
            if self._db is None:
                raise CacheError(f"{self.path}: the cache is closed")
            try:
                yield self._db
            except sqlite3.DatabaseError as e:
                if not (is_corruption(e) and self.recover):
                    raise
                self._db.close()
                self._db = None
                self.recovered_from = move_aside(self.path, str(e))
                self._db, self._file = connect(self.path)
                raise CacheError(f"{self.path}: damaged, replaced by an empty cache") from e

    def _run(self, fn: Callable[[Database], T]) -> T:
        with self._guard() as db:
            return fn(db)

    # ---- reads --------------------------------------------------------------------------------

    def get(self, key: str) -> Clip | None:
        def read(db: Database) -> Clip | None:
            cur = db.execute("SELECT * FROM clips WHERE key = ?", [key])
            row = cur.fetchone()
            if row is None:
                return None
            return Clip.from_row(dict(zip([d[0] for d in cur.description], row, strict=True)))

        return self._run(read)

    def contains(self, key: str) -> bool:
        return self._run(
            lambda db: db.execute("SELECT 1 FROM clips WHERE key = ?", [key]).fetchone() is not None
        )

    def prewarm_order(self, bundle: str) -> list[tuple[str, int]]:
        """(key, bytes) of a bundle's pinned clips, most used first: what to hold in RAM."""
        return self._run(
            lambda db: db.execute(
                "SELECT key, bytes FROM clips WHERE bundle = ? AND pinned = 1"
                " ORDER BY hits DESC, last_used DESC",
                [bundle],
            ).fetchall()
        )

    def pinned_by_bundle(self) -> dict[str, int]:
        return self._run(
            lambda db: dict(
                db.execute("SELECT bundle, COUNT(*) FROM clips WHERE pinned = 1 GROUP BY bundle")
            )
        )

    def keys(self) -> set[str]:
        return self._run(lambda db: {r[0] for r in db.execute("SELECT key FROM clips")})

    def clips(
        self, *, pinned_only: bool = False, bundle: str | None = None, order: str = "last_used"
    ) -> Iterator[Clip]:
        """All clips (a snapshot, read in one go), most recently used first by default."""
        orders = {
            "last_used": "last_used DESC",
            "key": "key",
        }
        sql = "SELECT * FROM clips WHERE (? = 0 OR pinned = 1) AND (? IS NULL OR bundle = ?)"
        sql += f" ORDER BY {orders[order]}"

        def read(db: Database) -> list[Clip]:
            return [Clip.from_row(r) for r in db.query(sql, [int(pinned_only), bundle, bundle])]

        return iter(self._run(read))

    def listing(self, *, pinned_only: bool = False) -> list[dict[str, Any]]:
        """Every row but the audio, most recently used first (``speakd cache ls``)."""
        sql = (
            "SELECT key, text, voice, params, bundle, sample_rate, encoding, duration, pinned,"
            " created, expires, last_used, hits, bytes FROM clips WHERE (? = 0 OR pinned = 1)"
            " ORDER BY last_used DESC"
        )
        return self._run(lambda db: list(db.query(sql, [int(pinned_only)])))

    def stats(self) -> dict[str, Any]:
        """The totals, read on a connection of their own and never under the lock: in a cache
        still without ``RECENT_INDEX`` they read every clip, and a hit must not wait for that."""
        if self.closed:
            raise CacheError(f"{self.path}: the cache is closed")
        with closing(connect_readonly(self.path)) as conn:
            return self.stats_from(conn)

    def indexed(self) -> bool:
        """Whether the file has ``RECENT_INDEX`` (made at once in a new file, in the background in
        one made before it: ``speakd.cache.indexing``)."""
        return self._run(lambda db: has_recent_index(db.conn))

    @staticmethod
    def clips_from(conn: sqlite3.Connection) -> str:
        """The clips table as the totals and the page's listing read it on ``conn``: through
        ``RECENT_INDEX`` when it exists, else the table itself (a cache made before it, until
        ``speakd.cache.indexing`` has built it: same answers, read from every clip's row)."""
        return f"clips INDEXED BY {RECENT_INDEX}" if has_recent_index(conn) else "clips"

    def stats_from(self, conn: sqlite3.Connection) -> dict[str, Any]:
        """The totals read on ``conn``: ``stats``' own, or the page's (``speakd.cache.browse``),
        inside its read transaction."""
        source = self.clips_from(conn)
        row = conn.execute(
            "SELECT COUNT(*), COALESCE(SUM(bytes), 0), COALESCE(SUM(duration), 0),"
            " COALESCE(SUM(pinned), 0), COALESCE(SUM(CASE WHEN pinned = 1 THEN bytes END), 0),"
            " COALESCE(SUM(hits), 0), COALESCE(SUM(expires <= ? AND pinned = 0), 0)"
            f" FROM {source}",
            [time.time()],
        ).fetchone()
        return {
            "path": str(self.path),
            "schema_version": SCHEMA_VERSION,
            "clips": row[0],
            "bytes": row[1],
            "audio_s": round(row[2], 1),
            "pinned": row[3],
            "pinned_bytes": row[4],
            "stored_hits": row[5],
            "expired": row[6],
            "max_bytes": self.max_bytes,
            "recovered_from": self.recovered_from,
        }

    def integrity_check(self) -> list[str]:
        """SQLite's full check plus one per clip; empty when all is well."""

        def check(db: Database) -> list[str]:
            problems = [
                r[0] for r in db.execute("PRAGMA integrity_check").fetchall() if r[0] != "ok"
            ]
            for key, enc, rate, n, stored in db.execute(
                "SELECT key, encoding, sample_rate, length(audio), bytes FROM clips"
            ):
                if enc != ENCODING:
                    problems.append(f"clip {key}: unknown encoding {enc!r}")
                if not rate or rate <= 0:
                    problems.append(f"clip {key}: bad sample rate {rate!r}")
                if n is None or n != stored or n % SAMPLE_WIDTH:
                    problems.append(f"clip {key}: audio is {n} bytes, row says {stored}")
            return problems

        return self._run(check)

    # ---- writes -------------------------------------------------------------------------------

    def expiry(self, now: float) -> float | None:
        """now + ttl, spread by ±ttl_jitter so entries made together do not expire together."""
        if self.ttl_s <= 0:
            return None
        return now + self.ttl_s * (1.0 + self.ttl_jitter * self._rng.uniform(-1.0, 1.0))

    def put(self, clip: Clip) -> list[str]:
        """Insert or replace a clip, then evict LRU unpinned clips over budget; returns evicted.
        A clip replacing a pinned one stays pinned (a re-synthesis: ``Resolver.remade``)."""
        if clip.encoding != ENCODING or len(clip.audio) % SAMPLE_WIDTH:
            raise ValueError(f"clip {clip.key}: expected {ENCODING} audio")
        if not clip.pinned and clip.expires is None:
            clip.expires = self.expiry(clip.created)

        def write(db: Database) -> list[str]:
            self._flush_touches()
            with write_transaction(db):
                row = clip.row()
                if db.execute("SELECT pinned FROM clips WHERE key = ?", [clip.key]).fetchone() == (
                    1,
                ):
                    row.update(pinned=1, expires=None)
                db["clips"].upsert(row, pk="key")
                return self._evict(db, keep=clip.key)

        return self._run(write)

    def put_many(self, clips: list[Clip], *, skip_existing: bool = True) -> int:
        """Store several clips in one transaction (prompt packs); returns how many were new."""

        def write(db: Database) -> int:
            added = 0
            with write_transaction(db):
                for clip in clips:
                    exists = db.execute("SELECT 1 FROM clips WHERE key = ?", [clip.key]).fetchone()
                    if exists and skip_existing:
                        if clip.pinned:  # same key, same audio: just make sure it stays
                            db.execute(
                                "UPDATE clips SET pinned = 1, expires = NULL WHERE key = ?",
                                [clip.key],
                            )
                        continue
                    db["clips"].upsert(clip.row(), pk="key")
                    added += 1
                self._evict(db)
            return added

        return self._run(write)

    def touch(self, key: str, now: float | None = None) -> None:
        """Record a hit; written in batches (see TOUCH_FLUSH_S)."""
        with self._lock:
            count, _ = self._touches.get(key, (0, 0.0))
            self._touches[key] = (count + 1, time.time() if now is None else now)
            if time.monotonic() - self._last_flush > TOUCH_FLUSH_S and self._db is not None:
                self._run(lambda db: self._flush_touches())

    def _flush_touches(self) -> None:
        if not self._touches or self._db is None:
            return
        with write_transaction(self._db):
            for key, (count, last) in self._touches.items():
                self._db.execute(
                    "UPDATE clips SET hits = hits + ?, last_used = MAX(last_used, ?) WHERE key = ?",
                    [count, last, key],
                )
        self._touches.clear()
        self._last_flush = time.monotonic()

    def delete(self, key: str) -> bool:
        return self._run(
            lambda db: db.execute("DELETE FROM clips WHERE key = ?", [key]).rowcount > 0
        )

    def pin(self, key: str, pinned: bool = True) -> bool:
        """Pin a clip (kept beyond the budget and the TTL) or unpin it (it expires a TTL from
        now, like a clip just made); False when there is no such clip."""
        expires = None if pinned else self.expiry(time.time())
        return self._run(
            lambda db: (
                db.execute(
                    "UPDATE clips SET pinned = ?, expires = ? WHERE key = ?",
                    [int(pinned), expires, key],
                ).rowcount
                > 0
            )
        )

    def prune(self, now: float | None = None) -> dict[str, int]:
        """Drop expired unpinned clips, then LRU-evict down to the byte budget."""
        now = time.time() if now is None else now

        def write(db: Database) -> dict[str, int]:
            self._flush_touches()
            with write_transaction(db):
                expired = db.execute(
                    "DELETE FROM clips WHERE pinned = 0 AND expires IS NOT NULL AND expires <= ?",
                    [now],
                ).rowcount
                evicted = len(self._evict(db))
            return {"expired": expired, "evicted": evicted}

        return self._run(write)

    def _evict(self, db: Database, keep: str | None = None) -> list[str]:
        total = db.execute("SELECT COALESCE(SUM(bytes), 0) FROM clips").fetchone()[0]
        if total <= self.max_bytes:
            self._over_budget = False
            return []
        evicted: list[str] = []
        for key, size in db.execute(
            "SELECT key, bytes FROM clips WHERE pinned = 0 AND key IS NOT ? ORDER BY last_used",
            [keep],
        ).fetchall():
            if total <= self.max_bytes:
                break
            evicted.append(key)
            total -= size
        if evicted:
            db.execute(f"DELETE FROM clips WHERE key IN ({','.join('?' * len(evicted))})", evicted)
        over = total > self.max_bytes
        if over and not self._over_budget:  # once, not on every put while it lasts
            log.warning(
                "cache %s: %d bytes over the %d-byte budget after evicting every unpinned clip "
                "(pinned clips are never evicted)",
                self.path,
                total - self.max_bytes,
                self.max_bytes,
            )
        self._over_budget = over
        return evicted

    @contextmanager
    def writes_fail_fast(self) -> Iterator[None]:
        """Inside: a write that finds another connection holding the write lock fails at once
        ("database is locked") instead of waiting out ``BUSY_S`` while it holds this store's
        lock, and every hit read from disk behind it. For a writer known to hold it for long
        (``speakd.cache.indexing``)."""
        self._run(lambda db: db.execute("PRAGMA busy_timeout = 0"))
        try:
            yield
        finally:
            with suppress(CacheError):  # closed meanwhile (a reload): nothing to restore
                self._run(lambda db: db.execute(f"PRAGMA busy_timeout = {int(BUSY_S * 1000)}"))

    @contextmanager
    def transaction(self) -> Iterator[Database]:
        """One write transaction around several calls (a pack replacing another,
        ``speakd.cache.packs``); the methods called inside join it."""
        with self._guard() as db, write_transaction(db):
            yield db

    def set_meta(self, key: str, value: str) -> None:
        self._run(lambda db: db["meta"].upsert({"key": key, "value": value}, pk="key"))

    def meta(self) -> dict[str, str]:
        return self._run(lambda db: {k: v for k, v in db.execute("SELECT key, value FROM meta")})
