"""Quality measures of a quantized graph against its float original (numpy only).

* SNR in dB: 10·log10(Σref² / Σ(ref − test)²) — waveforms, mels, hidden states.
* Mel-cepstral distortion: cepstra of the natural-log mel *amplitude* spectrum with SPTK's scale
  (log|H(ω)| = c0 + 2·Σ c_d·cos(dω), so c_d = (1/M)·Σ_k log|H_k|·cos(πd(k+½)/M) over M mel
  bands, which stand in for SPTK's all-pass frequency warping), coefficients 1–24 (c0, the
  loudness, left out); MCD = mean over frames of (10/ln 10)·sqrt(2·Σ_d (c_d − c'_d)²) dB.
  Frames are aligned with DTW when the two renderings differ in length (VITS durations can move
  by a frame when the duration predictor is quantized).
* KL(p_float ‖ p_quant) of the per-codebook softmax, and argmax agreement.
* Word error rate: Levenshtein distance over words / reference words.
"""

from __future__ import annotations

import math

import numpy as np

MCD_COEFFS = 24
_K = 10.0 / math.log(10.0) * math.sqrt(2.0)


def snr_db(ref: np.ndarray, test: np.ndarray) -> float:
    ref, test = np.asarray(ref, np.float64).ravel(), np.asarray(test, np.float64).ravel()
    n = min(ref.size, test.size)
    noise = float(np.sum((ref[:n] - test[:n]) ** 2))
    signal = float(np.sum(ref[:n] ** 2))
    if noise == 0.0:
        return 200.0  # identical; a finite cap keeps reports and plots numeric
    return 10.0 * math.log10(max(signal, 1e-30) / noise)


def mel_filterbank(sr: int, n_fft: int, n_mels: int, fmin: float = 0.0) -> np.ndarray:
    """Slaney-style triangular filters on the HTK mel scale, (n_mels, n_fft//2+1)."""

    def hz2mel(f):
        return 2595.0 * np.log10(1.0 + np.asarray(f) / 700.0)

    def mel2hz(m):
        return 700.0 * (10.0 ** (np.asarray(m) / 2595.0) - 1.0)

    freqs = np.linspace(0, sr / 2, n_fft // 2 + 1)
    edges = mel2hz(np.linspace(hz2mel(fmin), hz2mel(sr / 2), n_mels + 2))
    fb = np.zeros((n_mels, freqs.size))
    for i in range(n_mels):
        lo, c, hi = edges[i], edges[i + 1], edges[i + 2]
        fb[i] = np.maximum(0, np.minimum((freqs - lo) / (c - lo), (hi - freqs) / (hi - c)))
    return fb


def log_mel(wave: np.ndarray, sr: int, n_fft: int = 1024, hop: int = 256, n_mels: int = 80):
    """Natural-log mel amplitude, (frames, n_mels)."""
    wave = np.asarray(wave, np.float64)
    if wave.size < n_fft:
        wave = np.pad(wave, (0, n_fft - wave.size))
    frames = np.lib.stride_tricks.sliding_window_view(wave, n_fft)[::hop]
    spec = np.abs(np.fft.rfft(frames * np.hanning(n_fft), axis=1))
    return np.log(np.maximum(spec @ mel_filterbank(sr, n_fft, n_mels).T, 1e-5))


def cepstra(log_mel_frames: np.ndarray, n: int = MCD_COEFFS) -> np.ndarray:
    """Cepstral coefficients 1..n of (frames, mels) log amplitudes (DCT-II, scale 1/M)."""
    m = log_mel_frames.shape[1]
    k = np.arange(m)
    basis = np.cos(np.pi / m * (k[None, :] + 0.5) * np.arange(1, n + 1)[:, None])
    return (log_mel_frames @ basis.T) / m


def dtw_path(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Frame pairs of the cheapest monotone alignment of a (n, d) and b (m, d), Euclidean."""
    n, m = len(a), len(b)
    cost = np.sqrt(((a[:, None, :] - b[None, :, :]) ** 2).sum(-1))
    acc = np.full((n + 1, m + 1), np.inf)
    acc[0, 0] = 0.0
    for i in range(1, n + 1):
        row, prev = acc[i], acc[i - 1]
        for j in range(1, m + 1):
            row[j] = cost[i - 1, j - 1] + min(prev[j], row[j - 1], prev[j - 1])
    i, j, pairs = n, m, []
    while i > 0 and j > 0:
        pairs.append((i - 1, j - 1))
        step = int(np.argmin([acc[i - 1, j - 1], acc[i - 1, j], acc[i, j - 1]]))
        i, j = (i - 1, j - 1) if step == 0 else (i - 1, j) if step == 1 else (i, j - 1)
    ia, ib = np.array(pairs[::-1]).T
    return ia, ib


def mcd_db(ref_log_mel: np.ndarray, test_log_mel: np.ndarray) -> float:
    """MCD between two (frames, mels) log-mel amplitude sequences; DTW when lengths differ."""
    a, b = cepstra(ref_log_mel), cepstra(test_log_mel)
    if len(a) != len(b):
        ia, ib = dtw_path(a, b)
        a, b = a[ia], b[ib]
    return float(np.mean(_K * np.sqrt(((a - b) ** 2).sum(-1))))


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, np.float64)
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def kl_divergence(ref_logits: np.ndarray, test_logits: np.ndarray) -> np.ndarray:
    """KL(softmax(ref) ‖ softmax(test)) over the last axis, in nats."""
    lp, lq = log_softmax(ref_logits), log_softmax(test_logits)
    return (np.exp(lp) * (lp - lq)).sum(-1)


def word_errors(ref: list[str], hyp: list[str]) -> int:
    """Levenshtein distance between two word lists (substitutions + deletions + insertions)."""
    prev = list(range(len(hyp) + 1))
    for i, r in enumerate(ref, 1):
        cur = [i] + [0] * len(hyp)
        for j, h in enumerate(hyp, 1):
            cur[j] = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (r != h))
        prev = cur
    return prev[-1]
