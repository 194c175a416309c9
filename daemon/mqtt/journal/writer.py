"""The MQTT journal's file and the one thread that writes it.

Writes run on one writer thread, never on the event loop: everything queued while one commit runs
goes into the next (group commit), and each caller's callback runs on the writer thread once its
commit returned (callers hand it to their loop). ``synchronous=FULL`` with WAL: each commit
fsyncs the WAL, so a committed say survives a power cut, not only a crash of the process (NORMAL
would fsync only at checkpoints: an acknowledged say could vanish with the power). The fsync is
the commit's whole cost (``speakd-tools bench journal``), paid once per group.

A file that cannot be opened or written is reported once per outage (``error``, ``failures``);
every commit tries again, so says are taken again as soon as it works.
"""

from __future__ import annotations

import logging
import queue
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from speakd.mqtt.journal.movein import claim, move_in
from speakd.mqtt.journal.schema import Entry, insert, migrate

log = logging.getLogger(__name__)

MAX_BATCH = 256  # operations in one commit

Done = Callable[[BaseException | None], None]  # a commit's outcome, on the writer thread


class JournalUnavailable(Exception):
    pass


@dataclass
class Op:
    kind: str  # "add" | "report" | "finish" | "barrier" | "stop"
    entry: Entry | None = None
    seq: int = 0
    at: float = 0.0
    outcome: str = ""
    done: Done | None = None


def connect(path: str, legacy: Path | None) -> sqlite3.Connection:
    """Open the file: migrated and any old journal moved in, in one transaction (blocking)."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    claim(legacy, path)
    db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    try:
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=FULL")  # committed = on disk, before the PUBACK
        db.execute("PRAGMA wal_autocheckpoint=64")  # a small WAL: rows are few and small
        db.execute("BEGIN IMMEDIATE")
        try:
            migrate(db)
            moved = move_in(db, legacy)
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


class Writer:
    """Owns the connection: opened by the caller before ``start``, then only by the thread."""

    def __init__(self, path: str, legacy: Path | None, max_done: int, window_s: float) -> None:
        self.path, self.legacy = path, legacy
        self.max_done, self.window_s = max_done, window_s
        self.error: str | None = None  # the last failure, until a commit succeeds
        self.failures = 0  # commits (or opens) that failed
        self.db: sqlite3.Connection | None = None
        self._unmarked: dict[int, float] = {}  # finishes not yet committed
        self._outcomes: dict[int, str] = {}  # outcomes not yet committed
        self._queue: queue.SimpleQueue[Op] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="mqtt-journal", daemon=True)

    def open(self) -> sqlite3.Connection:
        """The first open, on the caller's thread (a failed one is retried by each commit)."""
        self.db = connect(self.path, self.legacy)
        return self.db

    def start(self) -> None:
        self._thread.start()

    def put(self, op: Op) -> None:
        self._queue.put(op)

    def close(self) -> None:
        """Commit what is queued, then close (blocking)."""
        self._queue.put(Op("stop"))
        self._thread.join()

    def failed(self, what: str, e: BaseException) -> None:
        if self.error is None:  # once per outage, not once per say
            log.error(
                "MQTT journal %s %s (%s): says are refused (journal_unavailable) until it works",
                self.path,
                what,
                e,
            )
        self.failures += 1
        self.error = f"{self.path} {what}: {e}"

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
                if self.db is not None:
                    self.db.close()
                return

    def _commit(self, ops: list[Op]) -> BaseException | None:
        adds = [op.entry for op in ops if op.kind == "add" and op.entry is not None]
        for op in ops:
            if op.kind == "report":
                self._outcomes[op.seq] = op.outcome
            elif op.kind == "finish":
                self._unmarked[op.seq] = op.at
        if not adds and not self._unmarked and not self._outcomes:
            return None
        if self.db is None:
            try:
                self.db = connect(self.path, self.legacy)
            except (OSError, sqlite3.Error) as e:
                self.failed("cannot be opened", e)
                return JournalUnavailable(f"the MQTT journal {self.error}")
        db = self.db
        try:
            db.execute("BEGIN IMMEDIATE")
            try:
                insert(db, adds)
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
            self.failed("cannot be written", e)
            return JournalUnavailable(f"the MQTT journal {self.error}")
        self._unmarked.clear()
        self._outcomes.clear()
        if self.error is not None:
            log.warning("MQTT journal %s works again", self.path)
        self.error = None
        return None
