"""The page's view of the cache (docs/http.md, "The page"): the most recently used clips that
match a search, how many match, and the cache's totals.

It reads on a read-only connection of its own, opened for each listing, and never takes the
store's lock: in WAL mode a reader and the writer do not wait for each other, so a clip being
stored (before a stream's end), a hit read from disk and a pin go on while the page lists (it
refreshes every 3 s while open). The rows come from the ``clips_recent`` index, most recently
used first, and stop at ``limit``: only the text search reads every clip's row, and then only its
first page, never its audio. In a cache made before that index, until the daemon has built it
(``speakd.cache.indexing``), the same queries read the clips themselves: slower, never wrong.
"""

from __future__ import annotations

import sqlite3
from contextlib import closing
from dataclasses import dataclass
from typing import Any

from speakd.cache import schema
from speakd.cache.store import CacheStore

LISTED = ("key", "text", "voice", "params", "duration", "pinned", "hits", "bytes", "last_used")
COLUMNS = ", ".join(LISTED)
_WHERE = "(:pinned = 0 OR pinned = 1) AND (:q = '' OR has_text(text, :q))"


@dataclass(frozen=True)
class Listing:
    clips: list[dict[str, Any]]  # at most ``limit``, most recently used first
    matching: int  # how many clips match in all
    stats: dict[str, Any]  # CacheStore.stats()


def _has_text(text: str | None, query: str) -> bool:
    """Python's casefold, not SQLite's ASCII-only LIKE: "STRASSE" finds "Straße"."""
    return query in (text or "").casefold()


def connect_readonly(store: CacheStore) -> sqlite3.Connection:
    """A read-only connection to the store's file (the same file a moved-aside cache was
    replaced by, since it is opened by path)."""
    conn = schema.connect_readonly(store.path)
    conn.create_function("has_text", 2, _has_text, deterministic=True)
    return conn


def browse(store: CacheStore, *, text: str = "", pinned_only: bool = False, limit: int) -> Listing:
    """One consistent snapshot (a read transaction) of the matching clips, their count and the
    totals; blocking (call it off the event loop)."""
    args = {"pinned": int(pinned_only), "q": text.casefold(), "limit": limit}
    with closing(connect_readonly(store)) as conn:
        conn.execute("BEGIN")
        source = store.clips_from(conn)
        rows = conn.execute(
            f"SELECT {COLUMNS} FROM {source} WHERE {_WHERE} ORDER BY last_used DESC LIMIT :limit",
            args,
        ).fetchall()
        matching = conn.execute(f"SELECT COUNT(*) FROM {source} WHERE {_WHERE}", args).fetchone()[0]
        stats = store.stats_from(conn)
        conn.rollback()
    clips = [{k: row[k] for k in LISTED} | {"pinned": bool(row["pinned"])} for row in rows]
    return Listing(clips, matching, stats)
