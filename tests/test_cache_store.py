"""The cache database on real SQLite files: keys, TTL jitter, LRU budget, pinning, schema,
corruption recovery, crash safety under SIGKILL, prompt-pack import/export and the CLI."""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import os
import random
import signal
import sqlite3
import time
from pathlib import Path

import pytest

from speakd.cache.packs import export_pack, import_pack
from speakd.cache.schema import MIGRATIONS, SCHEMA_VERSION, CacheError
from speakd.cache.store import CacheStore, Clip
from speakd.cli import main as speakd_main
from speakd.engines.base import SynthesisConfig
from speakd.engines.keys import audio_key
from tests.tone_engine import ToneEngine


def clip(key: str, n_bytes: int = 200, pinned: bool = False, **kw) -> Clip:
    audio = (hashlib.sha256(key.encode()).digest() * (n_bytes // 32 + 1))[:n_bytes]
    return Clip(
        key=key,
        text=f"text {key}",
        voice="low",
        params={"voice": "low"},
        bundle="tone-1",
        sample_rate=16000,
        audio=audio,
        pinned=pinned,
        **kw,
    )


# ---- keys -------------------------------------------------------------------------------


def test_key_changes_with_everything_that_changes_the_audio_and_nothing_else() -> None:
    engine = ToneEngine()
    base = audio_key(engine, "Hello  world", SynthesisConfig())
    assert base == audio_key(engine, " Hello world ", SynthesisConfig())  # normalised text
    assert base == audio_key(engine, "Hello world", SynthesisConfig(voice="low"))  # = default
    changed = {
        audio_key(engine, "Hello world!", SynthesisConfig()),
        audio_key(engine, "Hello world", SynthesisConfig(voice="high")),
        audio_key(engine, "Hello world", SynthesisConfig(speed=1.5)),
        audio_key(engine, "Hello world", SynthesisConfig(seed=7)),
    }
    other_bundle = ToneEngine()
    other_bundle.bundle_id = "tone-2"
    changed.add(audio_key(other_bundle, "Hello world", SynthesisConfig()))
    assert len(changed) == 5 and base not in changed
    assert len(base) == 64 and int(base, 16) >= 0


# ---- rows, schema, TTL, LRU ----------------------------------------------------------------


def test_row_round_trip_wal_and_schema_version(tmp_path: Path) -> None:
    path = tmp_path / "c.db"
    with CacheStore(path) as store:
        c = clip("a", 3200)
        store.put(c)
        got = store.get("a")
        assert got is not None and got.audio == c.audio and got.params == {"voice": "low"}
        assert got.duration == pytest.approx(0.1)
        assert store.get("missing") is None
    raw = sqlite3.connect(path)
    assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    meta = dict(raw.execute("SELECT key, value FROM meta"))
    assert meta["schema_version"] == str(SCHEMA_VERSION)
    cols = {r[1] for r in raw.execute("PRAGMA table_info(clips)")}
    assert cols == {
        "key", "text", "voice", "params", "bundle", "sample_rate", "encoding", "audio",
        "duration", "pinned", "created", "expires", "last_used", "hits", "bytes", "words",
        "request",
    }  # fmt: skip
    assert raw.execute("SELECT encoding, bytes FROM clips").fetchone() == ("pcm_s16le", 3200)


def test_a_schema_1_cache_keeps_its_clips_and_gains_word_timings(tmp_path: Path) -> None:
    from sqlite_utils import Database

    from speakd.audio import Word

    path = tmp_path / "c.db"
    old = Database(sqlite3.connect(path))
    MIGRATIONS[0](old)
    old["meta"].insert({"key": "schema_version", "value": "1"})
    before = clip("old", 3200)
    row = before.row()
    del row["words"], row["request"]  # columns added since
    old["clips"].insert(row)
    old.conn.commit()
    old.conn.close()
    words = (Word("Hello", 10, 800), Word("world", 900, 1500))
    with CacheStore(path) as store:
        assert store.stats()["schema_version"] == SCHEMA_VERSION == 2
        kept = store.get("old")
        assert kept is not None and kept.audio == before.audio and kept.words == ()
        store.put(dataclasses.replace(clip("new", 3200), words=words))
    with CacheStore(path) as store:
        new = store.get("new")
        assert new is not None and new.words == words and new.chunk().words == words


def _open_and_close(path: str) -> int:
    with CacheStore(path) as store:
        return store.stats()["schema_version"]


def test_processes_creating_the_same_fresh_file_at_once(tmp_path: Path) -> None:
    import multiprocessing

    for r in range(3):
        path = str(tmp_path / f"c{r}.db")
        with multiprocessing.get_context("fork").Pool(4) as pool:
            assert pool.map(_open_and_close, [path] * 4) == [SCHEMA_VERSION] * 4


def test_newer_schema_is_refused_with_the_file_named(tmp_path: Path) -> None:
    path = tmp_path / "c.db"
    CacheStore(path).close()
    raw = sqlite3.connect(path)
    raw.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    raw.commit()
    raw.close()
    with pytest.raises(CacheError, match=r"c\.db: schema version 99 is newer"):
        CacheStore(path)
    assert path.exists()  # not "recovered": a newer speakd's cache is not damage


def test_ttl_jitter_spreads_expiries(tmp_path: Path) -> None:
    ttl, jitter, now = 1000.0, 0.1, 1_000_000.0
    with CacheStore(tmp_path / "c.db", ttl_s=ttl, ttl_jitter=jitter) as store:
        for i in range(200):
            store.put(clip(f"k{i}", created=now))
        expiries = [store.get(f"k{i}").expires for i in range(200)]
    offsets = [e - now for e in expiries]
    assert all(ttl * (1 - jitter) <= o <= ttl * (1 + jitter) for o in offsets)
    assert len(set(expiries)) == 200
    assert max(offsets) - min(offsets) > ttl * jitter  # spread over most of ±10 %
    # no avalanche: at most a quarter of the entries fall due in any tenth of the window
    window = 2 * ttl * jitter / 10
    assert max(sum(1 for o in offsets if lo <= o < lo + window) for lo in offsets) < 50


def test_expiry_and_pinned_clips(tmp_path: Path) -> None:
    with CacheStore(tmp_path / "c.db", ttl_s=10, ttl_jitter=0.0) as store:
        store.put(clip("old", created=time.time() - 20))
        store.put(clip("pin", pinned=True, created=time.time() - 10**6))
        store.put(clip("new"))
        now = time.time()
        assert store.get("old").expired(now)
        assert not store.get("pin").expired(now) and store.get("pin").expires is None
        assert not store.get("new").expired(now)
        assert store.stats()["expired"] == 1
        assert store.prune() == {"expired": 1, "evicted": 0}
        assert store.keys() == {"pin", "new"}


def test_lru_respects_the_budget_and_never_evicts_pinned(tmp_path: Path, caplog) -> None:
    with CacheStore(tmp_path / "c.db", max_bytes=1000) as store:
        store.put(clip("p1", 300, pinned=True))
        for i, t in enumerate([100.0, 200.0, 300.0]):
            store.put(clip(f"u{i}", 200, created=t))
        store.touch("u0", now=400.0)  # u0 becomes the most recently used
        evicted = store.put(clip("u3", 200, created=500.0))
        assert evicted == ["u1"]  # least recently used unpinned clip
        assert store.keys() == {"p1", "u0", "u2", "u3"}
        assert store.stats()["bytes"] <= 1000
        # pinned clips beyond the budget stay; every unpinned clip goes first
        store.put_many([clip("p2", 600, pinned=True)])
        assert store.keys() == {"p1", "p2"}
        assert store.stats()["bytes"] == 900
        store.put_many([clip("p3", 600, pinned=True)])
        assert store.keys() == {"p1", "p2", "p3"}  # over budget, but pinned is never evicted
        store.put_many([clip("p4", 10, pinned=True)])
        assert caplog.text.count("over the 1000-byte budget") == 1  # said once, not per put


def test_store_is_thread_safe(tmp_path: Path) -> None:
    import threading

    store = CacheStore(tmp_path / "c.db", max_bytes=50_000)
    errors: list[BaseException] = []

    def work(n: int) -> None:
        try:
            for i in range(40):
                store.put(clip(f"t{n}-{i}", 400))
                store.get(f"t{n}-{i // 2}")
                store.touch(f"t{n}-{i}")
                store.stats()
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert store.integrity_check() == []
    assert store.stats()["bytes"] <= 50_000
    store.close()


def test_two_processes_worth_of_connections_write_without_locking_errors(tmp_path: Path) -> None:
    """The daemon and `speakd cache import` write the same file through separate connections."""
    import threading

    path = tmp_path / "c.db"
    stores = [CacheStore(path, max_bytes=30_000), CacheStore(path, max_bytes=30_000)]
    errors: list[BaseException] = []

    def work(n: int) -> None:
        try:
            for i in range(25):
                stores[n].put(clip(f"s{n}-{i}", 800))
                stores[n].put_many([clip(f"p{n}-{i}", 100, pinned=True), clip(f"s{n}-{i}", 800)])
                stores[n].prune()
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert {c.key for c in stores[0].clips(pinned_only=True)} == {
        f"p{n}-{i}" for n in range(2) for i in range(25)
    }
    for store in stores:
        store.close()


# ---- corruption ------------------------------------------------------------------------------


def test_garbage_file_is_moved_aside_and_a_fresh_cache_made(tmp_path: Path, caplog) -> None:
    path = tmp_path / "cache.db"
    path.write_bytes(os.urandom(8192))
    with CacheStore(path) as store:
        assert store.recovered_from is not None
        assert store.stats()["clips"] == 0 and store.stats()["recovered_from"]
        store.put(clip("a"))
    aside = list(tmp_path.glob("cache.db.corrupt-*"))
    assert len(aside) == 1 and aside[0].stat().st_size == 8192
    assert "is damaged" in caplog.text and str(aside[0]) in caplog.text


def test_damaged_pages_are_moved_aside(tmp_path: Path) -> None:
    path = tmp_path / "cache.db"
    with CacheStore(path) as store:
        for i in range(50):
            store.put(clip(f"k{i}", 3000))
    data = bytearray(path.read_bytes())
    page = 4096
    data[page:] = os.urandom(len(data) - page)  # keep the header page, trash the rest
    path.write_bytes(bytes(data))
    with CacheStore(path) as store:
        assert store.recovered_from is not None
        assert store.keys() == set()


def test_tools_report_damage_instead_of_moving_files(tmp_path: Path) -> None:
    path = tmp_path / "cache.db"
    path.write_bytes(b"not a database at all" * 100)
    with pytest.raises(CacheError, match=r"cache\.db"):
        CacheStore(path, recover=False)
    assert path.exists() and not list(tmp_path.glob("*.corrupt-*"))


# ---- crash safety ------------------------------------------------------------------------------


def _writer(path: Path, round_: int, out: int) -> None:
    """The child: commit clips forever, reporting each pinned key once it is committed."""
    store = CacheStore(path, max_bytes=400_000, ttl_s=3600, recover=False)
    for i in itertools.count():
        key = f"{round_}-{i}"
        common = dict(text=key, voice="v", params={}, bundle="b", sample_rate=16000)
        if i % 3 == 0:
            store.put_many(
                [Clip(key=f"pin-{key}", audio=expected_audio(key), pinned=True, **common)]
            )
            os.write(out, f"pin-{key}\n".encode())  # committed: must survive the kill
        else:
            store.put(Clip(key=key, audio=expected_audio(key), **common))  # churn: evictions
            store.touch(key)


def expected_audio(key: str) -> bytes:
    i = int(key.rsplit("-", 1)[1])
    k = key.removeprefix("pin-")
    return (hashlib.sha256(k.encode()).digest() * 100)[: 2000 + 2 * (i % 500)]


def _spawn_writer(path: Path, round_: int) -> tuple[int, int]:
    """Fork (the test process has everything imported: ~ms, not a 1 s interpreter start)."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        os.close(read_fd)
        try:
            _writer(path, round_, write_fd)
        finally:
            os._exit(1)
    os.close(write_fd)
    return pid, read_fd


def test_sigkill_mid_write_never_corrupts_nor_loses_pinned_clips(tmp_path: Path) -> None:
    """Kill a writer with SIGKILL at random moments, many times, on the same file.

    SPEAKD_CRASH_ROUNDS=50 runs the longer bench mode (docs/benchmarks.md).
    """
    rounds = int(os.environ.get("SPEAKD_CRASH_ROUNDS", "20"))
    path = tmp_path / "cache.db"
    rng = random.Random(6)
    committed: list[str] = []
    for r in range(rounds):
        pid, fd = _spawn_writer(path, r)
        with os.fdopen(fd, "r") as pipe:
            first = pipe.readline()  # the writer is up and committing
            assert first, f"round {r}: the writer died before writing"
            time.sleep(rng.uniform(0.0, 0.25))
            os.kill(pid, signal.SIGKILL)
            _, status = os.waitpid(pid, 0)
            committed += [line.strip() for line in [first, *pipe.read().splitlines()]]
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
        raw = sqlite3.connect(path)
        assert raw.execute("PRAGMA integrity_check").fetchone()[0] == "ok", f"round {r}"
        raw.close()
    assert len(committed) > 2 * rounds, committed
    with CacheStore(path, recover=False) as store:
        assert store.recovered_from is None
        assert store.integrity_check() == []
        for key in committed:
            got = store.get(key)
            assert got is not None, f"pinned clip {key} lost"
            assert got.pinned and got.audio == expected_audio(key)


# ---- packs and the CLI -------------------------------------------------------------------------


def test_import_merges_pins_and_skips_existing_export_round_trips(tmp_path: Path) -> None:
    pack = tmp_path / "pack.db"
    with CacheStore(pack, ttl_s=0) as p:
        p.put_many([clip("a", pinned=True), clip("b", pinned=True)])
    with CacheStore(tmp_path / "dev.db") as dev:
        dev.put(clip("b"))  # already cached, unpinned
        dev.put(clip("c"))
        assert import_pack(dev, pack) == (1, 2)
        assert dev.get("a").pinned and dev.get("b").pinned and not dev.get("c").pinned
        assert import_pack(dev, pack) == (0, 2)  # idempotent
        assert export_pack(dev, tmp_path / "out.db") == 2
        with pytest.raises(CacheError, match="exists"):
            export_pack(dev, tmp_path / "out.db")
    with CacheStore(tmp_path / "out.db") as out:
        assert out.keys() == {"a", "b"}
        assert out.get("a").audio == clip("a").audio


def test_cli_commands_on_a_real_file(tmp_path: Path, capsys) -> None:
    pack, db = tmp_path / "pack.db", tmp_path / "dev.db"
    with CacheStore(pack, ttl_s=0) as p:
        p.put_many([clip("k1", 3200, pinned=True), clip("k2", 1600, pinned=True)])
    config = tmp_path / "speakd.toml"
    config.write_text(f'[cache]\npath = "{db}"\nmax_bytes = 100000\n')

    def run(*args: str) -> tuple[int, str]:
        code = speakd_main(["cache", *args])
        return code, capsys.readouterr().out

    assert run("import", str(pack), "--config", str(config)) == (
        0,
        f"imported 2 of 2 clips from {pack} into {db}\n",
    )
    code, out = run("--db", str(db), "ls")
    assert code == 0 and "text k1" in out and "yes" in out
    code, out = run("ls", "--db", str(db), "--json")
    assert [json.loads(line)["key"] for line in out.splitlines()] in (["k1", "k2"], ["k2", "k1"])
    code, out = run("stats", "--config", str(config))
    stats = json.loads(out)
    assert stats["clips"] == 2 and stats["pinned"] == 2 and stats["bytes"] == 4800
    assert run("verify", "--db", str(db))[0] == 0
    assert run("prune", "--db", str(db))[0] == 0
    assert run("export", str(tmp_path / "x.db"), "--db", str(db))[0] == 0
    raw = sqlite3.connect(db)
    raw.execute("UPDATE clips SET bytes = 7 WHERE key = 'k1'")
    raw.commit()
    raw.close()
    code, out = run("verify", "--db", str(db))
    assert code == 1 and "clip k1: audio is 3200 bytes, row says 7" in out
    assert run("ls", "--db", str(tmp_path / "nope.db"))[0] == 1
