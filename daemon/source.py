"""Resolves a request to audio: the cache when it has the clip, else the engine.

The scheduler asks an ``AudioSource`` for a stream of chunks and plays whatever it yields; it
never knows whether the audio came from SQLite or from the model.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterator
from typing import Any, Protocol

from speakd.audio import AudioChunk
from speakd.engines.base import Engine
from speakd.keys import audio_key, seed_from_key
from speakd.messages import SpeakRequest


class AudioSource(Protocol):
    def stream(self, request: SpeakRequest, cancel: threading.Event) -> Iterator[AudioChunk]: ...

    def status(self) -> dict[str, Any]: ...


def with_default_seed(engine: Engine, request: SpeakRequest) -> tuple[str, SpeakRequest]:
    """The request's audio key, and the request with its seed pinned to the key's."""
    key = audio_key(engine, request.text, request.config)
    if request.config.seed is None:
        config = dataclasses.replace(request.config, seed=seed_from_key(key))
        request = dataclasses.replace(request, config=config)
    return key, request


class EngineSource:
    """Every request goes to the engine (no cache configured)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def stream(self, request: SpeakRequest, cancel: threading.Event) -> Iterator[AudioChunk]:
        _, request = with_default_seed(self.engine, request)
        return self.engine.synthesize(request.text, request.config, cancel)

    def status(self) -> dict[str, Any]:
        return {"cache": None}
