"""A stream of samples resampled by a fixed ratio, chunk by chunk, into exactly the samples one
call over the whole stream gives: what lets a voice's pitch move by resampling as it streams.

Output sample ``n`` is the input read at position ``n · step`` through a Kaiser-windowed sinc of
``TAPS`` taps each side, its fraction rounded to one of ``PHASES`` precomputed phases, low-passed
below the output's Nyquist when ``step`` > 1 (reading faster would alias what lies above it).
Each output sample depends on the same input samples and is summed in the same order however the
input is cut, so the stream holds back only the ``TAPS`` + ``step`` input samples its next output
needs (under 1 ms) and joins into the one-shot result bit for bit.
"""

from __future__ import annotations

import functools
import math

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

TAPS = 16  # each side: a transition band of about 1 kHz at 22.05 kHz
PHASES = 512  # fraction steps: the rounding of a position is under 0.1 % of a sample
KAISER_BETA = 8.6  # about −90 dB stop band
# Kernels kept (65 KB each, about a millisecond to make): a request's pitch picks its step, so an
# unbounded cache grew with every distinct pitch a client sent; a screen reader uses a few.
KERNELS = 16


@functools.lru_cache(maxsize=KERNELS)
def kernel(step: float) -> np.ndarray:
    """(PHASES + 1, 2·TAPS) float32: for fraction f = phase / PHASES, the weights of input
    samples ``i0 − TAPS + 1 … i0 + TAPS`` for the output at position ``i0 + f``."""
    cutoff = 0.97 * min(1.0, 1.0 / step)
    f = np.arange(PHASES + 1)[:, None] / PHASES
    d = np.arange(-TAPS + 1, TAPS + 1)[None, :] - f  # each tap's distance from the position
    window = np.i0(KAISER_BETA * np.sqrt(np.clip(1 - (d / TAPS) ** 2, 0, None))) / np.i0(
        KAISER_BETA
    )
    return (cutoff * np.sinc(cutoff * d) * window).astype(np.float32)


class Resampler:
    """Feeds of float32 samples in, resampled samples out: ``step`` input samples per output
    sample (> 1 shortens the stream and raises its pitch when played at the same rate)."""

    def __init__(self, step: float) -> None:
        if not (math.isfinite(step) and step > 0):
            raise ValueError(f"resampling step must be > 0, got {step}")
        self.step = step
        self._kernel = kernel(step)
        self._buf = np.zeros(TAPS, np.float32)  # input from index ``_base`` on (zeros before 0)
        self._base = -TAPS
        self._fed = 0  # input samples fed
        self.made = 0  # output samples given

    def feed(self, x: np.ndarray) -> np.ndarray:
        """The outputs ``x`` completes (their whole support fed)."""
        x = np.asarray(x, np.float32).reshape(-1)
        self._buf = np.concatenate([self._buf, x])
        self._fed += x.size
        last = self._base + self._buf.size - 1 - TAPS  # the last position fully supported
        return self._run(math.floor(last / self.step) + 1 if last >= 0 else 0)

    def flush(self) -> np.ndarray:
        """The rest: ``round(fed / step)`` outputs in all, zeros read past the end."""
        pad = np.zeros(2 * TAPS + math.ceil(self.step) + 1, np.float32)
        self._buf = np.concatenate([self._buf, pad])
        return self._run(round(self._fed / self.step))

    def _run(self, total: int) -> np.ndarray:
        """Outputs ``made`` … ``total`` − 1."""
        n = np.arange(self.made, total, dtype=np.float64)
        if not n.size:
            return np.zeros(0, np.float32)
        pos = n * self.step
        i0 = np.floor(pos).astype(np.int64)
        phase = np.rint((pos - i0) * PHASES).astype(np.int64)
        windows = sliding_window_view(self._buf, 2 * TAPS)[i0 - TAPS + 1 - self._base]
        y = np.einsum("ij,ij->i", windows, self._kernel[phase]).astype(np.float32)
        self.made = total
        keep = math.floor(total * self.step) - TAPS + 1 - self._base  # the next one's first
        if keep > 0:
            self._buf, self._base = self._buf[keep:], self._base + keep
        return y
