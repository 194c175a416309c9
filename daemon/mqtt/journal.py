"""The MQTT say journal: every say taken from the broker and not yet finished, on disk.

The promise (docs/reliability.md, "MQTT says across a crash, a stop and an upgrade"): a say the
daemon acknowledged (PUBACK) is spoken, once, whatever happens to the process — SIGKILL,
SIGTERM, an upgrade's restart. So a say is acknowledged only after its row is committed here;
the daemon queues the ``pending`` rows again when it starts (in their order, past every queue
limit); a clean stop leaves the rows of says it did not finish, so they are spoken after the
next start. A say that ended keeps its outcome in its row (``outcome``) until the broker has
acknowledged it (``sayFinished``, the reply): the row turns ``done`` only then, so a crash or a
broker away never loses an outcome, and a start publishes the kept outcomes instead of speaking
those says again.

A say that cannot be journaled (the file cannot be opened or written) is refused with the
retryable ``journal_unavailable`` on every reply path, then acknowledged: the client hears that
it was not taken. Holding the PUBACK instead (for the broker to redeliver on a reconnect) would
fill the broker's in-flight window (mosquitto's default is 20) while the disk stays full, and
behind it stop and cancel would stall too.

Redeliveries: the broker re-sends a say whose PUBACK it did not get (a crash or a dropped
connection between our commit and the PUBACK), with the DUP flag and its original packet
identifier. Such a say is a redelivery when the journal holds, unfinished or finished within
``window_s``, a say with the same packet identifier and the same topic and payload; it is then
answered ``duplicate`` and not spoken. Anything else is a new say and is spoken, even one that
reuses an ``id`` ("Door open" twice), and even a QoS 0 say (QoS 0 has no redelivery). QoS 0
says are journaled too: they come in order with QoS 1 ones, and a restart should not drop a
say the daemon took, whichever QoS it came with.

Writes run on one writer thread, never on the event loop: everything queued while one commit
runs goes into the next (group commit), and each caller's callback runs on the writer thread
once its commit returned (callers hand it to their loop). ``synchronous=FULL`` with WAL: each
commit fsyncs the WAL, so a committed say survives a power cut, not only a crash of the process
(NORMAL would fsync only at checkpoints: an acknowledged say could vanish with the power). The
fsync is the commit's whole cost (``speakd-tools bench journal``), paid once per group.

Its own SQLite file in the state directory (``[state] dir``): the cache may be wiped, rebuilt or
disabled without touching what was promised to MQTT clients. Schema version 3 (``user_version``)
keys rows by arrival (``seq``): two unfinished says with one id are two rows; version 2 (without
``outcome``) and version 1 (rows keyed by id) are migrated in place.

A journal at the old place beside the cache (a version before this one, perhaps run again by a
downgrade) is moved in at every start that finds it: first renamed, in its own directory, to a
name no other file ever had (``mqtt-journal.db.moving-<random>``), so a downgraded daemon makes a
new file rather than writing into the one being moved; then its pending rows are copied in the
same transaction that records that name in ``moved``; then it is removed. A crash after the
rename copies it at the next start, one after the copy only removes it: each row comes in once.

Bounded: at most ``max_pending`` says wait here (past it a say is refused as ``queue_full``) and
at most ``max_done`` finished ones are remembered for ``window_s``.
"""

from __future__ import annotations

import hashlib
import logging
import queue
import re
import secrets
import sqlite3
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

MAX_PENDING = 1000  # says accepted but not yet finished
MAX_DONE = 1024  # finished says remembered for redeliveries
WINDOW_S = 120.0  # longer than a reconnect: the broker redelivers within it
MAX_BATCH = 256  # operations in one commit
SCHEMA_VERSION = 3
CLAIMED = re.compile(r"\.moving-[0-9a-f]{32}")  # an old journal being moved in (module doc)

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
Done = Callable[[BaseException | None], None]  # a commit's outcome, on the writer thread


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


class JournalUnavailable(Exception):
    pass


@dataclass
class _Op:
    kind: str  # "add" | "report" | "finish" | "barrier" | "stop"
    entry: Entry | None = None
    seq: int = 0
    at: float = 0.0
    outcome: str = ""
    done: Done | None = None


class Journal:
    """Loop side: the index (what is pending, what a redelivery would repeat) lives in memory
    and is only touched by the caller's thread; the SQLite file only by the writer thread."""

    def __init__(
        self,
        path: Path | str,
        legacy: Path | None = None,
        max_pending: int = MAX_PENDING,
        max_done: int = MAX_DONE,
        window_s: float = WINDOW_S,
    ) -> None:
        """Open (migrate, move in ``legacy``) and read the file: blocking, so call it off the
        loop. A file that cannot be opened leaves the journal refusing says until it can."""
        self.path, self.legacy = str(path), legacy
        self.max_pending, self.max_done, self.window_s = max_pending, max_done, window_s
        self.error: str | None = None  # the last failure, until a commit succeeds
        self.failures = 0  # commits (or opens) that failed
        # pending at open, oldest first: the start speaks them, or publishes their outcome
        self.replay: list[Entry] = []
        self._pending: dict[int, Identity | None] = {}
        self._done: OrderedDict[Identity, float] = OrderedDict()  # finished, oldest first
        self._unfinished: dict[Identity, int] = {}
        self._next_seq = 1
        self._db: sqlite3.Connection | None = None
        self._unmarked: dict[int, float] = {}  # writer: finishes not yet committed
        self._outcomes: dict[int, str] = {}  # writer: outcomes not yet committed
        self._queue: queue.SimpleQueue[_Op] = queue.SimpleQueue()
        try:
            self._db = self._connect()
            self._load(self._db)
        except (OSError, sqlite3.Error) as e:
            self._db = None
            self._failed("cannot be opened", e)
            # Rows the file may hold are replayed at the next start; the says taken meanwhile
            # must not take their numbers when it opens later: start past any of them.
            self._next_seq = time.time_ns() // 1000
        self._thread = threading.Thread(target=self._run, name="mqtt-journal", daemon=True)
        self._thread.start()

    # ---- the loop's side -------------------------------------------------------------------

    @property
    def full(self) -> bool:
        return len(self._pending) >= self.max_pending

    @property
    def pending(self) -> int:
        return len(self._pending)

    def redelivery(self, identity: Identity) -> bool:
        """Does the journal hold the say this DUP-flagged one repeats (see the module doc)?"""
        if identity in self._unfinished:
            return True
        at = self._done.get(identity)
        return at is not None and time.time() - at <= self.window_s

    def add(
        self,
        topic: str,
        payload: bytes,
        response_topic: str | None,
        correlation: bytes | None,
        packet: int | None,
        done: Done,
    ) -> int:
        """Journal a say; ``done`` hears how its commit went. Returns its ``seq``."""
        seq, self._next_seq = self._next_seq, self._next_seq + 1
        entry = Entry(seq, topic, payload, response_topic, correlation, packet)
        self._pending[seq] = entry.identity
        if entry.identity is not None:
            self._unfinished[entry.identity] = seq
        self._queue.put(_Op("add", entry, done=done))
        return seq

    def report(self, seq: int, outcome: str) -> None:
        """The say ended with ``outcome`` (kept until ``finish``: a restart publishes it and
        does not speak the say again; a failed write is retried with the next commit)."""
        self._queue.put(_Op("report", seq=seq, outcome=outcome))

    def finish(self, seq: int) -> None:
        """The broker has the say's final outcome: remember it for ``window_s``, drop its payload (a
        mark that fails is retried with the next commit)."""
        identity = self._pending.pop(seq, None)
        now = time.time()
        if identity is not None:
            if self._unfinished.get(identity) == seq:
                del self._unfinished[identity]
            self._done[identity] = now
            self._done.move_to_end(identity)
            while len(self._done) > self.max_done:
                self._done.popitem(last=False)
        self._queue.put(_Op("finish", seq=seq, at=now))

    def forget(self, seq: int) -> None:
        """A say whose commit failed: it was never journaled (its redelivery is a new say)."""
        identity = self._pending.pop(seq, None)
        if identity is not None and self._unfinished.get(identity) == seq:
            del self._unfinished[identity]

    def barrier(self, done: Done) -> None:
        """``done`` runs after every operation queued before it."""
        self._queue.put(_Op("barrier", done=done))

    def status(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "pending": len(self._pending),
            "failures": self.failures,
            "error": self.error,
        }

    def close(self) -> None:
        """Commit what is queued, then close (blocking: call it off the loop)."""
        self._queue.put(_Op("stop"))
        self._thread.join()

    # ---- opening (the caller's thread, before the writer starts) ---------------------------

    def _connect(self) -> sqlite3.Connection:
        Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        self._claim_legacy()
        db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=FULL")  # committed = on disk, before the PUBACK
            db.execute("PRAGMA wal_autocheckpoint=64")  # a small WAL: rows are few and small
            db.execute("BEGIN IMMEDIATE")
            try:
                version = db.execute("PRAGMA user_version").fetchone()[0]
                if version > SCHEMA_VERSION:
                    raise sqlite3.DatabaseError(f"schema version {version} is newer than ours")
                rows: list[Entry] = []
                if _has_table(db, "says") and version < 2:
                    rows = _pending_rows(db)
                    db.execute("DROP TABLE says")
                    log.info("MQTT journal: %d pending says kept from schema version 1", len(rows))
                elif version == 2:
                    db.execute("ALTER TABLE says ADD COLUMN outcome TEXT")
                for statement in SCHEMA.split(";")[:-1]:  # not executescript: it would COMMIT
                    db.execute(statement)
                # = SCHEMA_VERSION, literal: PRAGMA takes no parameters
                db.execute("PRAGMA user_version = 3")
                _insert(db, rows)
                moved = self._move_in(db)
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise
        except BaseException:
            db.close()
            raise
        for claimed in moved:  # only once their rows are committed here
            claimed.unlink(missing_ok=True)
        return db

    def _claim_legacy(self) -> None:
        """Rename the journal at its old place to a name of its own (module doc), after folding
        its WAL into it (the WAL file is named after the database: it would not follow)."""
        legacy = self.legacy
        if legacy is None or not legacy.exists() or legacy.resolve() == Path(self.path).resolve():
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

    def _move_in(self, db: sqlite3.Connection) -> list[Path]:
        """Copy the pending rows of every claimed old journal not yet moved; returns the
        claimed files, to be removed after the commit."""
        if self.legacy is None:
            return []
        legacy = self.legacy
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
                rows = [replace(e, seq=0) for e in _pending_rows(old)]
            finally:
                old.close()
            _insert(db, rows)
            db.execute("INSERT INTO moved VALUES (?, ?)", (path.name, time.time()))
            log.info("MQTT journal: %d pending says moved in from %s", len(rows), path)
        return claimed

    def _load(self, db: sqlite3.Connection) -> None:
        self._next_seq = db.execute("SELECT coalesce(max(seq), 0) + 1 FROM says").fetchone()[0]
        self.replay = _pending_rows(db)
        for entry in self.replay:
            self._pending[entry.seq] = entry.identity
            if entry.identity is not None:
                self._unfinished[entry.identity] = entry.seq
        for packet, dig, at in db.execute(
            "SELECT packet, digest, done FROM says WHERE done >= ? AND packet IS NOT NULL"
            " ORDER BY done",
            (time.time() - self.window_s,),
        ):
            self._done[(packet, bytes(dig))] = at

    # ---- the writer thread -----------------------------------------------------------------

    def _run(self) -> None:
        while True:
            ops = [self._queue.get()]
            while len(ops) < MAX_BATCH:
                try:
                    ops.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            error = self._commit(ops)
            for op in ops:
                if op.done is not None:
                    try:
                        op.done(error if op.kind in ("add", "finish") else None)
                    except Exception:
                        log.exception("MQTT journal: a commit's callback failed")
            if any(op.kind == "stop" for op in ops):
                if self._db is not None:
                    self._db.close()
                return

    def _commit(self, ops: list[_Op]) -> BaseException | None:
        adds = [op.entry for op in ops if op.kind == "add" and op.entry is not None]
        for op in ops:
            if op.kind == "report":
                self._outcomes[op.seq] = op.outcome
            elif op.kind == "finish":
                self._unmarked[op.seq] = op.at
        if not adds and not self._unmarked and not self._outcomes:
            return None
        if self._db is None:
            try:
                self._db = self._connect()
            except (OSError, sqlite3.Error) as e:
                self._failed("cannot be opened", e)
                return JournalUnavailable(f"the MQTT journal {self.error}")
        db = self._db
        try:
            db.execute("BEGIN IMMEDIATE")
            try:
                _insert(db, adds)
                db.executemany(
                    "UPDATE says SET outcome = ? WHERE seq = ? AND done IS NULL",
                    [(outcome, seq) for seq, outcome in self._outcomes.items()],
                )
                if self._unmarked:
                    db.executemany(
                        "UPDATE says SET done = ?, payload = x'', outcome = NULL WHERE seq = ?",
                        [(at, seq) for seq, at in self._unmarked.items()],
                    )
                    db.execute(
                        "DELETE FROM says WHERE done IS NOT NULL AND (done < ? OR seq NOT IN"
                        " (SELECT seq FROM says WHERE done IS NOT NULL ORDER BY done DESC,"
                        " seq DESC LIMIT ?))",
                        (time.time() - self.window_s, self.max_done),
                    )
                db.execute("COMMIT")
            except BaseException:
                if db.in_transaction:
                    db.execute("ROLLBACK")
                raise
        except (OSError, sqlite3.Error) as e:
            self._failed("cannot be written", e)
            return JournalUnavailable(f"the MQTT journal {self.error}")
        self._unmarked.clear()
        self._outcomes.clear()
        if self.error is not None:
            log.warning("MQTT journal %s works again", self.path)
        self.error = None
        return None

    def _failed(self, what: str, e: BaseException) -> None:
        if self.error is None:  # once per outage, not once per say
            log.error(
                "MQTT journal %s %s (%s): says are refused (journal_unavailable) until it works",
                self.path,
                what,
                e,
            )
        self.failures += 1
        self.error = f"{self.path} {what}: {e}"


def _has_table(db: sqlite3.Connection, name: str) -> bool:
    row = db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (name,))
    return row.fetchone() is not None


def _pending_rows(db: sqlite3.Connection) -> list[Entry]:
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


def _insert(db: sqlite3.Connection, entries: list[Entry]) -> None:
    """Rows from another file come with seq 0: they take the next numbers, in order."""
    db.executemany(
        "INSERT INTO says (seq, topic, payload, response_topic, correlation, packet, digest,"
        " outcome) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        [(e.seq or None, *_fields(e)) for e in entries],
    )


def _fields(e: Entry) -> tuple[Any, ...]:
    dig = digest(e.topic, e.payload)
    return e.topic, e.payload, e.response_topic, e.correlation, e.packet, dig, e.outcome
