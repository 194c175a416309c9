"""One-shot synthesis to a WAV file, no daemon (``speakd synth``)."""

from __future__ import annotations

from pathlib import Path

from speakd.audio import join_chunks, write_wav
from speakd.bundle import load_bundle
from speakd.config import EngineConfig
from speakd.engines import load_engine
from speakd.engines.base import EngineError, SynthesisConfig
from speakd.messages import SpeakRequest
from speakd.source import with_default_seed


def engine_config_for(bundle: Path | None, threads: int) -> EngineConfig:
    """The engine kind comes from the bundle's manifest; no bundle means the embedded voice."""
    if bundle is None:
        return EngineConfig(threads=threads)
    kind = load_bundle(bundle, verify=False).engine
    return EngineConfig(kind=kind, bundle=str(bundle), threads=threads)


def synthesize_to_wav(
    text: str,
    output: Path,
    *,
    bundle: Path | None = None,
    voice: str | None = None,
    speed: float | None = None,
    seed: int | None = None,
    threads: int = 2,
) -> float:
    engine = load_engine(engine_config_for(bundle, threads))
    request = SpeakRequest(text=text, config=SynthesisConfig(voice=voice, speed=speed, seed=seed))
    _, request = with_default_seed(engine, request)
    audio = join_chunks(engine.synthesize(request.text, request.config))
    if audio is None:
        raise EngineError("the engine produced no audio")
    write_wav(output, audio)
    return audio.duration
