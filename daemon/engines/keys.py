"""The audio key: what the cache is keyed on and what the default seed derives from.

sha256 of a canonical JSON of everything that changes the audio — the text as normalised for the
request's language, the resolved synthesis parameters (voice, and the language where the engine
reads text by it) and the bundle id — never the text alone. ``speakd.request.prepare`` is its one
caller in the request path.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from speakd.engines.base import SynthesisConfig, VoiceModel

KEY_VERSION = 1


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def audio_key(engine: VoiceModel, text: str, config: SynthesisConfig) -> str:
    return key_of(
        engine.normalize_text(text, config.lang),
        engine.audio_params(config),
        engine.bundle_id,
        config.seed,
    )


def key_of(normalized: str, params: dict[str, Any], bundle: str, seed: int | None) -> str:
    """The key of text already normalised and parameters already resolved."""
    material: dict[str, Any] = {
        "v": KEY_VERSION,
        "text": normalized,
        "params": params,
        "bundle": bundle,
    }
    if seed is not None:  # an explicit seed changes the audio; the default one is derived
        material["seed"] = seed
    return hashlib.sha256(canonical_json(material).encode()).hexdigest()


def seed_from_key(key: str) -> int:
    """31-bit seed: the same request always yields the same audio, so the cache stays coherent."""
    return int(key[:8], 16) & 0x7FFFFFFF
