"""Prompt packs: a pack is a cache file of pinned clips made by ``speakd-tools precompute`` (or
``speakd cache export``). Importing one into the cache is the same whether ``speakd cache import``
does it or a board fetched the pack over MQTT (``mqtt/packs.py``).
"""

from __future__ import annotations

from pathlib import Path

from speakd.cache.store import CacheError, CacheStore


def import_pack(store: CacheStore, pack: Path) -> tuple[int, int]:
    """(new clips, clips in the pack); every imported clip is pinned."""
    if not pack.is_file():
        raise CacheError(f"{pack}: no such prompt pack")
    with CacheStore(pack, recover=False, ttl_s=0) as source:
        clips = list(source.clips(order="key"))
    for clip in clips:
        clip.pinned, clip.expires = True, None
    return store.put_many(clips, skip_existing=True), len(clips)


def export_pack(store: CacheStore, out: Path, everything: bool = False) -> int:
    """Write the pinned clips (all of them with ``everything``) to a new pack; returns the count."""
    if out.exists():
        raise CacheError(f"{out}: exists; export writes a new pack")
    clips = list(store.clips(pinned_only=not everything, order="key"))
    for clip in clips:
        clip.pinned, clip.expires = True, None
    with CacheStore(out, recover=False, max_bytes=1 << 62, ttl_s=0) as pack:
        return pack.put_many(clips)
