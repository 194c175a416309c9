"""One-shot synthesis to a WAV file, no daemon (``speakd synth``): the daemon's own request path
(``prepare_request``, SSML included, then the resolver's stream) without a queue or a cache, so the
same request gives the same audio here as through the daemon."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from speakd.audio import join_chunks, write_wav
from speakd.config import DEFAULT_LUFS, EngineConfig
from speakd.engines import load_engine
from speakd.engines.base import EngineError, SynthesisConfig
from speakd.engines.bundle import load_bundle
from speakd.markup.plan import prepare_request
from speakd.markup.ssml import is_ssml
from speakd.request.messages import SpeakRequest
from speakd.request.prepare import check_config
from speakd.request.resolver import Resolver
from speakd.request.stream import Cancel
from speakd.request.voices import VoiceLibrary


def engine_config_for(bundle: Path | None, threads: int) -> EngineConfig:
    """The engine kind comes from the bundle's manifest; no bundle means the embedded voice. Its
    threads keep the caller's priority (``nice`` 0): a library's caller owns its process's."""
    if bundle is None:
        return EngineConfig(threads=threads, nice=0)
    kind = load_bundle(bundle, verify=False).engine
    return EngineConfig(kind=kind, bundle=str(bundle), threads=threads, nice=0)


def synthesize_to_wav(
    text: str,
    output: Path,
    *,
    bundle: Path | None = None,
    voice: str | None = None,
    speaker: str | None = None,
    speed: float | None = None,
    pitch: float | None = None,
    seed: int | None = None,
    lang: str | None = None,
    params: dict[str, Any] | None = None,
    threads: int = 2,
    loudness: float | None = DEFAULT_LUFS,
) -> float:
    config = SynthesisConfig(
        voice=voice,
        speaker=speaker,
        speed=speed,
        pitch=pitch,
        seed=seed,
        lang=lang,
        extra=params or {},
    )
    check_config(config)  # (prepare_request's own check) before seconds are spent on a load
    engine = load_engine(engine_config_for(bundle, threads))
    library = VoiceLibrary.of(engine, loudness)  # the daemon's audio.loudness_lufs by default
    prepared = prepare_request(library, text, config, ssml=is_ssml(text))
    request = SpeakRequest(text=text, config=config, prepared=prepared)
    audio = join_chunks(Resolver(engine).stream(request, Cancel()))
    if audio is None:
        raise EngineError("the engine produced no audio")
    write_wav(output, audio)
    return audio.duration
