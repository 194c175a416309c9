"""What a request to a Piper voice resolves to: the options a request may set, the parameters that
change its audio (``VitsParams``, with the render version that keys them), its seeds, and the
constants of the voice's bundle. Data only, shared by the voice and the tools that key or read it.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from typing import Any

from speakd.engines.base import EngineError
from speakd.engines.options import Option

BUNDLE_MODEL = "voice.onnx"
BUNDLE_CONFIG = "voice.onnx.json"
DEFAULT_ALIAS = "default"
SPEAKER_SEP = "#"
# Per-request overrides accepted in SynthesisConfig.extra (Piper's SynthesisConfig knobs).
OPTIONS = (
    Option("noise_scale", float, "variation of the voice (Piper's noise_scale)", 0.0, 2.0),
    Option("noise_w", float, "variation of phoneme durations (Piper's noise_w)", 0.0, 2.0),
    Option("sentence_silence", float, "seconds of silence between sentences", 0.0, 10.0),
)


def derive_seed(*parts: Any) -> int:
    """A well-mixed non-negative int64 from any JSON-able parts (request hash, sentence index)."""
    digest = hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)


# The pause a clause cut off its sentence (``split_clauses``) ends with, on top of its own: a
# sentence said whole pauses 340–380 ms at a comma, a clause said alone ends 120 ms after its
# comma and the next starts at its sound (trimmed).
CLAUSE_PAUSE_S = 0.22

# How this code turns the params into samples, in every key (``audio_params``): raised whenever
# the same request gives other samples, so no clip or pack made the old way is a hit beside the
# new ones. 2: the first sentence starts without its leading silence; pitch by resampling.
# 3: and without the near-silence before its first sound (``split.onset``); long sentences
# cut after their clause breaks (``text.split_clauses``). 4: LayerNorms run as one node each
# (``layernorm.py``: the same audio to a sample's last bit or so, but a duration can round the
# other way). 5: the text encoder's attention in fewer nodes (``attention.py``): for inputs of
# about 125–131 ids onnxruntime's GEMM sums the relative values in other blocks, z_p within 1e-5,
# one 16-bit step on a few samples (169 of the 60-word sentence's 400 000, said by clauses).
RENDER = 5


@dataclass(frozen=True)
class VitsParams:
    """Everything resolved for one request that changes the audio (``audio_params``)."""

    voice: str
    length_scale: float
    noise_scale: float
    noise_w: float
    sentence_silence: float
    render: int = RENDER


# The embedded voice over speakd.request.loudness's calibration text, as ``speakd-tools loudness
# embedded`` prints it; tests/test_loudness.py measures it again. Another package version has
# another bundle id, so this record then no longer applies and the voice is measured on first use.
EMBEDDED_LOUDNESS = {
    "calibration": 1,
    "bundle_id": "en_US-joe-medium-43b5ece81b64a8ab",
    "lufs": -25.55,
}


def number(name: str, value: Any, positive: bool = False) -> float:
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise EngineError(f"vits: {name} must be a number, got {value!r}") from None
    if not math.isfinite(x) or x < 0 or (positive and x == 0):
        raise EngineError(f"vits: {name} must be {'> 0' if positive else '>= 0'}, got {value!r}")
    return x
