"""What the page shows beyond status (docs/http.md, "The page"): the cached and pinned prompts
(search, play, pin, drop for a re-synthesis) and the last minutes' requests with their time to
first audio. Plain JSON routes under ``/v1`` like the rest, behind the same token.

The cache is the one the daemon plays from now (``Control.cache_store``); without one the cache
routes answer 404 ``not_found`` with ``cache.enabled`` in the message.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from aiohttp import web

from speakd.audio import wav_bytes
from speakd.frontends.http.base import ok, origin, read_json, state
from speakd.request.messages import RequestError

if TYPE_CHECKING:  # the store Control hands out (Control.cache_store), as mqtt/packs.py takes it
    from speakd.cache.store import CacheStore

MAX_LISTED = 200  # clips one listing returns, most recently used first


def routes() -> list[web.RouteDef]:
    return [
        web.get("/v1/recent", recent),
        web.get("/v1/cache/clips", clips),
        web.get("/v1/cache/clips/{key}/audio", clip_audio),
        web.post("/v1/cache/clips/{key}/pin", pin),
        web.post("/v1/cache/clips/{key}/resynthesize", resynthesize),
        web.delete("/v1/cache/clips/{key}", drop),
    ]


async def recent(request: web.Request) -> web.Response:
    metrics = state(request).metrics
    if metrics is None:
        return ok({"window_s": 0, "requests": []})
    return ok(metrics.recent.listing())


def _store(request: web.Request) -> CacheStore:
    store = state(request).control.cache_store()
    if store is None:
        raise RequestError("not_found", "there is no cache (cache.enabled = false)")
    return store


@contextmanager
def _writing() -> Iterator[None]:
    """A write refused because another connection holds the file's write lock (the index built
    once after an upgrade, ``speakd.cache.indexing``, or an import): a clear error to retry,
    not an internal one."""
    try:
        yield
    except sqlite3.OperationalError as e:
        if "locked" not in str(e):
            raise
        raise RequestError(
            "cache_locked", f"the cache file is being written by another ({e}): try again shortly"
        ) from None


async def clips(request: web.Request) -> web.Response:
    """``?q=`` finds text (any case), ``?pinned=1`` only pinned clips. Read off the event loop
    (CANCEL and key echo wait on it) and beside the store, not behind it (``speakd.cache.browse``):
    a clip being stored or read for a hit does not wait for the page."""
    found = await asyncio.to_thread(
        state(request).control.browse_cache,
        request.query.get("q", ""),
        pinned_only=request.query.get("pinned") in ("1", "true"),
        limit=MAX_LISTED,
    )
    if found is None:
        raise RequestError("not_found", "there is no cache (cache.enabled = false)")
    return ok({"clips": found.clips, "matching": found.matching, "stats": found.stats})


async def clip_audio(request: web.Request) -> web.Response:
    clip = _store(request).get(request.match_info["key"])
    if clip is None:
        raise RequestError("not_found", "no clip with that key (evicted or dropped)")
    return web.Response(body=wav_bytes(clip.chunk()), content_type="audio/wav")


async def pin(request: web.Request) -> web.Response:
    body = await read_json(request)
    pinned = body.get("pinned", True)
    if not isinstance(pinned, bool):
        raise RequestError("bad_field", "pinned must be true or false")
    with _writing():
        done = _store(request).pin(request.match_info["key"], pinned)
    if not done:
        raise RequestError("not_found", "no clip with that key (evicted or dropped)")
    return ok({"key": request.match_info["key"], "pinned": pinned})


async def resynthesize(request: web.Request) -> web.Response:
    """Make a clip anew with every parameter it was made with, pinned if it was: a stream like
    any (``max_streams``, the metrics); answers its audio (WAV) once stored, its key in
    ``X-Speakd-Key`` (docs/http.md)."""
    control = state(request).control
    key = request.match_info["key"]
    old, speak = await asyncio.to_thread(control.resynthesis, key, origin=origin(request))
    async with control.stream(speak) as stream:
        async for _chunk in stream.aread():
            pass
    clip = await asyncio.to_thread(control.resynthesized, old, speak)
    return web.Response(
        body=wav_bytes(clip.chunk()),
        content_type="audio/wav",
        headers={"X-Speakd-Cache": "miss", "X-Speakd-Key": clip.key},
    )


async def drop(request: web.Request) -> web.Response:
    """Drop a clip: the next request for it synthesizes it anew."""
    with _writing():
        done = _store(request).delete(request.match_info["key"])
    if not done:
        raise RequestError("not_found", "no clip with that key (evicted or dropped)")
    return ok({"key": request.match_info["key"], "dropped": True})
