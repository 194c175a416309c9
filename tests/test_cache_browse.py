"""The page's listing of the cache (``speakd.cache.browse``, ``GET /v1/cache/clips``) reads beside
the store, not behind its lock: a write in progress does not hold up the page, and a listing in
progress does not hold up a clip being stored or read. Real SQLite files, a real daemon over HTTP.
"""

from __future__ import annotations

import sqlite3
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

import speakd.cache.browse
import speakd.lifecycle.service
from speakd.cache.browse import browse
from speakd.cache.store import CacheStore, Clip
from tests.daemon_proc import InProcessDaemon, write_config
from tests.http_daemon import free_port
from tests.tone_engine import ToneEngine

WAIT_S = 30  # for an event that takes milliseconds; only a regression waits this long


def clip(key: str, text: str, last_used: float, pinned: bool = False) -> Clip:
    return Clip(
        key=key, text=text, voice="v", params={}, bundle="b", sample_rate=16000,
        audio=b"\0\0" * 8000, pinned=pinned, last_used=last_used,
    )  # fmt: skip


def test_listing_is_the_newest_matching_clips_their_count_and_the_totals(tmp_path: Path) -> None:
    with CacheStore(tmp_path / "cache.db") as store:
        store.put_many(
            [clip(f"k{i}", f"Straße {i}", float(i), pinned=i % 3 == 0) for i in range(9)]
        )
        found = browse(store, text="STRASSE", limit=4)
        assert [c["key"] for c in found.clips] == ["k8", "k7", "k6", "k5"]
        assert found.matching == 9 and found.stats == store.stats()
        assert found.stats["clips"] == 9 and found.stats["pinned"] == 3
        pinned = browse(store, pinned_only=True, limit=10)
        assert [c["key"] for c in pinned.clips] == ["k6", "k3", "k0"]
        assert all(c["pinned"] is True for c in pinned.clips) and pinned.matching == 3
        assert browse(store, text="1", limit=10).matching == 1
        # the totals and the listing come from the index, never a scan of the clips' rows
        plan = sqlite3.connect(store.path).execute(
            "EXPLAIN QUERY PLAN SELECT COUNT(*), SUM(bytes) FROM clips INDEXED BY clips_recent"
        )
        assert "COVERING INDEX clips_recent" in " ".join(str(r[-1]) for r in plan)


def test_a_listing_in_progress_does_not_hold_up_a_store_or_a_hit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    entered, release = threading.Event(), threading.Event()

    def held_search(text: str | None, query: str) -> bool:  # the listing stops mid-scan here
        entered.set()
        assert release.wait(WAIT_S)
        return query in (text or "").casefold()

    monkeypatch.setattr(speakd.cache.browse, "_has_text", held_search)
    with CacheStore(tmp_path / "cache.db") as store, ThreadPoolExecutor(1) as pool:
        store.put(clip("old", "an old clip", 1.0))
        listing = pool.submit(browse, store, text="clip", limit=10)
        assert entered.wait(WAIT_S)
        store.put(clip("new", "a new clip", 2.0))  # with the old lock: waits out WAIT_S, fails
        assert store.get("old") is not None and store.pin("new")
        release.set()
        assert listing.result(WAIT_S).matching in (1, 2)


def test_the_page_answers_while_the_store_is_writing(tmp_path: Path) -> None:
    """A long write (a pack import) holds the store; the page's listing does not queue behind it,
    and sees what was committed before it."""
    port = free_port()
    http = f'[http]\nlisten = "127.0.0.1:{port}"\n'
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(speakd.lifecycle.service, "load_engine", lambda _config: ToneEngine())
        mp.delenv("NOTIFY_SOCKET", raising=False)
        d = InProcessDaemon(write_config(tmp_path, http, sink="null")).start()
    try:
        d.say("Cached before the write.")
        store = d.daemon.control.cache_store()
        assert store is not None
        url = f"http://127.0.0.1:{port}/v1/cache/clips"
        before = httpx.get(url, timeout=WAIT_S).json()["stats"]["clips"]
        with store.transaction():
            store.put(clip("uncommitted", "not yet there", 9e9))
            answer = httpx.get(url, params={"q": "cached"}, timeout=WAIT_S).json()
        assert [c["text"] for c in answer["clips"]] == ["Cached before the write."]
        assert answer["matching"] == 1 and answer["stats"]["clips"] == before
        assert httpx.get(url, timeout=WAIT_S).json()["clips"][0]["key"] == "uncommitted"
    finally:
        assert d.stop() == 0
