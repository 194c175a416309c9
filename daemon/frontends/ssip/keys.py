"""Key echo from the cache: the letters, digits, symbols and key names a screen reader says as
keys are typed (``daemon/data/key-echo.toml``), synthesized once in the background after READY
at the SSIP rates and pitches ``[ssip]`` names, so that Orca's ``CHAR x`` and its short ``SPEAK``
of a key name are cache hits from the first keypress on.

Each one is built as the SSIP front-end builds a message (``settings.request_fields`` under
speechd's default settings with that RATE and PITCH) and read through ``Control.stream``, the
path an HTTP caller takes: a key already in the cache, or in the shipped pack the package
installs (``speakd.cache.shipped``, made by this same prewarm: ``speakd.lifecycle.keyecho``), costs
one lookup, so a later start only fills what was evicted, and a daemon whose voice and settings
the shipped pack was made for synthesizes nothing. The prewarm starts a synthesis only while none
is in flight, so it never competes with speech someone is waiting for. The clips are ordinary
cache entries, not pinned: pins belong to prompt packs, which ``cache/packs.py`` releases when a
site's next pack arrives, while these follow the voice in use; a typed key refreshes its clip's
place in the LRU, and a restart redoes what aged out. A pinned pack of the same list comes from
``speakd-tools precompute --key-echo``.
"""

from __future__ import annotations

import functools
import importlib.resources
import itertools
import logging
import threading
import time
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from speakd.audio.pitch import unavailable
from speakd.config import SsipConfig
from speakd.control import Control
from speakd.frontends.ssip.settings import Settings, request_fields
from speakd.request.messages import SpeakRequest
from speakd.request.prepare import Speech

log = logging.getLogger(__name__)

ORIGIN = "ssip-prewarm"
DONE_LINE = "key echo: prewarm done"  # logged when the pack is in the cache (tests wait on it)


@dataclass(frozen=True)
class KeyEcho:
    """What a screen reader says for keys: characters (one ``CHAR`` each) and key names."""

    chars: tuple[str, ...]
    keys: tuple[str, ...]


@functools.cache
def key_echo() -> KeyEcho:
    path = importlib.resources.files("speakd") / "data" / "key-echo.toml"
    data = tomllib.loads(path.read_text(encoding="utf-8"))
    chars = tuple(dict.fromkeys(c for group in data["chars"] for c in group))
    return KeyEcho(chars, tuple(data["keys"]))


def settings_for(config: SsipConfig) -> Iterator[Settings]:
    """speechd's default client settings at each RATE and PITCH the pack is made for; PITCH 0
    alone where pitch cannot be shifted, since every pitch is then spoken at the voice's own."""
    pitches = (0,) if unavailable() else config.prewarm_pitches
    for rate, pitch in itertools.product(config.prewarm_rates, pitches):
        yield Settings(rate=rate, pitch=pitch)


def pack_fields(config: SsipConfig) -> Iterator[dict[str, Any]]:
    """The request fields of every message in the pack: each character as a ``CHAR``, each key
    name as a ``SPEAK`` (a key name is the same words at every PUNCTUATION level)."""
    pack = key_echo()
    for settings in settings_for(config):
        for char in pack.chars:
            yield request_fields(settings, char, None, char=True)
        for name in pack.keys:
            yield request_fields(settings, name, None)


@dataclass
class Prewarmed:
    """What a prewarm found and did: clips already there (in the cache or the shipped pack),
    synthesized, and texts it could not make."""

    found: int = 0
    shipped: int = 0  # of ``found``: hits in the shipped pack
    made: int = 0
    failed: int = 0


def pack_requests(control: Control, config: SsipConfig) -> Iterator[SpeakRequest | Exception]:
    """Every message of the pack built as the SSIP front-end builds it, or why it could not be."""
    for n, fields in enumerate(pack_fields(config)):
        try:
            yield control.build_request(
                fields | {"id": f"keyecho-{n}"}, origin=ORIGIN, strict_lang=False
            )
        except Exception as e:  # nothing to say, say: the caller counts it
            log.debug("key echo: %r not prewarmed: %s", fields["text"], e)
            yield e


def clip_keys(request: SpeakRequest) -> list[str]:
    """The keys of the clips a request's audio is made of (a composed one: its runs of text)."""
    prepared = request.prepared
    assert prepared is not None
    if not prepared.parts:
        return [prepared.key]
    return [part.prepared.key for part in prepared.parts if isinstance(part, Speech)]


async def prewarm(control: Control, config: SsipConfig, halt: threading.Event) -> Prewarmed:
    """Put the pack in the cache, one text at a time and only while no other synthesis is in
    flight (``Control.wait_idle``): a live request waits for at most one short key. What the
    cache or the shipped pack already holds costs one lookup. Stops when ``halt`` is set."""
    done = Prewarmed()
    if control.cache_store() is None:
        log.info("key echo: no prewarm, the cache is off")
        return done
    t0 = time.monotonic()
    for request in pack_requests(control, config):
        if isinstance(request, Exception):
            done.failed += 1
            continue
        if not await control.wait_idle(halt):
            return done
        try:
            async with control.stream(request) as stream:
                if stream.from_cache:
                    done.found += 1
                    done.shipped += stream.shipped
                    continue
                async for _ in stream.aread():
                    pass
                done.made += 1
        except Exception as e:  # busy, an engine failure: the rest go on
            done.failed += 1
            log.debug("key echo: %r not prewarmed: %s", request.text, e)
    if not await control.wait_idle(halt):  # the last clip stored, not only heard
        return done
    log.info(
        "%s: %d clips already cached (%d in the shipped pack), %d synthesized, %d skipped "
        "in %.1f s",
        DONE_LINE,
        done.found,
        done.shipped,
        done.made,
        done.failed,
        time.monotonic() - t0,
    )
    return done
