"""speakd as a library: load a voice once, then synthesize, in the manner of piper's ``PiperVoice``.

    from speakd import SynthesisConfig, load_engine

    engine = load_engine()                        # the embedded voice; or a bundle folder,
    for chunk in engine.synthesize("Door open."):  # or a Piper voice's .onnx file
        play(chunk.pcm, chunk.sample_rate)        # int16 mono PCM, as it is made

Requests go through the daemon's own ``prepare``, so a text and ``SynthesisConfig`` give here the
audio (and the cache key) the daemon gives them. docs/api.md has the whole of it.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from speakd.audio import AudioChunk, join_chunks, scale_volume, write_wav
from speakd.config import DEFAULT_LUFS
from speakd.engines.base import Engine, EngineError, SynthesisConfig
from speakd.request.errors import RequestError
from speakd.request.loudness import VOICES as LOUDNESS
from speakd.request.prepare import Prepared, bcp47, prepare


@dataclass
class LoadedEngine:
    """A loaded model; ``synthesize`` may be called from several threads. Its audio is at the
    daemon's loudness (``audio.loudness_lufs``'s default; None: as the model makes it)."""

    engine: Engine
    loudness: float | None = DEFAULT_LUFS

    @property
    def sample_rate(self) -> int:
        return self.engine.sample_rate

    def voices(self) -> list[dict[str, Any]]:
        """Each voice's name and the languages it speaks."""
        return [
            {"name": v.name, "languages": [bcp47(code) for code in v.languages]}
            for v in self.engine.voices()
        ]

    def options(self) -> list[dict[str, Any]]:
        """What ``SynthesisConfig.extra`` may set: name, type, range, help."""
        return [o.describe() for o in self.engine.options]

    def prepare(self, text: str, config: SynthesisConfig | None = None) -> Prepared:
        """The request as the daemon sees it: resolved voice, validated options, key, seed.
        Raises ValueError (``RequestError``) saying what is wrong with it."""
        return prepare(self.engine, text, config or SynthesisConfig(), loudness=self.loudness)

    def synthesize(
        self,
        text: str,
        config: SynthesisConfig | None = None,
        cancel: threading.Event | None = None,
    ) -> Iterator[AudioChunk]:
        """PCM chunks as the engine makes them, scaled to ``loudness`` by the one gain the daemon
        uses for this voice; setting ``cancel`` stops within one step."""
        prepared = self.prepare(text, config)
        gain = 1.0 if self.loudness is None else LOUDNESS.gain(self.engine, self.loudness)
        chunks = self.engine.synthesize(prepared.text, prepared.config, cancel)
        return (scale_volume(chunk, gain) for chunk in chunks)

    def synthesize_wav(self, text: str, path: Path, config: SynthesisConfig | None = None) -> float:
        """The whole text into a WAV file; returns its duration in seconds."""
        audio = join_chunks(self.synthesize(text, config))
        if audio is None:
            raise EngineError("the engine produced no audio")
        write_wav(Path(path), audio)
        return audio.duration


def load_engine(bundle_or_voice: str | Path | None = None, *, threads: int = 2) -> LoadedEngine:
    """``None``: the embedded voice; a folder: a speakd bundle (VITS or ChatTTS, its hashes
    verified); a ``.onnx`` file: a Piper voice with its ``.onnx.json`` beside it."""
    from speakd.engines import load_engine as load_configured
    from speakd.engines.vits.engine import VitsEngine
    from speakd.library.synth import engine_config_for

    if bundle_or_voice is not None and Path(bundle_or_voice).suffix == ".onnx":
        return LoadedEngine(VitsEngine.load(Path(bundle_or_voice), threads=threads))
    bundle = None if bundle_or_voice is None else Path(bundle_or_voice)
    return LoadedEngine(load_configured(engine_config_for(bundle, threads)))


__all__ = ["AudioChunk", "LoadedEngine", "RequestError", "SynthesisConfig", "load_engine"]
