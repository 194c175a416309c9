"""Prompt packs rolled out over MQTT: the board's side (``speakd-tools pack publish`` is the other).

A pack for site S is a retained manifest on ``<prefix>/S/pack/manifest`` plus its bytes in
retained QoS 1 chunks on ``<prefix>/S/pack/data/<pack id>/<n>`` (``messages.PackManifest``).
Every board subscribes to the manifest of each site it acts on (``[mqtt] site_id`` and
``site_ids``, so a group is just another site). Because the manifest is retained and the session
persistent, a board that was away gets it on its next connect; only then, and only when it lacks
that pack, does it subscribe to the pack's chunk topics, whose retained messages the broker sends
at once — a board joining a week late fetches the whole pack, a board that has it fetches nothing.

The board checks before it fetches (a voice's bundle id is one the pack was made for; the size
is within ``limits.max_pack_bytes``), checks each chunk against the manifest's sha256 on arrival,
writes it into a part file beside the cache and checks the whole file's sha256 at the end. Only
then is the pack imported, with ``cache.packs.import_pack`` as ``speakd cache import`` does: one
SQLite transaction (``CacheStore.put_many``), so a half pack is never visible, and an import only
adds and pins clips, so a pinned clip is never lost. Any refusal leaves the cache as it was.

Progress is the retained ``<prefix>/<own site>/pack`` (``messages.PackStatus``). Which pack
a board holds per site is kept in the cache's meta table, so the same manifest delivered again (a
republish, every reconnect) is a no-op; the last signed version per site is state, kept in the
state directory (``speakd.cache.versions``), so a deleted cache does not let an older one in.
Everything here runs on one worker thread, off the event loop: chunk hashing, file writes and the
import never delay a say.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import sqlite3
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from paho.mqtt.subscribeoptions import SubscribeOptions

from speakd.cache.packs import (
    SitePack,
    check_replay,
    file_sha256,
    install_pack,
    installed_packs,
)
from speakd.cache.store import CacheError, CacheStore
from speakd.cache.trust import Trust, TrustError
from speakd.cache.versions import PackVersions
from speakd.config import MqttConfig
from speakd.mqtt.messages import Message, PackManifest, PackStatus, decode_object
from speakd.mqtt.topics import SiteTopics, pack_manifest_topic, parse_pack_topic
from speakd.request.messages import RequestError

log = logging.getLogger(__name__)

# Retained messages are wanted here (unlike commands): the manifest and chunks are state.
RETAINED = SubscribeOptions(qos=1, retainHandling=SubscribeOptions.RETAIN_SEND_ON_SUBSCRIBE)


class PackRefused(Exception):
    """A pack this board will not take; ``str()`` is the reason in the status."""


@dataclass
class Download:
    """One pack being fetched: chunks land at their offset in ``part``, in any order."""

    manifest: PackManifest
    version: int | None  # the signed version, when the board checks signatures
    part: Path
    file: BinaryIO
    received: set[int] = field(default_factory=set)

    @property
    def complete(self) -> bool:
        return len(self.received) == len(self.manifest.chunk_sha256)


class PackReceiver:
    """Fetches, checks and imports the packs published for our sites (see the module doc).

    ``cache_store`` gives the cache the daemon plays from now (None when disabled; a reload may
    replace it) and ``bundles`` the bundle ids of the voices it has. ``subscribe``/``unsubscribe``
    and ``publish`` are the session's (paho's calls are thread-safe); every other method runs on
    the single worker thread. With ``trusted_keys`` a pack must be signed by one of them and
    newer than the last one taken for its site, as ``versions`` records it (the daemon's is in
    the state directory; without one, in memory); ``on_refused`` hears every refusal's reason.
    """

    def __init__(
        self,
        config: MqttConfig,
        cache_store: Callable[[], CacheStore | None],
        bundles: Callable[[], set[str]],
        max_pack_bytes: int,
        publish: Callable[[Message], Any],
        subscribe: Callable[[list[tuple[str, SubscribeOptions]]], None],
        unsubscribe: Callable[[list[str]], None],
        trusted_keys: Sequence[str] = (),
        on_refused: Callable[[str], None] = lambda _reason: None,
        versions: PackVersions | None = None,
    ) -> None:
        self.config = config
        self._cache_store = cache_store
        self._bundles = bundles
        self.max_pack_bytes = max_pack_bytes
        self._publish = publish
        self._subscribe = subscribe
        self._unsubscribe = unsubscribe
        self.trust = Trust(tuple(trusted_keys))
        self._on_refused = on_refused
        self.versions = versions or PackVersions(":memory:")
        self._topics = SiteTopics(config.prefix, config.site_id)
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="speakd-pack")
        self._downloads: dict[str, Download] = {}  # by the site the pack was published for
        self._lock = threading.Lock()  # guards _chunk_filters, read from paho's thread
        self._chunk_filters: dict[str, str] = {}

    # ---- called from the front-end ----------------------------------------------------------

    def subscriptions(self) -> list[tuple[str, SubscribeOptions]]:
        """Every manifest we follow, and the chunks of packs being fetched (on each connect)."""
        manifests = [pack_manifest_topic(self.config.prefix, s) for s in self.config.sites]
        with self._lock:
            chunks = list(self._chunk_filters.values())
        return [(topic, RETAINED) for topic in [*manifests, *chunks]]

    def receive(self, topic: str, payload: bytes) -> bool:
        """Queue a pack message for the worker; False when ``topic`` is not a pack topic of ours."""
        parsed = parse_pack_topic(self.config.prefix, topic)
        if parsed is None or parsed[0] not in self.config.sites:
            return False
        site, pack_id, index = parsed
        if index < 0:
            self._submit(self._on_manifest, site, payload)
        else:
            self._submit(self._on_chunk, site, pack_id, index, payload)
        return True

    def close(self) -> None:
        """Finish an import under way (one transaction), drop unfinished downloads."""
        self._submit(self._abandon_all)
        self._worker.shutdown(wait=True, cancel_futures=False)

    def _submit(self, fn: Callable[..., None], *args: Any) -> None:
        with contextlib.suppress(RuntimeError):  # closed: the next front-end takes over
            self._worker.submit(self._guarded, fn, *args)

    def _guarded(self, fn: Callable[..., None], *args: Any) -> None:
        try:
            fn(*args)
        except Exception:  # a bug here must never take the daemon down
            log.exception("pack: handling %s%s failed", fn.__name__, args[:1])

    # ---- the worker -------------------------------------------------------------------------

    def _on_manifest(self, site: str, payload: bytes) -> None:
        if not payload:  # the retained manifest was cleared: nothing to fetch, keep what we have
            log.info("pack: the manifest for site %s was withdrawn", site)
            self._abandon(site)
            return
        try:
            obj = decode_object(payload, self.config.max_payload_bytes)
            manifest = PackManifest.from_dict(self.config.prefix, site, obj)
        except (RequestError, ValueError, TypeError) as e:
            self._on_refused("bad_manifest")
            self._status("error", None, site, reason=f"bad_manifest: {e}")
            return
        try:  # before anything else: a refused manifest must not disturb a fetch under way
            version = self.trust.verify(obj, site) if self.trust.required else None
        except TrustError as e:
            self._refuse(manifest, str(e))
            return
        current = self._downloads.get(site)
        if current is not None and current.manifest.sha256 == manifest.sha256:
            # Published again while we fetch it: subscribing again has the broker re-send every
            # retained chunk (we keep the ones we have), so chunks a broker dropped come back.
            self._subscribe([(manifest.chunks_filter(), RETAINED)])
            return
        self._abandon(site)
        try:
            store = self._store()
            installed = installed_packs(store)
            if installed.get(site) == manifest.pack_id:
                log.info("pack %s for site %s is already installed", manifest.pack_id, site)
                self._status("ok", manifest.pack_id, site, installed)
                return
            if version is not None:
                check_replay(store, self.versions, SitePack(site, manifest.pack_id, version))
            self._check(manifest)
        except (PackRefused, TrustError, CacheError, sqlite3.Error) as e:
            self._refuse(manifest, str(e))
            return
        self._start(store, manifest, version)

    def _check(self, manifest: PackManifest) -> None:
        bundles = self._bundles()
        if not bundles & set(manifest.bundles):
            raise PackRefused(
                f"wrong_bundle: the pack is for {', '.join(manifest.bundles) or 'no bundle'}, "
                f"this board's voices are {', '.join(sorted(bundles))}"
            )
        if manifest.size > self.max_pack_bytes:
            raise PackRefused(
                f"too_large: the pack has {manifest.size} bytes, "
                f"limits.max_pack_bytes is {self.max_pack_bytes}"
            )

    def _start(self, store: CacheStore, manifest: PackManifest, version: int | None) -> None:
        part = store.path.parent / f".pack-{manifest.pack_id}.part"
        try:
            file = part.open("wb")
            file.truncate(manifest.size)
        except OSError as e:
            self._refuse(manifest, f"no_space: cannot write {part}: {e}")
            return
        download = Download(manifest, version, part, file)
        self._downloads[manifest.site] = download
        log.info(
            "pack %s (%s) for site %s: fetching %d bytes in %d chunks",
            manifest.pack_id,
            manifest.name or "unnamed",
            manifest.site,
            manifest.size,
            len(manifest.chunk_sha256),
        )
        self._status("importing", manifest.pack_id, manifest.site, clips=manifest.clips)
        if download.complete:  # an empty pack file has no chunks to wait for
            self._finish(download)
            return
        with self._lock:
            self._chunk_filters[manifest.site] = manifest.chunks_filter()
        self._subscribe([(manifest.chunks_filter(), RETAINED)])

    def _on_chunk(self, site: str, pack_id: str, index: int, data: bytes) -> None:
        download = self._downloads.get(site)
        if download is None or download.manifest.pack_id != pack_id or index in download.received:
            return  # an old pack's chunk, or a re-delivery
        manifest = download.manifest
        if not data:  # being cleared by a newer publish; its manifest follows
            return
        if index >= len(manifest.chunk_sha256) or (
            hashlib.sha256(data).hexdigest() != manifest.chunk_sha256[index]
        ):
            self._abandon(site)
            self._refuse(manifest, f"corrupt_chunk: chunk {index} does not match the manifest")
            return
        try:
            download.file.seek(index * manifest.chunk_bytes)
            download.file.write(data)
        except OSError as e:
            self._abandon(site)
            self._refuse(manifest, f"no_space: cannot write {download.part}: {e}")
            return
        download.received.add(index)
        if download.complete:
            self._finish(download)

    def _finish(self, download: Download) -> None:
        manifest = download.manifest
        self._downloads.pop(manifest.site, None)
        self._stop_fetching(manifest.site)
        try:
            download.file.close()
            if file_sha256(download.part) != manifest.sha256:
                raise PackRefused("checksum: the pack's sha256 does not match the manifest")
            store = self._store()
            done = install_pack(
                store,
                download.part,
                SitePack(manifest.site, manifest.pack_id, download.version),
                self.versions,
            )
        except (PackRefused, TrustError) as e:
            self._refuse(manifest, str(e))
            return
        except (CacheError, sqlite3.Error, OSError) as e:
            self._refuse(manifest, f"import_failed: {e}")
            return
        finally:
            _remove(download.part)
        log.info(
            "pack %s for site %s imported: %d new of %d clips, pinned; %d clips only the pack it "
            "replaced held are unpinned",
            manifest.pack_id,
            manifest.site,
            done.added,
            done.clips,
            done.unpinned,
        )
        self._status(
            "ok",
            manifest.pack_id,
            manifest.site,
            clips=done.clips,
            added=done.added,
            unpinned=done.unpinned,
        )

    # ---- helpers ------------------------------------------------------------------------------

    def _store(self) -> CacheStore:
        """The cache the daemon plays from now (a reload may have replaced it)."""
        store = self._cache_store()
        if store is None:
            raise PackRefused("no_cache: the cache is disabled, packs have nowhere to go")
        return store

    def _refuse(self, manifest: PackManifest, reason: str) -> None:
        log.warning("pack %s for site %s refused: %s", manifest.pack_id, manifest.site, reason)
        self._on_refused(reason.partition(":")[0])
        self._status("error", manifest.pack_id, manifest.site, reason=reason)

    def _status(
        self,
        state: str,
        pack_id: str | None,
        site: str,
        installed: dict[str, str] | None = None,
        **extra: Any,
    ) -> None:
        cache_bytes = None
        try:
            store = self._store()
            installed = installed_packs(store) if installed is None else installed
            cache_bytes = store.stats()["bytes"]
        except (PackRefused, CacheError, sqlite3.Error):
            installed = installed or {}
        self._publish(
            PackStatus(
                self._topics, state, pack_id, site, installed, cache_bytes=cache_bytes, **extra
            )
        )

    def _stop_fetching(self, site: str) -> None:
        with self._lock:
            topic = self._chunk_filters.pop(site, None)
        if topic is not None:
            self._unsubscribe([topic])

    def _abandon(self, site: str) -> None:
        download = self._downloads.pop(site, None)
        self._stop_fetching(site)
        if download is not None:
            download.file.close()
            _remove(download.part)

    def _abandon_all(self) -> None:
        for site in list(self._downloads):
            self._abandon(site)


def _remove(part: Path) -> None:
    """The part file and the WAL files opening it as a database may have left."""
    for suffix in ("", "-wal", "-shm"):
        Path(f"{part}{suffix}").unlink(missing_ok=True)
