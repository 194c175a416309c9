"""Moving in a journal an older speakd left at its old place, beside the cache.

A version before this one (perhaps run again by a downgrade) kept the journal there; every start
that finds one moves it in. First it is renamed, in its own directory, to a name no other file
ever had (``mqtt-journal.db.moving-<random>``), so a downgraded daemon makes a new file rather
than writing into the one being moved; then its pending rows are copied in the same transaction
that records that name in ``moved``; then it is removed. A crash after the rename copies it at the
next start, one after the copy only removes it: each row comes in once.
"""

from __future__ import annotations

import logging
import re
import secrets
import sqlite3
import time
from dataclasses import replace
from pathlib import Path

from speakd.mqtt.journal.schema import insert, pending_rows

log = logging.getLogger(__name__)

CLAIMED = re.compile(r"\.moving-[0-9a-f]{32}")  # an old journal being moved in


def claim(legacy: Path | None, path: str) -> None:
    """Rename the journal at its old place to a name of its own (module doc), after folding its
    WAL into it (the WAL file is named after the database: it would not follow). Before the new
    file is opened; a failure is logged and the start goes on (the next one tries again)."""
    if legacy is None or not legacy.exists() or legacy.resolve() == Path(path).resolve():
        return
    claimed = legacy.with_name(f"{legacy.name}.moving-{secrets.token_hex(16)}")
    try:
        old = sqlite3.connect(legacy, isolation_level=None)
        try:
            old.execute("PRAGMA journal_mode=DELETE")  # checkpoints and removes the WAL
        finally:
            old.close()
        legacy.rename(claimed)
    except (OSError, sqlite3.Error) as e:  # say why, and serve: the next start tries again
        log.error("MQTT journal: cannot move %s in (%s): its says wait for it", legacy, e)
        return
    log.info("MQTT journal: moving %s in (as %s)", legacy, claimed.name)


def move_in(db: sqlite3.Connection, legacy: Path | None) -> list[Path]:
    """Copy the pending rows of every claimed old journal not yet moved, inside the caller's
    transaction; returns the claimed files, to be removed once it committed."""
    if legacy is None:
        return []
    claimed = sorted(
        p
        for p in legacy.parent.glob(f"{legacy.name}.moving-*")
        if CLAIMED.fullmatch(p.name[len(legacy.name) :])
    )
    for path in claimed:
        if db.execute("SELECT 1 FROM moved WHERE source = ?", (path.name,)).fetchone():
            continue  # copied before a crash cut the removal short
        old = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            rows = [replace(e, seq=0) for e in pending_rows(old)]
        finally:
            old.close()
        insert(db, rows)
        db.execute("INSERT INTO moved VALUES (?, ?)", (path.name, time.time()))
        log.info("MQTT journal: %d pending says moved in from %s", len(rows), path)
    return claimed
