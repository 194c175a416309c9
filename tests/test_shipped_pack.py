"""The shipped key-echo pack (speakd.cache.shipped, made by speakd.lifecycle.keyecho): a read-only
cache file the resolver consults after the writable cache, made by the daemon's own prewarm;
and a prewarm that still runs skips what the pack holds and never competes with a live
synthesis.

On the tone engine (tests/tone_engine.py): the real voice's pack is made by the package build
(tests/test_deb.py checks the installed one) and served by a real daemon in tests/test_key_echo.py.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

from speakd.audio.sinks import NullSink
from speakd.cache.shipped import ShippedPack
from speakd.cache.store import CacheStore
from speakd.config import SsipConfig
from speakd.control import Control
from speakd.frontends.ssip.keys import prewarm
from speakd.frontends.ssip.settings import Settings, request_fields
from speakd.request.resolver import Resolver
from speakd.request.scheduler import Scheduler
from speakd.request.stream import Cancel
from tests.test_cache_store import clip
from tests.tone_engine import ToneEngine

SSIP = SsipConfig(prewarm_rates=[0], prewarm_pitches=[10])


def control_over(resolver: Resolver) -> Control:
    return Control(Scheduler(resolver, NullSink()), 5000)


def make_pack(tmp_path: Path) -> Path:
    """The tone voice's key-echo pack, made as ``speakd cache key-echo`` makes one."""
    path = tmp_path / "key-echo.db"
    with CacheStore(path, ttl_s=0) as store:
        resolver = Resolver(ToneEngine(), store)
        done = asyncio.run(prewarm(control_over(resolver), SSIP, threading.Event()))
        resolver.close()
    assert done.made > 100 and not done.failed, done
    return path


def test_the_pack_is_read_after_the_cache_and_never_written(tmp_path: Path) -> None:
    pack_path = tmp_path / "pack.db"
    with CacheStore(pack_path, ttl_s=0) as pack:
        pack.put_many([clip("both", n_bytes=100), clip("shipped-only")])
    before = pack_path.read_bytes()
    store = CacheStore(tmp_path / "cache.db")
    store.put(clip("both", n_bytes=400))
    resolver = Resolver(ToneEngine(), store, shipped=ShippedPack(pack_path))
    try:
        assert resolver._lookup("both").bytes == 400  # the writable cache first
        assert resolver._lookup("shipped-only") is not None
        assert resolver._lookup("neither") is None
        assert resolver.counters["hits_shipped"] == 1
        assert not store.contains("shipped-only")  # not copied into the user's cache
        assert resolver.status()["shipped"] | {"bundles": []} == {
            "path": str(pack_path),
            "clips": 2,
            "bundles": [],
            "for_these_voices": True,
            "hits": 1,
        }
    finally:
        resolver.close()
    assert pack_path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("pack")) == ["pack.db"]


def test_a_fresh_cache_serves_orca_key_echo_from_the_pack(tmp_path: Path) -> None:
    pack = ShippedPack(make_pack(tmp_path))
    store = CacheStore(tmp_path / "user-cache.db")
    resolver = Resolver(ToneEngine(), store, shipped=pack)
    control = control_over(resolver)
    try:
        # Orca's echo of a typed t at its lowercase PITCH, as the SSIP front-end builds it
        fields = request_fields(Settings(pitch=10), '<speak><mark name="0:1"/>t </speak>', None)
        request = control.build_request(fields, origin="ssip", strict_lang=False)
        chunks = list(resolver.stream(request, Cancel()))
        assert chunks and resolver.counters["synth"] == 0
        assert resolver.counters["hits_shipped"] == 1
        # a prewarm that still runs finds the whole pack there and makes nothing
        done = asyncio.run(prewarm(control, SSIP, threading.Event()))
        assert (done.made, done.failed) == (0, 0) and done.found == done.shipped > 100, done
        assert store.stats()["clips"] == 0
    finally:
        resolver.close()
        store.close()


def test_the_prewarm_waits_while_a_live_request_is_synthesized(tmp_path: Path) -> None:
    store = CacheStore(tmp_path / "cache.db")
    resolver = Resolver(ToneEngine(compute_s=0.05), store)
    control = control_over(resolver)
    halt = threading.Event()

    async def run() -> list[int]:
        live = control.build_request({"text": " ".join(["word"] * 30)}, origin="json")
        async with control.stream(live) as stream:
            warming = asyncio.create_task(prewarm(control, SSIP, halt))
            # flights started while the live one runs, seen as each of its 30 chunks comes
            seen = [resolver.counters["synth"] async for _ in stream.aread()]
        halt.set()
        await warming
        return seen

    try:
        seen = asyncio.run(run())
        assert len(seen) == 30 and set(seen) == {1}, seen
    finally:
        resolver.close()
        store.close()
