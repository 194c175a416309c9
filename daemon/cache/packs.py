"""Prompt packs: a pack is a cache file of pinned clips made by ``speakd-tools precompute`` (or
``speakd cache export``). Importing one into the cache is the same whether ``speakd cache import``
does it or a board fetched the pack over MQTT (``mqtt/packs.py``).

Who pins a clip is kept in the ``pack_pins`` table, one row per (owner, key): the owner is
``pack:<site>`` for a site's current pack, ``local`` for a pack imported by hand without a site
and for clips found pinned that nobody tracked (pinned before packs were tracked). A site's new
pack replaces its rows; a clip that loses its last row is unpinned and given a TTL, so the
cache's LRU takes it in time. The new pack's clips, the rows, the unpinning and the site's pack
id are one transaction: a board never holds half of a rollout. A signed pack's version is claimed
first, in the state directory's record (``speakd.cache.versions``), which outlives the cache.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path

from sqlite_utils import Database

from speakd.cache.store import CacheError, CacheStore, Clip
from speakd.cache.trust import UNSIGNED, Trust, TrustError
from speakd.cache.versions import PackVersions

log = logging.getLogger(__name__)

LOCAL = "local"
META_PACK = "pack/"  # meta key per site: the pack this board holds for it
META_VERSION = "pack-version/"  # where the signed version was kept before the state's record


@dataclass(frozen=True)
class SitePack:
    """A pack becoming a site's current one; ``version`` when its signature was verified."""

    site: str
    pack_id: str
    version: int | None = None


@dataclass(frozen=True)
class Installed:
    added: int  # clips new to the cache
    clips: int  # clips in the pack
    unpinned: int  # clips only the replaced pack held


def import_pack(store: CacheStore, pack: Path) -> tuple[int, int]:
    """(new clips, clips in the pack); every imported clip is pinned, locally (by hand)."""
    done = install_pack(store, pack)
    return done.added, done.clips


def import_by_hand(
    store: CacheStore, pack: Path, manifest: Path | None, trust: Trust, versions: PackVersions
) -> Installed:
    """``speakd cache import``: with trusted keys, only with a manifest signed by one of them
    (``speakd-tools pack sign``, default ``PACK.manifest.json``) that names this file's sha256;
    the pack then becomes its site's, as if it had come over MQTT."""
    default = pack.with_name(pack.name + ".manifest.json")
    if manifest is None and default.is_file():
        manifest = default
    if manifest is None:
        if trust.required:
            raise TrustError(
                UNSIGNED, f"no signed manifest ({default.name} or --manifest) beside {pack.name}"
            )
        return install_pack(store, pack)
    try:
        body = json.loads(manifest.read_text(encoding="utf-8"))
        site, pack_id, sha256 = str(body["site"]), str(body["pack_id"]), str(body["sha256"])
    except (OSError, ValueError, TypeError, KeyError) as e:
        raise CacheError(f"{manifest}: not a pack manifest ({e})") from None
    version = trust.verify(body, site) if trust.required else None
    if not pack.is_file() or file_sha256(pack) != sha256:
        raise TrustError("checksum", f"{pack} is not the file {manifest.name} was made for")
    return install_pack(store, pack, SitePack(site, pack_id, version), versions)


def install_pack(
    store: CacheStore,
    pack: Path,
    as_site: SitePack | None = None,
    versions: PackVersions | None = None,
) -> Installed:
    """Add ``pack``'s clips pinned; as a site's pack, replace that site's previous one. A signed
    one (``as_site.version``) is claimed in ``versions`` first: TrustError when it is a replay."""
    clips = _read(pack)
    if as_site is not None and as_site.version is not None:
        if versions is None:
            raise ValueError("a signed pack is installed with the state's PackVersions")
        adopt_versions(store, versions)
        versions.claim(as_site.site, as_site.version, as_site.pack_id)
    keys = [clip.key for clip in clips]
    owner = f"pack:{as_site.site}" if as_site else LOCAL
    with store.transaction() as db:
        db.execute(
            "CREATE TABLE IF NOT EXISTS pack_pins"
            " (owner TEXT NOT NULL, key TEXT NOT NULL, PRIMARY KEY (owner, key))"
        )
        _adopt_untracked(db, keys)
        added = store.put_many(clips, skip_existing=True)
        old = set() if as_site is None else _replace_rows(db, owner)
        db.conn.executemany(
            "INSERT OR IGNORE INTO pack_pins (owner, key) VALUES (?, ?)", [(owner, k) for k in keys]
        )
        unpinned = _unpin_orphans(db, old - set(keys), store.expiry(time.time()))
        if as_site is not None:
            store.set_meta(f"{META_PACK}{as_site.site}", as_site.pack_id)
    return Installed(added, len(clips), unpinned)


def installed_packs(store: CacheStore) -> dict[str, str]:
    """Site → the pack id this board holds for it."""
    return {
        key.removeprefix(META_PACK): value
        for key, value in store.meta().items()
        if key.startswith(META_PACK)
    }


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def _read(pack: Path) -> list[Clip]:
    if not pack.is_file():
        raise CacheError(f"{pack}: no such prompt pack")
    with CacheStore(pack, recover=False, ttl_s=0) as source:
        clips = list(source.clips(order="key"))
    for clip in clips:
        clip.pinned, clip.expires = True, None
    return clips


def check_replay(store: CacheStore, versions: PackVersions, pack: SitePack) -> None:
    """Before fetching: TrustError when ``pack`` is an older signed pack than the last one this
    board took for its site (``install_pack`` claims it for good)."""
    if pack.version is not None:
        adopt_versions(store, versions)
        versions.check(pack.site, pack.version, pack.pack_id)


def adopt_versions(store: CacheStore, versions: PackVersions) -> int:
    """Move the signed versions an older speakd kept in the cache's meta table into the state's
    record (a higher one there stays), then drop them from the cache; returns how many."""
    meta = store.meta()
    moved = {k.removeprefix(META_VERSION): v for k, v in meta.items() if k.startswith(META_VERSION)}
    for site, version in moved.items():
        versions.raise_to(site, int(version), meta.get(f"{META_PACK}{site}", ""))
    if moved:
        with store.transaction() as db:
            db.execute("DELETE FROM meta WHERE key LIKE ?", [f"{META_VERSION}%"])
        log.info(
            "pack versions of %s moved from %s to %s", ", ".join(moved), store.path, versions.path
        )
    return len(moved)


def _adopt_untracked(db: Database, keys: list[str]) -> None:
    """Pinned clips no owner tracks were pinned by hand or before tracking: keep them pinned."""
    db.conn.executemany(
        "INSERT OR IGNORE INTO pack_pins (owner, key) SELECT ?, key FROM clips"
        " WHERE key = ? AND pinned = 1 AND NOT EXISTS (SELECT 1 FROM pack_pins p WHERE p.key = ?)",
        [(LOCAL, k, k) for k in keys],
    )


def _replace_rows(db: Database, owner: str) -> set[str]:
    """Drop ``owner``'s rows; returns the keys they held."""
    old = {k for (k,) in db.execute("SELECT key FROM pack_pins WHERE owner = ?", [owner])}
    db.execute("DELETE FROM pack_pins WHERE owner = ?", [owner])
    return old


def _unpin_orphans(db: Database, keys: set[str], expires: float | None) -> int:
    """Unpin those of ``keys`` no owner holds any more; the LRU (and TTL) take them in time."""
    unpinned = 0
    for key in keys:
        if db.execute("SELECT 1 FROM pack_pins WHERE key = ?", [key]).fetchone() is None:
            cursor = db.execute(
                "UPDATE clips SET pinned = 0, expires = ? WHERE key = ? AND pinned = 1",
                [expires, key],
            )
            unpinned += cursor.rowcount
    return unpinned


def export_pack(store: CacheStore, out: Path, everything: bool = False) -> int:
    """Write the pinned clips (all of them with ``everything``) to a new pack; returns the count."""
    if out.exists():
        raise CacheError(f"{out}: exists; export writes a new pack")
    clips = list(store.clips(pinned_only=not everything, order="key"))
    for clip in clips:
        clip.pinned, clip.expires = True, None
    with CacheStore(out, recover=False, max_bytes=1 << 62, ttl_s=0) as pack:
        return pack.put_many(clips)
