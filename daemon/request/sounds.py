"""Sounds played as they are, not synthesised: a request's ``chime`` and SSML ``<audio src>``.

A sound's name is a built-in chime shipped with speakd (``speakd/data/chime-<name>.wav``, made by
``speakd_tools.tones``; the short ``capital`` icon is one too, though not listed among the chimes)
or the text of a pinned clip in the cache: a prompt pack's prompt as ``speakd cache ls --pinned``
lists it. Where several pinned clips have that text (one per voice), the request's voice's is
played, else its voice model's, else the first by key; a built-in name wins over a clip's text.
Pinned names are read from the cache once (``Sounds`` is made with the resolver, at start and on
reload) and a name not known then is looked for again when asked, so a pack imported meanwhile is
found.

Sounds play at the loudness target like voices (``speakd.request.loudness``): a clip normalised to
the target by its voice plays as stored, one normalised to another level is moved by the difference,
and a clip without a level (made with loudness off) or a built-in chime is measured once
(BS.1770) and scaled to the target. The gain follows from the sound's key and the target, both in
the request's key (``speakd.markup.plan.plan_key``).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.resources
import io
import logging
import sqlite3
import threading
import wave
from collections.abc import Callable
from typing import TYPE_CHECKING

from speakd.audio import AudioChunk, scale_volume
from speakd.cache.store import CacheError, Clip
from speakd.request.errors import RequestError
from speakd.request.loudness import gain_for, integrated_loudness
from speakd.request.prepare import Sound

if TYPE_CHECKING:
    from speakd.cache.store import CacheStore

log = logging.getLogger(__name__)

CHIMES = ("ding", "ding-dong", "attention")  # speakd/data/chime-<name>.wav
# built-in sounds that mark something in speech (speakd.markup.capitals), not offered as chimes
ICONS = ("capital",)
BUILT_IN = (*CHIMES, *ICONS)
MAX_LISTED = 100  # pinned names listed (status, Home Assistant): a big pack is not all chimes

ReadClip = Callable[[str], Clip | None]


def _chime_wav(name: str) -> bytes:
    return (importlib.resources.files("speakd") / "data" / f"chime-{name}.wav").read_bytes()


def _wav_chunk(data: bytes) -> AudioChunk:
    with wave.open(io.BytesIO(data), "rb") as w:
        return AudioChunk(w.readframes(w.getnframes()), w.getframerate())


class Sounds:
    """The sounds a request may name: the built-in chimes and the cache's pinned clips."""

    def __init__(self, store: CacheStore | None = None, loudness: float | None = None) -> None:
        self.store = store
        self.loudness = loudness  # the LUFS sounds play at; None: as stored
        self._lock = threading.Lock()
        self._pinned: dict[str, list[tuple[str, str, str]]] = {}  # text → (key, bundle, voice)
        self._chimes: dict[str, AudioChunk] = {}
        self._measured: dict[str, float] = {}  # sound key → LUFS
        if store is not None:
            self._read_pinned()

    def find(self, name: str, bundle: str = "", voice: str = "") -> Sound | None:
        """The sound called ``name`` for a request in ``voice`` of ``bundle``, or None."""
        name = name.strip()
        if name in BUILT_IN:
            return Sound(name, chime_key(name), self.loudness)
        with self._lock:
            refs = self._pinned.get(name)
        if refs is None and self.store is not None:
            refs = self._read_pinned().get(name)
        if not refs:
            return None
        key, _, _ = min(refs, key=lambda r: (r[1] != bundle, (r[1], r[2]) != (bundle, voice), r))
        return Sound(name, key, self.loudness)

    def names(self) -> list[str]:
        """The built-in chimes, then pinned clips' texts (at most ``MAX_LISTED``)."""
        with self._lock:
            return [*CHIMES, *sorted(self._pinned)[:MAX_LISTED]]

    def audio(self, sound: Sound, read_clip: ReadClip) -> AudioChunk:
        """The sound's samples at its loudness (``read_clip`` reads a pinned clip by key);
        ``unknown_clip`` when the clip left the cache since it was found."""
        if sound.name in BUILT_IN and sound.key == chime_key(sound.name):
            chunk, lufs = self._chime(sound.name), None
        else:
            clip = read_clip(sound.key)
            if clip is None:
                raise RequestError("unknown_clip", f"the pinned clip {sound.name!r} is gone")
            chunk, lufs = clip.chunk(), clip.params.get("loudness", {}).get("lufs")
        if sound.loudness is None:
            return chunk
        if lufs is not None:  # normalised by its voice: only the difference of levels
            return scale_volume(chunk, 10 ** ((sound.loudness - lufs) / 20))
        return scale_volume(chunk, gain_for(self._measure(sound.key, chunk), sound.loudness))

    def _chime(self, name: str) -> AudioChunk:
        with self._lock:
            chunk = self._chimes.get(name)
        if chunk is None:
            chunk = _wav_chunk(_chime_wav(name))
            with self._lock:
                self._chimes[name] = chunk
        return chunk

    def _measure(self, key: str, chunk: AudioChunk) -> float:
        with self._lock:
            measured = self._measured.get(key)
        if measured is None:
            measured = integrated_loudness(chunk.samples() / 32768.0, chunk.sample_rate)
            log.info("sound %s measures %.1f LUFS", key[:16], measured)
            with self._lock:
                self._measured[key] = measured
        return measured

    def _read_pinned(self) -> dict[str, list[tuple[str, str, str]]]:
        """Every pinned clip's name from the cache (no audio read), as the index now."""
        assert self.store is not None
        found: dict[str, list[tuple[str, str, str]]] = {}
        try:
            for row in self.store.listing(pinned_only=True):
                found.setdefault(row["text"].strip(), []).append(
                    (row["key"], row["bundle"], row["voice"])
                )
        except (CacheError, sqlite3.Error) as e:
            log.warning("pinned clips' names not read: %s", e)
        with self._lock:
            self._pinned = found
        return found


@functools.cache
def chime_key(name: str) -> str:
    """A built-in chime's key: its name and its file's digest, so a new file is a new key."""
    return f"chime:{name}:{hashlib.sha256(_chime_wav(name)).hexdigest()[:16]}"
