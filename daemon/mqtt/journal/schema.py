"""What the MQTT journal holds on disk: one row per say (``says``), how a row reads back, and how
an older file is brought to the current schema.

Schema version 3 (``user_version``) keys rows by arrival (``seq``): two unfinished says with one
id are two rows. Version 2 (without ``outcome``) gains the column in place; version 1 (rows keyed
by the say's id) keeps its pending rows, renumbered in their order. ``moved`` names the old
journals already copied in (``movein.py``).
"""

from __future__ import annotations

import hashlib
import logging
import sqlite3
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

SCHEMA_VERSION = 3

SCHEMA = """
CREATE TABLE IF NOT EXISTS says (
    seq INTEGER PRIMARY KEY,    -- arrival order
    topic TEXT NOT NULL,
    payload BLOB NOT NULL,      -- emptied once done
    response_topic TEXT,
    correlation BLOB,
    packet INTEGER,             -- the broker's packet identifier (QoS 1), else NULL
    digest BLOB NOT NULL,       -- of topic and payload: with packet, what a redelivery repeats
    done REAL,                  -- when the broker had its outcome (wall clock), NULL till then
    outcome TEXT                -- once it ended: its final event (JSON), to publish again
);
CREATE TABLE IF NOT EXISTS moved (source TEXT PRIMARY KEY, at REAL NOT NULL);
"""

Identity = tuple[int, bytes]  # (packet identifier, digest)


def digest(topic: str, payload: bytes) -> bytes:
    return hashlib.sha256(topic.encode() + b"\0" + payload).digest()[:16]


@dataclass(frozen=True)
class Entry:
    """A journaled say, as it arrived (replayed through the same path as a live one)."""

    seq: int
    topic: str
    payload: bytes
    response_topic: str | None
    correlation: bytes | None
    packet: int | None = None
    outcome: str | None = None  # it ended: publish this outcome, do not speak it again

    @property
    def identity(self) -> Identity | None:
        return None if self.packet is None else (self.packet, digest(self.topic, self.payload))


def migrate(db: sqlite3.Connection) -> None:
    """Bring the file to SCHEMA_VERSION, inside the caller's transaction; a newer file is
    refused (``sqlite3.DatabaseError``) rather than written in a form its version cannot read."""
    version = db.execute("PRAGMA user_version").fetchone()[0]
    if version > SCHEMA_VERSION:
        raise sqlite3.DatabaseError(f"schema version {version} is newer than ours")
    rows: list[Entry] = []
    if _has_table(db, "says") and version < 2:
        rows = pending_rows(db)
        db.execute("DROP TABLE says")
        log.info("MQTT journal: %d pending says kept from schema version 1", len(rows))
    elif version == 2:
        db.execute("ALTER TABLE says ADD COLUMN outcome TEXT")
    for statement in SCHEMA.split(";")[:-1]:  # not executescript: it would COMMIT
        db.execute(statement)
    db.execute("PRAGMA user_version = 3")  # = SCHEMA_VERSION, literal: PRAGMA takes no parameters
    insert(db, rows)


def pending_rows(db: sqlite3.Connection) -> list[Entry]:
    """The says not done, oldest first, from a journal of any schema version."""
    if db.execute("PRAGMA user_version").fetchone()[0] < 2:  # keyed by the say's id
        rows = db.execute(
            "SELECT topic, payload, response_topic, correlation FROM says WHERE done IS NULL"
            " ORDER BY rowid"
        ).fetchall()
        return [Entry(0, t, bytes(p), r, c) for t, p, r, c in rows]
    has_outcome = any(row[1] == "outcome" for row in db.execute("PRAGMA table_info(says)"))
    rows = db.execute(
        "SELECT seq, topic, payload, response_topic, correlation, packet, outcome FROM says"
        " WHERE done IS NULL ORDER BY seq"
        if has_outcome  # schema 3
        else "SELECT seq, topic, payload, response_topic, correlation, packet, NULL FROM says"
        " WHERE done IS NULL ORDER BY seq"
    ).fetchall()
    return [Entry(s, t, bytes(p), r, c, k, o) for s, t, p, r, c, k, o in rows]


def insert(db: sqlite3.Connection, entries: list[Entry]) -> None:
    """Rows from another file come with seq 0: they take the next numbers, in order."""
    db.executemany(
        "INSERT INTO says (seq, topic, payload, response_topic, correlation, packet, digest,"
        " outcome) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        [(e.seq or None, *_fields(e)) for e in entries],
    )


def _has_table(db: sqlite3.Connection, name: str) -> bool:
    row = db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (name,))
    return row.fetchone() is not None


def _fields(e: Entry) -> tuple[Any, ...]:
    dig = digest(e.topic, e.payload)
    return e.topic, e.payload, e.response_topic, e.correlation, e.packet, dig, e.outcome
