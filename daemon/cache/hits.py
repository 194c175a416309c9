"""Where a request's clip is found: the pinned clips held in RAM, the cache file, the shipped pack.

The resolver (``speakd.request.resolver``) looks here before it starts a synthesis:

- pinned clips come from RAM, prewarmed at start within ``prewarm_bytes`` (most used first);
- others from SQLite; a lookup that fails is a miss, counted and logged, never an error;
- then from the shipped pack (``speakd.cache.shipped``, read-only: key echo for a fresh cache).

A hit's bookkeeping (last used, hits) is written on a thread of its own, off the path to the first
sample, and the store's totals are read there too, so the status, asked on the event loop, never
waits on SQLite.
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
import threading
import time
from collections.abc import Callable, Collection
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from speakd.cache.shipped import ShippedPack
from speakd.cache.store import CacheError, CacheStore, Clip

log = logging.getLogger(__name__)


class Hits:
    """The clips of one resolver: its RAM, its store and its shipped pack. ``count`` takes the
    resolver's counter names (``hits_ram``, ``hits_shipped``, ``errors``)."""

    def __init__(
        self,
        store: CacheStore | None,
        shipped: ShippedPack | None,
        count: Callable[[str], None],
        *,
        bundles: Collection[str] = (),
        prewarm_bytes: int = 0,
    ) -> None:
        self.store = store
        self.shipped = shipped
        self._count = count
        self._lock = threading.Lock()
        self.ram: dict[str, Clip] = {}
        self.ram_bytes = 0
        self._store_stats: dict[str, Any] = {}
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="speakd-cache-write")
        if store is not None:
            self._prewarm(prewarm_bytes, bundles)
            if store.indexed():
                self.refresh_stats()
            else:  # the totals read every clip (gigabytes on an SD card): not before READY
                self._store_stats = {
                    "path": str(store.path),
                    "recovered_from": store.recovered_from,
                }
                threading.Thread(
                    target=self.refresh_stats, name="speakd-cache-stats", daemon=True
                ).start()

    def find(self, key: str) -> tuple[Clip | None, bool]:
        """The clip from RAM, the cache file, else the shipped pack; and whether it was that."""
        clip = self.ram.get(key)
        if clip is not None:
            self._count("hits_ram")
            return clip, False
        if self.store is not None:
            try:
                clip = self.store.get(key)
            except (CacheError, sqlite3.Error) as e:
                self._count("errors")
                log.warning("cache lookup failed, treating it as a miss: %s", e)
            if clip is not None:
                return clip, False
        if self.shipped is not None:
            try:
                clip = self.shipped.get(key)
            except sqlite3.Error as e:
                self._count("errors")
                log.warning("shipped pack lookup failed, treating it as a miss: %s", e)
            if clip is not None:
                self._count("hits_shipped")
        return clip, clip is not None

    def touch(self, key: str) -> None:
        """Count a hit of the cache file's clip ``key``, on the writer thread."""
        with contextlib.suppress(RuntimeError):  # closed by a reload meanwhile
            self._writer.submit(self._touch, key)

    def _touch(self, key: str) -> None:
        assert self.store is not None
        # closed by a reload meanwhile: the hit counter is all that is lost
        with contextlib.suppress(CacheError, sqlite3.Error):
            self.store.touch(key)

    @property
    def store_stats(self) -> dict[str, Any]:
        """The store's totals as last read (``refresh_stats``)."""
        with self._lock:
            return self._store_stats

    def refresh_stats(self) -> None:
        """Snapshot the store's aggregate stats on a worker thread (at open and after each
        store), so ``status()`` — called on the event loop — never waits on SQLite."""
        assert self.store is not None
        try:
            stats = self.store.stats()
        except (CacheError, sqlite3.Error) as e:
            stats = {"error": str(e)}
        with self._lock:
            self._store_stats = stats

    def close(self) -> None:
        """Write the hits still queued, and close the shipped pack (a successor opened its own);
        the store is the resolver's to close."""
        self._writer.shutdown(wait=True)
        if self.shipped is not None:
            self.shipped.close()

    def _prewarm(self, budget: int, bundles: Collection[str]) -> None:
        assert self.store is not None
        t0, used, skipped = time.monotonic(), 0, 0
        for key, size in (kv for b in bundles for kv in self.store.prewarm_order(b)):
            if used + size > budget:
                skipped += 1
                continue
            clip = self.store.get(key)
            if clip is not None:
                self.ram[key] = clip
                used += size
        self.ram_bytes = used
        foreign = {b: n for b, n in self.store.pinned_by_bundle().items() if b not in bundles}
        if foreign:
            log.warning(
                "cache %s: %d pinned clips were made with bundles no voice has (%s) and cannot "
                "play; rebuild those packs with these voices (precompute --bundle): %s",
                self.store.path,
                sum(foreign.values()),
                ", ".join(sorted(foreign)),
                ", ".join(sorted(bundles)),
            )
        log.info(
            "cache %s: %d pinned clips (%d bytes) prewarmed into RAM in %.0f ms%s",
            self.store.path,
            len(self.ram),
            used,
            (time.monotonic() - t0) * 1000,
            f"; {skipped} left on disk (cache.prewarm_bytes = {budget})" if skipped else "",
        )
