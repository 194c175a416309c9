"""The engine kinds speakd knows: the one place that names them.

Each kind says how to read a voice of its own (a bundle folder, or a bare model file) without
loading it, how to load it, whether it ships an embedded voice, who makes its models (Wyoming's
``info``) and the licence its published weights carry when a voice does not name one. The voice
library, Wyoming, ``speakd doctor`` and the docs read this table. The config takes the kinds'
names as data (``speakd.config.ENGINE_KINDS``, what ``engine.kind`` may say) and never imports
this module, which imports its ``EngineConfig``: adding a kind means adding its name there, one
entry here and its modules in ``speakd.engines``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from speakd.config import EngineConfig
    from speakd.engines.base import Engine, VoiceModel


@dataclass(frozen=True)
class EngineKind:
    name: str
    summary: str  # one line: what it is (docs, doctor, Wyoming's description)
    made_by: str  # who makes its models (Wyoming's attribution)
    url: str
    # A voice read from a bundle folder or a bare model file: names, languages, the bundle id.
    describe: Callable[[Path], VoiceModel]
    # The voice with its model in memory, tuned by [engine] (threads, batching).
    load: Callable[[VoiceModel, EngineConfig], Engine]
    model_suffix: str = ""  # bare model files of this kind found in [voices] dir ("" = none)
    embedded: Callable[[], VoiceModel] | None = None  # the voice a fresh install speaks with


def _vits_describe(path: Path) -> VoiceModel:
    from speakd.engines.vits.engine import VitsVoice

    return VitsVoice.from_bundle(path) if path.is_dir() else VitsVoice.from_file(path)


def _vits_load(voice: VoiceModel, config: EngineConfig) -> Engine:
    from speakd.engines.vits.engine import VitsVoice

    assert isinstance(voice, VitsVoice)
    return voice.load_model(config.threads)


def _vits_embedded() -> VoiceModel:
    from speakd.engines.vits.engine import VitsVoice

    return VitsVoice.embedded()


def _chattts_describe(path: Path) -> VoiceModel:
    from speakd.engines.chattts.engine import ChatTTSVoice

    return ChatTTSVoice.from_bundle(path)


def _chattts_load(voice: VoiceModel, config: EngineConfig) -> Engine:
    from speakd.engines.chattts.engine import ChatTTSVoice

    assert isinstance(voice, ChatTTSVoice)
    return voice.load_model(config.threads, batch_size=config.batch_size, paced=config.paced)


KINDS: dict[str, EngineKind] = {
    kind.name: kind
    for kind in (
        EngineKind(
            name="vits",
            summary="Piper VITS voices (espeak-ng phonemes) on onnxruntime",
            made_by="Piper voice authors (rhasspy/piper)",
            url="https://github.com/rhasspy/piper",
            describe=_vits_describe,
            load=_vits_load,
            model_suffix=".onnx",
            embedded=_vits_embedded,
        ),
        EngineKind(
            name="chattts",
            summary="ChatTTS exported to ONNX, INT8/4-bit calibrated, on onnxruntime",
            made_by="2noise (ChatTTS)",
            url="https://github.com/2noise/ChatTTS",
            describe=_chattts_describe,
            load=_chattts_load,
        ),
    )
}


def kind_of(name: str) -> EngineKind:
    from speakd.engines.base import EngineError

    try:
        return KINDS[name]
    except KeyError:
        raise EngineError(
            f"unknown engine kind {name!r} (known: {', '.join(sorted(KINDS))})"
        ) from None
