"""``speakd-tools pack publish PACK --broker URL --site S``: a prompt pack to every board of S.

Order matters. The chunks go first (retained, QoS 1, each acknowledged), the manifest last: a
board that sees the manifest finds every chunk already retained at the broker. Then the chunks of
the pack the manifest replaced are cleared (an empty retained message deletes one), so the broker
holds one pack per site, not every pack ever published. The pack id is derived from the file's
sha256, so publishing the same file again rewrites identical retained messages and boards that
hold it do nothing (speakd/mqtt/packs.py).
"""

from __future__ import annotations

import hashlib
import logging
import time
from dataclasses import dataclass, replace
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from speakd.cache.store import CacheStore
from speakd.cache.trust import sign
from speakd.mqtt.messages import PackChunk, PackManifest, decode_object
from speakd.request.messages import RequestError
from speakd_tools.fleet.broker import Session

log = logging.getLogger(__name__)

# EMQX's default max packet size is 1 MB and many managed brokers cap lower; 256 KiB chunks fit
# everywhere we know of and keep a board's memory per message small.
DEFAULT_CHUNK_BYTES = 256 * 1024


class PackError(ValueError):
    """The file is not a pack that can be published; the message names it."""


def read_pack(
    path: Path, prefix: str, site: str, chunk_bytes: int = DEFAULT_CHUNK_BYTES
) -> tuple[PackManifest, list[bytes]]:
    """The manifest and chunks of a pack file made by precompute or ``speakd cache export``."""
    if not path.is_file():  # CacheStore would create an empty one
        raise PackError(f"{path}: no such prompt pack")
    if chunk_bytes < 1:
        raise PackError("--chunk-bytes must be at least 1")
    if not site or any(c in site for c in "+#/\x00"):
        raise PackError(f"--site: {site!r} is not one MQTT topic level (no +, #, /)")
    # Closing the store checkpoints its WAL into the file: the bytes read next are the whole pack.
    with CacheStore(path, recover=False, ttl_s=0, max_bytes=1 << 62) as store:
        rows = store.listing()
    if not rows:
        raise PackError(f"{path}: the pack has no clips")
    data = path.read_bytes()
    sha256 = hashlib.sha256(data).hexdigest()
    chunks = [data[i : i + chunk_bytes] for i in range(0, len(data), chunk_bytes)]
    manifest = PackManifest(
        prefix=prefix,
        site=site,
        pack_id=sha256[:16],
        sha256=sha256,
        size=len(data),
        clips=len(rows),
        bundles=sorted({row["bundle"] for row in rows}),
        chunk_bytes=chunk_bytes,
        chunk_sha256=[hashlib.sha256(c).hexdigest() for c in chunks],
        name=path.name,
    )
    return manifest, chunks


def sign_manifest(
    manifest: PackManifest, key: Ed25519PrivateKey, version: int | None = None
) -> PackManifest:
    """The manifest signed for its site; ``version`` (default: now in milliseconds) must grow
    from one publish to the next for a site, or boards refuse the pack as a replay."""
    version = time.time_ns() // 1_000_000 if version is None else version
    body = replace(manifest, version=version, key="", signature="").to_dict()
    return PackManifest.from_dict(manifest.prefix, manifest.site, sign(body, manifest.site, key))


@dataclass(frozen=True)
class Published:
    manifest: PackManifest
    replaced: str | None  # the pack id the manifest replaced, if another
    cleared: int  # its retained chunks deleted


def publish_pack(session: Session, manifest: PackManifest, chunks: list[bytes]) -> Published:
    """Chunks, then manifest, then clear the replaced pack's chunks (see the module doc)."""
    previous = _current_manifest(session, manifest)
    infos = [session.publish(PackChunk(manifest, i, chunk)) for i, chunk in enumerate(chunks)]
    for i, info in enumerate(infos):
        session.wait(info, manifest.chunk_topic(i))
    session.wait(session.publish(manifest), manifest.topic())
    log.info("published pack %s to %s (%d chunks)", manifest.pack_id, manifest.topic(), len(chunks))
    if previous is None or previous.pack_id == manifest.pack_id:
        return Published(manifest, None, 0)
    empty = [
        session.publish(PackChunk(previous, i, b"")) for i in range(len(previous.chunk_sha256))
    ]
    for i, info in enumerate(empty):
        session.wait(info, previous.chunk_topic(i))
    return Published(manifest, previous.pack_id, len(empty))


def _current_manifest(session: Session, manifest: PackManifest) -> PackManifest | None:
    for msg in session.retained([manifest.topic()]):
        try:
            obj = decode_object(bytes(msg.payload), 1 << 24)
            return PackManifest.from_dict(manifest.prefix, manifest.site, obj)
        except (RequestError, ValueError, TypeError) as e:
            log.warning("ignoring the unreadable manifest on %s: %s", msg.topic, e)
    return None
