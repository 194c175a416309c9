"""The cache in front of the engine: hits without synthesis, store-after-complete, single-flight,
prewarm, stale-while-revalidate, cache_only, reload hygiene — on the real scheduler and SQLite
with the tone engine — and one end to end run on the real VITS voice through `speakd serve`."""

from __future__ import annotations

import asyncio
import io
import os
import signal
import threading
from pathlib import Path

import httpx
import pytest

from speakd.audio import read_wav
from speakd.audio.sinks import WavSink
from speakd.cache.store import CacheStore, Clip
from speakd.config import CacheConfig, Config
from speakd.engines.base import EngineError, SynthesisConfig
from speakd.request.messages import SpeakRequest
from speakd.request.prepare import prepare
from speakd.request.resolver import NotCachedError, Resolver
from speakd.request.scheduler import Scheduler
from tests.test_scheduler import Recorder, settle
from tests.tone_engine import ToneEngine
from tests.waits import wait_until


def pcm(source: Resolver, text: str, cancel: threading.Event | None = None) -> bytes:
    return b"".join(c.pcm for c in source.stream(SpeakRequest(text), cancel or threading.Event()))


@pytest.fixture
def make(tmp_path: Path):
    made: list[Resolver] = []

    def factory(engine: ToneEngine | None = None, **kw) -> Resolver:
        store_kw = {k: kw.pop(k) for k in ("max_bytes", "ttl_s", "ttl_jitter") if k in kw}
        source = Resolver(
            engine or ToneEngine(), CacheStore(tmp_path / "cache.db", **store_kw), **kw
        )
        made.append(source)
        return source

    yield factory
    for source in made:
        source.close()


def test_miss_is_stored_after_completion_then_hits_without_synthesis(make) -> None:
    engine = ToneEngine()
    source = make(engine)
    first = pcm(source, "one two three")
    wait_until(lambda: source.counters["stored"] == 1)
    again = pcm(source, "one   two three")  # same normalised text: same key
    assert again == first and len(first) == 3 * 1600 * 2
    assert engine.calls == ["one two three"]
    assert source.counters["hits"] == 1 and source.counters["synth"] == 1
    # the hit is one chunk: the scheduler can start playback with the whole clip at hand
    assert len(list(source.stream(SpeakRequest("one two three"), threading.Event()))) == 1
    pcm(source, "one two three four")  # different text: a new synthesis
    assert len(engine.calls) == 2


def test_cancelled_and_failed_syntheses_are_never_stored(make) -> None:
    engine = ToneEngine(compute_s=0.05)
    source = make(engine)
    cancel = threading.Event()
    stream = source.stream(SpeakRequest("a b c d e f g h"), cancel)
    next(stream)
    cancel.set()
    assert list(stream) == []
    wait_until(lambda: source.counters["not_stored"] == 1)
    with pytest.raises(EngineError, match="asked to fail"):
        pcm(source, "please FAIL now")
    wait_until(lambda: source.counters["not_stored"] == 2)
    assert source.store.keys() == set()
    pcm(source, "a b c d e f g h")  # synthesised again from scratch, now complete
    wait_until(lambda: source.counters["stored"] == 1)
    assert engine.calls.count("a b c d e f g h") == 2


def test_single_flight_concurrent_identical_misses_synthesise_once(make) -> None:
    engine = ToneEngine(compute_s=0.03)
    source = make(engine)
    results: list[bytes] = []
    start = threading.Barrier(5)

    def listener() -> None:
        start.wait()
        results.append(pcm(source, "the same words for everyone"))

    threads = [threading.Thread(target=listener) for _ in range(5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert engine.calls == ["the same words for everyone"]
    assert len(results) == 5 and len(set(results)) == 1 and len(results[0]) == 5 * 3200
    assert source.counters["synth"] == 1 and source.counters["shared"] == 4
    wait_until(lambda: source.counters["stored"] == 1)


def test_single_flight_survives_the_first_listener_cancelling(make) -> None:
    engine = ToneEngine(compute_s=0.05)
    source = make(engine)
    leader_cancel = threading.Event()
    leader = source.stream(SpeakRequest("w1 w2 w3 w4 w5 w6"), leader_cancel)
    next(leader)  # the flight is running
    follower: list[bytes] = []
    t = threading.Thread(target=lambda: follower.append(pcm(source, "w1 w2 w3 w4 w5 w6")))
    t.start()
    wait_until(lambda: source.counters["shared"] == 1)
    leader_cancel.set()
    list(leader)
    t.join()
    assert len(follower[0]) == 6 * 3200  # the follower still got all of it
    assert len(engine.calls) == 1
    wait_until(lambda: source.counters["stored"] == 1)


def test_pinned_clips_are_prewarmed_within_budget_and_hit_from_ram(make, tmp_path, caplog) -> None:
    engine = ToneEngine()
    keys = []
    with CacheStore(tmp_path / "cache.db") as store:
        for i, text in enumerate(["alpha", "beta", "gamma"]):
            key = prepare(engine, text, SynthesisConfig()).key
            keys.append(key)
            store.put_many(
                [Clip(key, text, "low", {}, engine.bundle_id, 16000, bytes(3200), pinned=True)]
            )
            store.touch(key, now=1000.0 + i)  # gamma most recent, then beta
        other = Clip("x" * 64, "other bundle", "low", {}, "tone-9", 16000, bytes(320), pinned=True)
        store.put_many([other])
    source = make(engine, prewarm_bytes=2 * 3200)
    assert "1 pinned clips were made with bundles no voice has (tone-9)" in caplog.text
    assert source.status()["cache"]["prewarmed"] == 2
    assert source.status()["cache"]["prewarmed_bytes"] == 6400
    assert pcm(source, "gamma") == bytes(3200)
    assert source.counters["hits_ram"] == 1
    pcm(source, "alpha")  # pinned but over the RAM budget: a hit from SQLite
    assert source.counters == {**source.counters, "hits": 2, "hits_ram": 1, "synth": 0}
    assert engine.calls == []


def test_stale_while_revalidate_plays_old_audio_and_refreshes(make, tmp_path) -> None:
    engine = ToneEngine()
    key = prepare(engine, "stale words", SynthesisConfig()).key
    with CacheStore(tmp_path / "cache.db") as store:
        store.put(Clip(key, "stale words", "low", {}, "tone-1", 16000, bytes(640), expires=1.0))
    plain = make(engine)
    assert pcm(plain, "stale words") != bytes(640)  # expired, no SWR: a miss
    wait_until(lambda: plain.counters["stored"] == 1)
    plain.close()
    with CacheStore(tmp_path / "cache.db") as store:
        store.put(Clip(key, "stale words", "low", {}, "tone-1", 16000, bytes(640), expires=1.0))
    engine.calls.clear()
    swr = make(engine, stale_while_revalidate=True)
    assert pcm(swr, "stale words") == bytes(640)  # served stale at once
    wait_until(lambda: swr.counters["stored"] == 1)  # and refreshed in the background
    assert engine.calls == ["stale words"] and swr.counters["stale_served"] == 1
    assert pcm(swr, "stale words") != bytes(640)  # the fresh clip
    assert len(engine.calls) == 1


async def test_cache_only_miss_fails_with_not_cached_through_the_scheduler(make, tmp_path) -> None:
    engine = ToneEngine()
    source = make(engine)
    sched = Scheduler(source, WavSink(tmp_path / "wav"))
    task = asyncio.create_task(sched.run())
    rec = Recorder()
    sched.submit(SpeakRequest("never said", id="c1", cache_only=True, on_event=rec))
    await settle(rec, "c1")
    final = rec.final("c1")
    assert final.type.value == "error" and final.data["code"] == "not_cached"
    assert engine.calls == []
    sched.submit(SpeakRequest("said once", id="s1", on_event=rec))
    await settle(rec, "s1")
    await asyncio.to_thread(wait_until, lambda: source.counters["stored"] == 1)
    sched.submit(SpeakRequest("said once", id="c2", cache_only=True, on_event=rec))
    await settle(rec, "c2")
    assert rec.final("c2").data["status"] == "done"
    assert read_wav(tmp_path / "wav" / "c2.wav").pcm == read_wav(tmp_path / "wav" / "s1.wav").pcm
    assert sched.status()["source"]["cache"]["hits"] == 1
    assert isinstance(NotCachedError("x"), EngineError)
    task.cancel()


def test_from_config_reports_a_recovered_cache_and_reloads_leak_nothing(tmp_path) -> None:
    db = tmp_path / "cache.db"
    db.write_bytes(b"\x00garbage" * 1000)
    config = Config(cache=CacheConfig(path=str(db)))
    engine = ToneEngine()
    source = Resolver.from_config(engine, config.cache)
    status = source.status()["cache"]
    assert status["recovered"] is True and ".corrupt-" in status["recovered_from"]

    def open_fds() -> int:
        return sum(1 for fd in os.listdir("/proc/self/fd") if "cache.db" in _target(fd))

    pcm(source, "before reload")
    # stored after its readers heard the end, on the synthesis thread: the reloads below must
    # not lose it, not race it
    wait_until(lambda: source.counters["stored"] == 1)
    counts = []
    for _ in range(20):  # SIGHUP: a new source, the old one closed
        old, source = source, Resolver.from_config(engine, config.cache)
        old.close()
        counts.append(open_fds())
    assert old.store.closed
    assert max(counts) <= 6  # one live connection (SQLite may defer closing a few fds); no growth
    assert pcm(source, "before reload")  # still served (from SQLite) after the reloads
    assert source.counters["hits"] == 1
    source.close()
    assert open_fds() == 0
    disabled = Resolver.from_config(engine, CacheConfig(path=str(db), enabled=False))
    assert disabled.status()["cache"] is None


def _target(fd: str) -> str:
    return _fd("self", fd)


def _fd(pid: int | str, fd: str) -> str:
    try:
        return os.readlink(f"/proc/{pid}/fd/{fd}")
    except OSError:
        return ""


# ---- end to end: precompute → import → say, on the real VITS voice ---------------------------


def test_precompute_import_say_plays_from_cache_without_the_engine(tmp_path: Path) -> None:
    from speakd.cli import main as speakd_main
    from speakd.config import EngineConfig
    from speakd_tools.precompute import main as precompute_main
    from tests.daemon_proc import start_daemon, write_config

    prompts = tmp_path / "prompts.txt"  # with the fallback prompt the daemon readies at start
    prompts.write_text(f"The front door is open.\nBattery low.\n{EngineConfig().fallback_text}\n")
    pack = tmp_path / "pack.db"
    assert precompute_main([str(prompts), "--out", str(pack), "--no-progress"]) == 0
    config = write_config(tmp_path)
    assert speakd_main(["cache", "import", str(pack), "--config", str(config)]) == 0
    daemon = start_daemon(config)
    try:
        with daemon.client() as c:
            events = list(c.say({"text": "The front door is open.", "id": "hit1"}, wait=True))
            status = c.request({"op": "status"})
        assert [e["event"] for e in events] == ["queued", "started", "finished"]
        cache = status["source"]["cache"]
        assert cache["hits"] == 2 and cache["hits_ram"] == 2 and cache["prewarmed"] == 3
        assert cache["synth"] == 0 and cache["misses"] == 0  # the engine never ran
        with CacheStore(pack) as p:
            [clip] = [c for c in p.clips() if c.text == "The front door is open."]
        played = read_wav(tmp_path / "wav" / "hit1.wav")
        assert played.pcm == clip.audio and played.sample_rate == clip.sample_rate
        assert events[1]["latency_ms"] < 1000
        # SIGHUP re-opens the cache (prewarming again) and the old one is closed, not leaked
        daemon.proc.send_signal(signal.SIGHUP)
        wait_until(lambda: daemon.log_text().count("3 pinned clips") == 2, timeout=30)
        with daemon.client() as c:
            assert list(c.say({"text": "Battery low.", "id": "hit2"}, wait=True))[-1] == {
                "event": "finished",
                "id": "hit2",
                "status": "done",
            }
            cache = c.request({"op": "status"})["source"]["cache"]
        assert cache["hits_ram"] == 1 and cache["synth"] == 0  # counters of the new source
        refused = daemon.cli("say", "--cache-only", "--wait", "Never made in advance.")
        assert refused.returncode == 1 and "not_cached" in refused.stderr
        assert daemon.cli("say", "--cache-only", "--wait", "Battery low.").returncode == 0
        db_fds = [
            f
            for f in os.listdir(f"/proc/{daemon.proc.pid}/fd")
            if "cache.db" in _fd(daemon.proc.pid, f)
        ]
        assert len(db_fds) <= 6
    finally:
        assert daemon.stop() == 0


# What takes the kernel's file-permission bypass from root: a root test then meets EACCES as a
# user's daemon does (a non-root test needs nothing).
NO_DAC = ("setpriv", "--bounding-set=-dac_override,-dac_read_search", "--inh-caps=-all", "--")


def test_a_cache_it_may_not_open_never_stops_the_daemon(tmp_path: Path) -> None:
    """The system config's cache.path read by a desktop user's daemon (issue 46): the file is in
    a directory the daemon may not enter. It serves from the voice alone, says why in its status,
    in a metric and in `speakd doctor`, and logs it once."""
    from speakd.lifecycle.doctor import run_doctor
    from tests.daemon_proc import start_daemon, write_config
    from tests.http_daemon import free_port

    locked = tmp_path / "locked"
    locked.mkdir(mode=0o700)
    os.chown(locked, 65534, 65534)  # nobody's: not the test's, whoever runs it
    if os.geteuid() != 0:
        locked.chmod(0)
    port = free_port()
    config = write_config(tmp_path, f'\n[http]\nlisten = "127.0.0.1:{port}"\n', sink="null")
    env = {"SPEAKD_CACHE_PATH": str(locked / "cache.db")}
    d = start_daemon(config, env, wrap=NO_DAC if os.geteuid() == 0 else ())
    try:
        events = d.say("Spoken without a cache.")
        assert events[-1]["event"] == "finished" and events[-1]["status"] == "done", events
        with d.client() as c:
            cache = c.request({"op": "status"})["source"]["cache"]
        assert cache["enabled"] is False
        assert str(locked / "cache.db") in cache["unavailable"]
        assert "Permission denied" in cache["unavailable"]
        metrics = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
        assert "\nspeakd_cache_unavailable 1.0\n" in metrics
        out = io.StringIO()
        assert run_doctor(config, d.socket, out=out) is False
        daemon_line = next(x for x in out.getvalue().splitlines() if "] daemon:" in x)
        assert daemon_line.startswith("[FAIL]") and "runs without its cache" in daemon_line
        assert d.log_text().count("audio cache disabled") == 1
    finally:
        assert d.stop() == 0
        locked.chmod(0o700)
