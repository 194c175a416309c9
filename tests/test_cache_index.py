"""The index the totals and the page's listing read (``clips_recent``) is never built by an open
of a cache made before it: the daemon serves at once and builds it in the background
(``speakd.cache.indexing``), and the listing reads through it from then on. Real SQLite files, a
real daemon.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

import speakd.cache.indexing
import speakd.cache.schema
import speakd.lifecycle.service
from speakd.cache.browse import browse
from speakd.cache.schema import BUSY_S, RECENT_INDEX, has_recent_index
from speakd.cache.store import CacheStore, Clip
from tests.daemon_proc import InProcessDaemon, write_config
from tests.http_daemon import free_port
from tests.tone_engine import ToneEngine
from tests.waits import wait_until

WAIT_S = 60  # for an event that takes milliseconds; only a regression waits this long


def clip(key: str, last_used: float, pinned: bool = False) -> Clip:
    return Clip(
        key=key, text=f"clip {key}", voice="v", params={}, bundle="b", sample_rate=16000,
        audio=b"\0\0" * 8000, pinned=pinned, last_used=last_used,
    )  # fmt: skip


def old_cache(path: Path, n: int = 30) -> None:
    """A cache as a version before the index left it: clips, no ``clips_recent``."""
    with CacheStore(path, max_bytes=1 << 40, ttl_s=0) as store:
        store.put_many([clip(f"k{i:02}", float(i), pinned=i % 3 == 0) for i in range(n)])
    with sqlite3.connect(path) as conn:
        conn.execute(f"DROP INDEX {RECENT_INDEX}")


def indexed(path: Path) -> bool:
    with sqlite3.connect(path) as conn:
        return has_recent_index(conn)


def test_a_new_cache_has_the_index_at_once(tmp_path: Path) -> None:
    with CacheStore(tmp_path / "new.db") as store:
        assert store.indexed() and indexed(store.path)


def test_opening_an_old_cache_does_not_build_the_index_and_the_page_answers_alike(
    tmp_path: Path,
) -> None:
    path = tmp_path / "cache.db"
    old_cache(path)
    with CacheStore(path, max_bytes=1 << 40) as store:
        assert not store.indexed() and not indexed(path)  # the open left it to the daemon
        found = browse(store, text="clip", limit=4)
        assert [c["key"] for c in found.clips] == ["k29", "k28", "k27", "k26"]
        assert found.matching == 30 and found.stats == store.stats()
        assert found.stats["clips"] == 30 and found.stats["pinned"] == 10
        assert found.stats["bytes"] == 30 * 16000
        pinned = browse(store, pinned_only=True, limit=2)
        assert [c["key"] for c in pinned.clips] == ["k27", "k24"] and pinned.matching == 10
        assert not indexed(path)  # nor did the listing or the totals
        assert speakd.cache.indexing.build(path, threading.Event())
        assert indexed(path) and browse(store, text="clip", limit=4).clips == found.clips
        assert store.stats() == found.stats


def test_a_stop_interrupts_the_build_and_rolls_it_back(tmp_path: Path) -> None:
    path = tmp_path / "cache.db"
    old_cache(path, 300)
    halt = threading.Event()
    halt.set()
    assert not speakd.cache.indexing.build(path, halt)
    assert not indexed(path)
    with CacheStore(path, max_bytes=1 << 40) as store:
        assert store.stats()["clips"] == 300 and not store.indexed()


def test_while_the_index_is_built_a_write_fails_at_once_and_hits_go_on(tmp_path: Path) -> None:
    """The build holds SQLite's write lock throughout: a store's write fails at once rather than
    hold the store (and every hit from disk behind it) for the 10 s busy timeout."""
    path = tmp_path / "cache.db"
    old_cache(path, 300)
    entered, release = threading.Event(), threading.Event()

    class HeldHalt:  # the build stops at its first look at the flag, the write lock held
        def is_set(self) -> bool:
            entered.set()
            release.wait(WAIT_S)
            return False

    with CacheStore(path, max_bytes=1 << 40) as store, ThreadPoolExecutor(1) as pool:
        building = pool.submit(speakd.cache.indexing.build_beside, store, HeldHalt())
        try:
            assert entered.wait(WAIT_S)
            t0 = time.monotonic()
            with pytest.raises(sqlite3.OperationalError, match="locked"):
                store.put(clip("new", 99.0))
            assert time.monotonic() - t0 < BUSY_S / 2  # before: waited out BUSY_S, then failed
            with pytest.raises(sqlite3.OperationalError, match="locked"):
                store.pin("k01")
            assert store.get("k01") is not None  # a hit from disk goes on
        finally:
            release.set()
        assert building.result(WAIT_S) is True and indexed(path)
        with store.transaction() as db:  # the busy timeout is back
            assert db.execute("PRAGMA busy_timeout").fetchone()[0] == BUSY_S * 1000
        store.put(clip("new", 99.0))
        assert store.get("new") is not None and store.stats()["clips"] == 301


def test_the_daemon_serves_then_builds_the_index_and_the_listing_reads_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    old_cache(tmp_path / "cache.db")
    built = threading.Event()
    seen: dict[str, bool] = {}
    real_build = speakd.cache.indexing.build

    def build(path: Path, halt: threading.Event) -> bool:
        seen["indexed_before"] = indexed(path)
        seen["built"] = real_build(path, halt)
        built.set()
        return seen["built"]

    statements: list[str] = []
    real_connect = speakd.cache.schema.connect_readonly

    def traced(path: Path) -> sqlite3.Connection:
        conn = real_connect(path)
        conn.set_trace_callback(statements.append)
        return conn

    monkeypatch.setattr(speakd.cache.indexing, "build", build)
    monkeypatch.setattr(speakd.cache.schema, "connect_readonly", traced)
    monkeypatch.setattr(speakd.lifecycle.service, "load_engine", lambda _config: ToneEngine())
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    d = InProcessDaemon(write_config(tmp_path, sink="null")).start()
    try:
        assert built.wait(WAIT_S), "the daemon never built the index"
        assert seen == {"indexed_before": False, "built": True}
        control = d.daemon.control
        assert control is not None
        listing = control.browse_cache("clip", pinned_only=False, limit=3)
        assert listing is not None and listing.matching == 30
        assert [c["key"] for c in listing.clips] == ["k29", "k28", "k27"]
        reads = [s for s in statements if "FROM clips" in s]  # the clips, their count, the totals
        assert len(reads) == 3 and all(f"FROM clips INDEXED BY {RECENT_INDEX}" in s for s in reads)
        assert listing.stats["clips"] >= 30  # and the fallback prompt, once stored
    finally:
        assert d.stop() == 0


def test_a_clip_made_while_the_daemon_builds_the_index_plays_and_is_counted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """During the build the daemon's store fails at once: the clip is played, counted in
    ``errors`` and made again later, a pin from the page gets a clear error to retry; once the
    index is built the clip is stored."""
    old_cache(tmp_path / "cache.db", 300)  # enough for the build to look at its flag
    entered, release = threading.Event(), threading.Event()
    real_build = speakd.cache.indexing.build

    class HeldHalt:  # the daemon's halt flag, the build held at its first look at it
        def __init__(self, halt: threading.Event) -> None:
            self.halt = halt

        def is_set(self) -> bool:
            entered.set()
            release.wait(WAIT_S)
            return self.halt.is_set()

    def held_build(path: Path, halt: threading.Event) -> bool:
        return real_build(path, HeldHalt(halt))

    monkeypatch.setattr(speakd.cache.indexing, "build", held_build)
    monkeypatch.setattr(speakd.lifecycle.service, "load_engine", lambda _config: ToneEngine())
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    port = free_port()
    http = f'[http]\nlisten = "127.0.0.1:{port}"\n'
    d = InProcessDaemon(write_config(tmp_path, http, sink="null")).start()
    try:
        assert entered.wait(WAIT_S), "the daemon never began the build"
        url = f"http://127.0.0.1:{port}/v1/cache/clips/k01/pin"
        refused = httpx.post(url, json={"pinned": True}, timeout=WAIT_S)
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "cache_locked"
        cache = lambda: d.status()["source"]["cache"]  # noqa: E731
        before = cache()  # the fallback prompt may be stored already
        errors, synth, stored = before["errors"], before["synth"], before["stored"]
        events = d.say("Made while the index is built.")
        assert events[-1]["event"] == "finished" and events[-1]["status"] == "done", events
        wait_until(lambda: cache()["errors"] == errors + 1, "the failed store, counted")
        assert cache()["stored"] == stored and not indexed(tmp_path / "cache.db")
        release.set()
        wait_until(lambda: indexed(tmp_path / "cache.db"), "the build, once released")
        d.say("Made while the index is built.")  # made again, and stored this time
        assert cache()["synth"] == synth + 2
        assert httpx.post(url, json={"pinned": True}, timeout=WAIT_S).status_code == 200
        wait_until(lambda: cache()["stored"] == stored + 1, "the clip stored after the build")
    finally:
        release.set()
        assert d.stop() == 0
