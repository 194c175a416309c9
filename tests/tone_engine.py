"""A tiny deterministic engine for scheduler tests: one tone chunk per word.

It implements the real Engine protocol, so the scheduler, sinks and front-ends run unchanged;
queue and interruption semantics are tested on it without paying for a neural model.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np

from speakd.audio import AudioChunk
from speakd.engines.base import EngineError, SynthesisConfig, VoiceInfo
from speakd.engines.options import Option


class ToneEngine:
    kind = "tone"
    sample_rate = 16000
    bundle_id = "tone-1"
    precision = "fp32"
    loudness_record = None
    options = (Option("pitch", float, "a tone option, for front-end tests", 0.0, 2.0),)

    def __init__(self, word_s: float = 0.1, compute_s: float = 0.0) -> None:
        self.word_s = word_s
        self.compute_s = compute_s  # simulated synthesis time per word
        self.calls: list[str] = []

    def voices(self) -> list[VoiceInfo]:
        return [VoiceInfo("low", "en"), VoiceInfo("high", "en")]

    def default_voice(self) -> str:
        return "low"

    def normalize_text(self, text: str, lang: str | None = None) -> str:
        return " ".join(text.split())

    def audio_params(self, config: SynthesisConfig) -> dict[str, Any]:
        return {"voice": config.voice or "low", "speed": config.speed or 1.0}

    def synthesize(
        self, text: str, config: SynthesisConfig, cancel: threading.Event | None = None
    ) -> Iterator[AudioChunk]:
        self.calls.append(text)
        if "FAIL" in text:
            raise EngineError("the tone engine was asked to fail")
        freq = 440.0 if (config.voice or "low") == "low" else 880.0
        n = int(self.sample_rate * self.word_s / (config.speed or 1.0))
        t = np.arange(n) / self.sample_rate
        for i, _word in enumerate(text.split()):
            if cancel is not None and cancel.is_set():
                return
            if self.compute_s:
                time.sleep(self.compute_s)
            amp = 0.3 + 0.05 * ((i + (config.seed or 0)) % 5)
            yield AudioChunk.from_float(amp * np.sin(2 * np.pi * freq * t), self.sample_rate)
