"""Loudness: ITU-R BS.1770-4 integrated loudness with numpy alone, and a voice's one gain.

Every voice plays at ``audio.loudness_lufs`` (docs/configuration.md): a voice's gain is measured
once, over a fixed calibration text in its language, and every chunk it makes is scaled by that one
constant (no pumping), before the cache stores it (``speakd.request.resolver``). The meter is
BS.1770's: K-weighting (a high shelf and a high pass, the biquads of the recommendation, applied
here in the frequency domain so the device needs no scipy), mean square over 400 ms blocks every 100
ms, an absolute gate at -70 LUFS and a relative gate 10 LU under the absolutely gated level. The
test suite checks it against ``pyloudnorm``.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import numpy as np

from speakd.engines.base import Engine, SynthesisConfig

log = logging.getLogger(__name__)

BLOCK_S = 0.4
STEP = 0.25  # of a block: 75 % overlap
ABSOLUTE_GATE = -70.0
RELATIVE_GATE = -10.0
MAX_GAIN = 100.0  # +40 dB: a near-silent (broken) voice is not blown up into its noise

# What a voice says to be measured. Changing it changes every voice's gain: bump CALIBRATION,
# which is in every audio key (``speakd.request.prepare``), so no clip made with the old gain is
# served.
CALIBRATION = 1
CALIBRATION_TEXT = {
    "en": "The next train to the airport leaves from platform two in five minutes. "
    "Please stand clear of the closing doors, and mind the gap.",
    "zh": "下一班开往机场的列车将在五分钟后从二号站台出发。请不要靠近正在关闭的车门。",
}
CALIBRATION_SEED = 1770


def _biquad(kind: str, gain_db: float, q: float, fc: float, rate: int) -> tuple[list, list]:
    """(b, a) of BS.1770's two K-weighting stages at ``rate`` (the Audio EQ Cookbook's forms)."""
    a_ = 10 ** (gain_db / 40)
    w0 = 2 * np.pi * fc / rate
    cos, alpha = np.cos(w0), np.sin(w0) / (2 * q)
    if kind == "high_shelf":
        root = 2 * np.sqrt(a_) * alpha
        b = [
            a_ * ((a_ + 1) + (a_ - 1) * cos + root),
            -2 * a_ * ((a_ - 1) + (a_ + 1) * cos),
            a_ * ((a_ + 1) + (a_ - 1) * cos - root),
        ]
        a = [(a_ + 1) - (a_ - 1) * cos + root, 2 * ((a_ - 1) - (a_ + 1) * cos)]
        a.append((a_ + 1) - (a_ - 1) * cos - root)
    else:  # high pass
        b = [(1 + cos) / 2, -(1 + cos), (1 + cos) / 2]
        a = [1 + alpha, -2 * cos, 1 - alpha]
    return b, a


def k_weighted(samples: np.ndarray, rate: int) -> np.ndarray:
    """The signal through both K-weighting stages. The filters' responses are applied to the
    spectrum of the signal padded with a second of zeros, far longer than their impulse
    responses last, so this is their recursive filtering to within rounding."""
    n = samples.size + rate
    spectrum = np.fft.rfft(samples, n)
    for stage in (
        _biquad("high_shelf", 4.0, 1 / np.sqrt(2), 1500.0, rate),
        _biquad("high_pass", 0.0, 0.5, 38.0, rate),
    ):
        b, a = stage
        spectrum *= np.fft.rfft(b, n) / np.fft.rfft(a, n)
    return np.fft.irfft(spectrum, n)[: samples.size]


def integrated_loudness(samples: np.ndarray, rate: int) -> float:
    """Integrated loudness in LUFS of mono float samples in [-1, 1] (-inf for silence). A clip
    shorter than one block is measured as one block."""
    y = k_weighted(np.asarray(samples, dtype=np.float64), rate)
    block = round(BLOCK_S * rate)
    seconds = y.size / rate
    count = max(1, int(np.round((seconds - BLOCK_S) / (BLOCK_S * STEP))) + 1)
    bounds = [
        (int(BLOCK_S * j * STEP * rate), int(BLOCK_S * (j * STEP + 1) * rate)) for j in range(count)
    ]
    z = np.array([np.sum(np.square(y[lo:hi])) / block for lo, hi in bounds])
    with np.errstate(divide="ignore"):
        levels = -0.691 + 10 * np.log10(z)
        gated = z[levels >= ABSOLUTE_GATE]
        if gated.size == 0:
            return float("-inf")
        relative = -0.691 + 10 * np.log10(gated.mean()) + RELATIVE_GATE
        kept = z[(levels > relative) & (levels > ABSOLUTE_GATE)]
        return float(-0.691 + 10 * np.log10(kept.mean())) if kept.size else float("-inf")


def gain_for(measured: float, target: float) -> float:
    """The factor that takes a clip measured at ``measured`` LUFS to ``target``, at most
    ``MAX_GAIN``; 1 for silence."""
    if not np.isfinite(measured):
        return 1.0
    return float(min(MAX_GAIN, 10 ** ((target - measured) / 20)))


def calibration_text(lang: str | None) -> str:
    base = (lang or "en").replace("_", "-").split("-")[0].lower()
    return CALIBRATION_TEXT.get(base, CALIBRATION_TEXT["en"])


def record(engine: Engine, measured: float) -> dict[str, Any]:
    """A measurement as the tools write it into a bundle's manifest (``loudness``): it holds for
    that bundle id (an NPU plan's audio is another precision, with an id of its own) and that
    calibration text only. Silence is recorded as None (JSON has no -inf)."""
    lufs = round(measured, 2) if np.isfinite(measured) else None
    return {"calibration": CALIBRATION, "bundle_id": engine.bundle_id, "lufs": lufs}


def recorded(engine: Engine) -> float | None:
    """The voice's level as its bundle records it, when the record holds for this engine."""
    entry = engine.loudness_record
    if not entry or entry.get("calibration") != CALIBRATION:
        return None
    if entry.get("bundle_id") != engine.bundle_id:
        return None
    return float("-inf") if entry.get("lufs") is None else float(entry["lufs"])


class VoiceLoudness:
    """Each voice's loudness, by bundle id: as its bundle records it, else measured once per
    process (a voice unloaded and loaded again is not measured again: its model is the same)."""

    def __init__(self) -> None:
        self._measured: dict[str, float] = {}
        self._lock = threading.Lock()

    def gain(self, engine: Engine, target: float) -> float:
        """The voice's one gain to ``target`` LUFS; the first call measures (a synthesis of the
        calibration text in the voice's first language; call it holding the voice) unless the
        bundle records the level."""
        with self._lock:
            measured = self._measured.get(engine.bundle_id)
        if measured is None:
            measured = recorded(engine)
        if measured is None:
            measured = self.measure(engine)
            with self._lock:
                self._measured[engine.bundle_id] = measured
        return gain_for(measured, target)

    @staticmethod
    def measure(engine: Engine) -> float:
        languages = engine.voices()[0].languages
        text = calibration_text(languages[0] if languages else None)
        chunks = list(engine.synthesize(text, SynthesisConfig(seed=CALIBRATION_SEED)))
        samples = np.concatenate([c.samples() for c in chunks]) if chunks else np.zeros(0)
        rate = chunks[0].sample_rate if chunks else 16000
        measured = integrated_loudness(samples.astype(np.float64) / 32768.0, rate)
        log.info("voice %s measures %.1f LUFS (calibration text)", engine.bundle_id, measured)
        return measured


VOICES = VoiceLoudness()  # one per process: the daemon, speakd synth and precompute workers
