"""Builds ``clips_recent`` (``speakd.cache.schema.RECENT_INDEX``) in a cache made before it, in
the background once the daemon serves (docs/cache.md, "The page's index").

Not at open: the build reads every clip's audio (the indexed columns sit after it in the row)
and holds SQLite's write lock throughout — seconds for hundreds of megabytes, minutes for
gigabytes on an SD card. At open it would run before READY=1, outside systemd's start timeout,
which kills the start and rolls the build back, again at every restart. Here it runs once per
file and process, on a connection and a thread of its own, after the daemon is ready and while
no synthesis is in flight. Meanwhile the store's writes fail at once ("database is locked")
instead of each holding the store — and the hits read from disk behind it — for the 10 s busy
timeout and failing then: a clip made is played, counted in ``errors``, logged and made again
next time; hit counters stay batched and are written after; a pin or an import is refused. A
stop interrupts the build (rolled back, made again at the next start); until it is done, the
totals and the page's listing read the clips.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from pathlib import Path

from speakd.cache.schema import BUSY_S, RECENT_INDEX, RECENT_INDEX_SQL, CacheError, has_recent_index
from speakd.cache.store import CacheStore

log = logging.getLogger(__name__)

THREAD_NAME = "speakd-cache-index"
CHECK_EVERY = 1_000  # SQLite VM steps between looks at the halt flag

_tried: set[tuple[int, int]] = set()  # (device, inode) of every file built or tried
_tried_lock = threading.Lock()


def build_in_background(store: CacheStore, halt: threading.Event) -> threading.Thread | None:
    """The build started on a thread of its own, or None when the store's file was built or
    tried already in this process (a failed build waits for the next start)."""
    try:
        st = store.path.stat()
    except OSError:
        return None
    with _tried_lock:
        if (st.st_dev, st.st_ino) in _tried:
            return None
        _tried.add((st.st_dev, st.st_ino))
    thread = threading.Thread(
        target=build_beside, args=(store, halt), name=THREAD_NAME, daemon=True
    )
    thread.start()
    return thread


def build_beside(store: CacheStore, halt: threading.Event) -> bool:
    """``build`` while ``store`` serves: its writes fail at once meanwhile (``writes_fail_fast``)
    rather than hold up its hits for the busy timeout each."""
    try:
        if store.indexed():
            return False
        with store.writes_fail_fast():
            return build(store.path, halt)
    except (CacheError, sqlite3.Error) as e:  # closed by a reload, or unreadable now
        log.warning("cache %s: index %s not built: %s", store.path, RECENT_INDEX, e)
        return False


def build(path: Path, halt: threading.Event) -> bool:
    """Make the index on a connection of its own; True when it was made now. Blocking; stops
    (rolled back) soon after ``halt`` is set."""
    conn = sqlite3.connect(str(path), timeout=BUSY_S)  # waits for a write in progress
    try:
        if has_recent_index(conn):
            return False
        size = (
            conn.execute("PRAGMA page_count").fetchone()[0]
            * conn.execute("PRAGMA page_size").fetchone()[0]
        )
        log.info(
            "cache %s: building index %s over %.0f MB in the background; until it is done, "
            "clips made are played but not stored",
            path,
            RECENT_INDEX,
            size / 1e6,
        )
        t0 = time.monotonic()
        conn.set_progress_handler(halt.is_set, CHECK_EVERY)
        conn.execute(RECENT_INDEX_SQL)
        log.info("cache %s: index %s built in %.1f s", path, RECENT_INDEX, time.monotonic() - t0)
        return True
    except sqlite3.Error as e:
        log.warning(
            "cache %s: index %s not built (%s); the totals and the page's listing read every "
            "clip until the next start builds it",
            path,
            RECENT_INDEX,
            "stopping" if halt.is_set() else e,
        )
        return False
    finally:
        conn.close()
