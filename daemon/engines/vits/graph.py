"""A Piper voice's files and graph: its JSON config, the model card's licence, and the graph read
with its noise seeded (``noise.py``), its LayerNorms fused (``layernorm.py``), its
relative-position attention and duration splines in fewer nodes (``attention.py``,
``spline.py``) and its inputs checked. The
sessions that run it are configured in ``speakd.engines.ortsession``, as every engine's are.

``engine.py`` streams audio out of what this module loads; a change to how a voice is read or its
graph prepared lands here, one to how its audio is made there.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import onnx

from speakd.engines.base import EngineError
from speakd.engines.vits.attention import fuse_relative_attention
from speakd.engines.vits.layernorm import fuse_layer_norms
from speakd.engines.vits.noise import make_noise_deterministic
from speakd.engines.vits.spline import fuse_splines

if TYPE_CHECKING:
    from speakd.engines.vits.engine import VitsVoice

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class VoiceConfig:
    """The parts of Piper's ``<voice>.onnx.json`` that synthesis needs."""

    sample_rate: int
    espeak_voice: str
    phoneme_id_map: dict[str, list[int]]
    noise_scale: float
    length_scale: float
    noise_w: float
    num_speakers: int
    speaker_id_map: dict[str, int]
    language: str
    vowel_clusters: frozenset[tuple[str, ...]] | None = None
    licence: str = ""  # the JSON's "license", when the voice's maker put one there

    @classmethod
    def from_dict(cls, d: dict[str, Any], source: Path) -> VoiceConfig:
        def get(*keys: str, default: Any = ...) -> Any:
            node: Any = d
            for k in keys:
                if not isinstance(node, dict) or k not in node:
                    if default is not ...:
                        return default
                    raise EngineError(f"{source}: missing key {'.'.join(keys)!r}")
                node = node[k]
            return node

        phoneme_type = get("phoneme_type", default="espeak")
        if phoneme_type != "espeak":
            raise EngineError(
                f"{source}: phoneme_type {phoneme_type!r} is not supported (speakd reads "
                "espeak voices)"
            )
        clusters = get("vowel_clusters", default=None)
        return cls(
            sample_rate=int(get("audio", "sample_rate")),
            espeak_voice=str(get("espeak", "voice")),
            phoneme_id_map=dict(get("phoneme_id_map")),
            noise_scale=float(get("inference", "noise_scale", default=0.667)),
            length_scale=float(get("inference", "length_scale", default=1.0)),
            noise_w=float(get("inference", "noise_w", default=0.8)),
            num_speakers=int(get("num_speakers", default=1)),
            speaker_id_map={str(k): int(v) for k, v in get("speaker_id_map", default={}).items()},
            language=str(get("language", "code", default=get("espeak", "voice"))),
            vowel_clusters=frozenset(tuple(c) for c in clusters) if clusters else None,
            licence=str(get("license", default="")),
        )

    def speakers(self) -> dict[str, int]:
        """Speaker name → id, by id, for multi-speaker voices (ids as names if the map is empty).

        The first (lowest id) is the voice's default speaker, as in Piper.
        """
        if self.num_speakers <= 1:
            return {}
        speakers = self.speaker_id_map or {str(i): i for i in range(self.num_speakers)}
        return dict(sorted(speakers.items(), key=lambda item: item[1]))


def voice_graph(voice: VitsVoice) -> onnx.ModelProto:
    """The voice's graph with its noise seeded, its LayerNorms one node each
    (``speakd.engines.vits.layernorm``), its attention layers and duration splines in fewer
    nodes (``speakd.engines.vits.attention``, ``speakd.engines.vits.spline``), its inputs
    checked."""
    try:
        model = onnx.load_from_string(read_voice_file(voice.model_path))
    except Exception as e:  # protobuf's DecodeError and friends
        raise EngineError(f"{voice.model_path}: not an ONNX model: {e}") from e
    try:
        replaced = make_noise_deterministic(model)
    except ValueError as e:
        raise EngineError(f"{voice.model_path}: {e}") from e
    _check_io({i.name for i in model.graph.input}, voice.config, voice.model_path)
    norms = fuse_layer_norms(model)
    attention = fuse_relative_attention(model)
    splines = fuse_splines(model)
    log.debug(
        "vits voice %s: %d noise nodes seeded, %d LayerNorms fused, %d attention layers and "
        "%d splines rewritten",
        voice.name,
        replaced,
        norms,
        attention,
        splines,
    )
    return model


def model_card_licence(model_path: Path) -> str:
    """The ``License:`` line of the MODEL_CARD Piper publishes beside each voice
    (``NAME.MODEL_CARD`` or ``MODEL_CARD`` in the voice's folder), else "unknown"."""
    for card in (model_path.with_suffix(".MODEL_CARD"), model_path.parent / "MODEL_CARD"):
        try:
            text = card.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        for line in text.splitlines():
            label, _, value = line.strip(" *-").partition(":")
            if label.strip().lower() in ("license", "licence") and value.strip():
                return value.strip()
    return "unknown"


def voice_config(config_bytes: bytes, config_path: Path) -> VoiceConfig:
    try:
        return VoiceConfig.from_dict(json.loads(config_bytes), config_path)
    except ValueError as e:
        raise EngineError(f"{config_path}: not a Piper voice config: {e}") from e


def read_voice_file(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as e:
        raise EngineError(f"{path}: cannot read the voice file: {e.strerror}") from e


def _check_io(names: set[str], config: VoiceConfig, model_path: Path) -> None:
    """Refuse a graph that is not a Piper VITS voice before the first request finds out."""
    needed = {"input", "input_lengths", "scales"} | ({"sid"} if config.num_speakers > 1 else set())
    missing = sorted(needed - names)
    if missing:
        raise EngineError(
            f"{model_path}: not a Piper VITS graph, missing inputs {missing} (has {sorted(names)})"
        )
