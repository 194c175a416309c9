"""The cache file as SQLite sees it: opening it (WAL, ``synchronous=FULL``), its schema version
and migrations, telling a damaged file from a busy one, and moving a damaged one aside.

``speakd.cache.store`` opens the file through ``connect`` and runs every query; what is here
changes only when the file's layout does (append a migration, never edit one).
"""

from __future__ import annotations

import logging
import random
import sqlite3
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlite_utils import Database

log = logging.getLogger(__name__)

SCHEMA_VERSION = 2
SQLITE_MAGIC = b"SQLite format 3\x00"
BUSY_S = 10.0  # how long a write waits for another connection's (then "database is locked")
SIDECARS = ("-wal", "-shm", "-journal")  # what SQLite writes beside a database
_CORRUPT_CODES = {11, 26}  # SQLITE_CORRUPT, SQLITE_NOTADB (primary result codes)
# The index the cache's totals and the page's listing read instead of the clips: a clip's audio
# sits before its duration, hits, bytes and last use in the row, so a scan of the table walks
# every clip's overflow pages (20 000 clips: 200–300 ms).
RECENT_INDEX = "clips_recent"
RECENT_INDEX_SQL = (
    f"CREATE INDEX IF NOT EXISTS {RECENT_INDEX}"
    " ON clips(last_used, pinned, expires, hits, bytes, duration)"
)


class CacheError(Exception):
    """The cache cannot be used as asked; the message names the file."""


def is_corruption(e: BaseException) -> bool:
    code = getattr(e, "sqlite_errorcode", None)
    return (
        isinstance(e, sqlite3.DatabaseError)
        and code is not None
        and code & 0xFF in (_CORRUPT_CODES)
    )


@contextmanager
def write_transaction(db: Database) -> Iterator[None]:
    """A write transaction that takes the write lock up front (BEGIN IMMEDIATE).

    A deferred BEGIN that reads and then writes fails at once with "database is locked" when
    another connection (the daemon vs `speakd cache import`) committed in between; IMMEDIATE
    waits for the lock under the busy timeout instead.
    """
    if db.conn.in_transaction:
        yield
        return
    db.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        db.rollback()
        raise
    db.execute("COMMIT")


def _v1(db: Database) -> None:
    db["meta"].create({"key": str, "value": str}, pk="key", if_not_exists=True)
    db["clips"].create(
        {
            "key": str,
            "text": str,
            "voice": str,
            "params": str,
            "bundle": str,
            "sample_rate": int,
            "encoding": str,
            "audio": bytes,
            "duration": float,
            "pinned": int,
            "created": float,
            "expires": float,
            "last_used": float,
            "hits": int,
            "bytes": int,
        },
        pk="key",
        not_null={"text", "voice", "params", "bundle", "sample_rate", "encoding", "audio"},
        defaults={"pinned": 0, "hits": 0},
    )
    db["clips"].create_index(["pinned", "last_used"], index_name="clips_lru")
    db["clips"].create_index(["bundle", "pinned"], index_name="clips_bundle")


def _v2(db: Database) -> None:
    """Word timings (JSON ``[[text, start, end, kind], …]``); NULL for clips stored before."""
    db["clips"].add_column("words", str)


# MIGRATIONS[n] takes a database at schema version n to n + 1; append, never edit.
MIGRATIONS: list[Callable[[Database], None]] = [_v1, _v2]
assert len(MIGRATIONS) == SCHEMA_VERSION


def _enable_wal(db: Database, attempts: int = 100) -> None:
    """Switching a fresh file to WAL needs an exclusive lock, and SQLite answers "database is
    locked" at once (no busy wait) while another process is doing the same: retry briefly."""
    for attempt in range(attempts):
        try:
            db.enable_wal()
            return
        except sqlite3.OperationalError as e:
            if "locked" not in str(e) or attempt == attempts - 1:
                raise
            time.sleep(0.02 + random.random() * 0.05)


def connect(path: Path) -> tuple[Database, tuple[int, int]]:
    """The file opened, in WAL mode and migrated, with its (device, inode); raises
    ``sqlite3.DatabaseError`` for a file that is not a database or is damaged."""
    if path.exists() and path.stat().st_size >= len(SQLITE_MAGIC):
        with path.open("rb") as f:
            if f.read(len(SQLITE_MAGIC)) != SQLITE_MAGIC:
                err = sqlite3.DatabaseError("file is not a database (bad header)")
                err.sqlite_errorcode = 26  # type: ignore[attr-defined]
                raise err
    conn = sqlite3.connect(str(path), check_same_thread=False, timeout=BUSY_S)
    try:
        db = Database(conn, execute_plugins=False)
        _enable_wal(db)
        db.execute("PRAGMA synchronous=FULL")
        migrate(db, path)
        add_extras(db)
        db.execute("SELECT COUNT(*) FROM clips").fetchone()
    except BaseException:
        conn.close()
        raise
    st = path.stat()
    return db, (st.st_dev, st.st_ino)


def add_extras(db: Database) -> None:
    """What this version adds that an older one ignores, so not a migration (the schema version
    stays, and a downgrade keeps its cache): made when missing at every open.

    - ``request``: what a clip was prepared with (``Clip.request``), for a re-synthesis;
    - ``clips_recent`` (``RECENT_INDEX``), here only while the clips table is empty (a new file:
      free). Over existing clips the build reads every clip's audio and holds the write lock
      throughout (minutes for gigabytes on an SD card): ``speakd.cache.indexing`` makes it
      after the daemon is ready, never an open.
    """
    if "request" not in db["clips"].columns_dict:
        with write_transaction(db):
            if "request" not in db["clips"].columns_dict:  # another process just added it
                db["clips"].add_column("request", str)
    empty = db.execute("SELECT 1 FROM clips LIMIT 1").fetchone() is None
    if empty and not has_recent_index(db.conn):
        db.execute(RECENT_INDEX_SQL)


def has_recent_index(conn: sqlite3.Connection) -> bool:
    """Whether ``RECENT_INDEX`` exists (read from the schema, no table touched)."""
    row = conn.execute(
        "SELECT 1 FROM sqlite_master WHERE type = 'index' AND name = ?", [RECENT_INDEX]
    ).fetchone()
    return row is not None


def connect_readonly(path: Path) -> sqlite3.Connection:
    """A read-only connection of its own to ``path`` (the page's listing, the totals): in WAL
    mode it neither waits for the store's writer nor holds it up."""
    uri = path.resolve().as_uri() + "?mode=ro"
    conn = sqlite3.connect(uri, uri=True, timeout=BUSY_S, check_same_thread=False)
    conn.row_factory = sqlite3.Row
    return conn


def migrate(db: Database, path: Path) -> None:
    if schema_version(db, path) == SCHEMA_VERSION:
        return
    with write_transaction(db):  # re-read under the lock: another process may have just migrated
        version = schema_version(db, path)
        if version == 0 and db["clips"].exists():
            raise CacheError(f"{path}: has a clips table but no schema version")
        for n in range(version, SCHEMA_VERSION):
            MIGRATIONS[n](db)
            db["meta"].upsert({"key": "schema_version", "value": str(n + 1)}, pk="key")
    if version < SCHEMA_VERSION:
        log.info("cache %s: schema %d → %d", path, version, SCHEMA_VERSION)


def schema_version(db: Database, path: Path) -> int:
    version = 0
    if db["meta"].exists():
        row = db.execute("SELECT value FROM meta WHERE key = ?", ["schema_version"]).fetchone()
        version = int(row[0]) if row else 0
    if version > SCHEMA_VERSION:
        raise CacheError(
            f"{path}: schema version {version} is newer than this speakd understands "
            f"({SCHEMA_VERSION}); upgrade speakd or point cache.path elsewhere"
        )
    return version


def database_files(db: Path) -> list[Path]:
    """A database and the files SQLite writes beside it (``SIDECARS``) that exist now: whoever
    writes the database must write each (``speakd doctor``'s paths check)."""
    return [db, *(f for s in SIDECARS if (f := Path(f"{db}{s}")).exists())]


def move_aside(path: Path, reason: str) -> str:
    """A damaged file (and its -wal and -shm) renamed to ``<name>.corrupt-<UTC time>``: where."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    target = path.with_name(f"{path.name}.corrupt-{stamp}")
    for suffix in ("", "-wal", "-shm"):
        src = Path(f"{path}{suffix}")
        if src.exists():
            src.rename(Path(f"{target}{suffix}"))
    log.error(
        "cache database %s is damaged (%s): moved it to %s and started an empty cache; "
        "re-import prompt packs with `speakd cache import PACK`",
        path,
        reason,
        target,
    )
    return str(target)
