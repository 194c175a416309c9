"""ChatTTS's code sampling in numpy, in ChatTTS's exact order (CHATTTS.md §6).

temperature → repetition penalty (last 16 generated codes per codebook, EOS penalised too, as
ChatTTS's never-firing guard implies) → top-P (HF ``TopPLogitsWarper``, keep ≥ 3) → top-K (HF
``TopKLogitsWarper``, keep ≥ 3) → EOS mask while ``step < min_new_token`` → softmax → one draw per
codebook. The draw is an inverse CDF on a uniform from a seeded ``numpy.random.Generator``, so a
seed gives the same codes on every machine and tests can inject the uniforms. ChatTTS's
``torch.multinomial`` (re-seeded each step) cannot be reproduced in numpy; parity is checked on
the processed distributions with shared uniforms, and end to end with greedy decoding.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

MIN_TOKENS_TO_KEEP = 3  # ChatTTS gen_logits passes min_tokens_to_keep=3 to both warpers


@dataclass(frozen=True)
class SamplingParams:
    """ChatTTS ``InferCodeParams`` (sampling part). ``greedy`` = argmax after the penalty."""

    temperature: float = 0.3
    top_p: float | None = 0.7
    top_k: int | None = 20
    repetition_penalty: float = 1.05
    repetition_window: int = 16
    min_new_token: int = 0
    max_new_token: int = 2048
    greedy: bool = False

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be ≥ 0, got {self.temperature}")
        if self.top_p is not None and not 0.0 <= self.top_p <= 1.0:
            raise ValueError(f"top_p must be in [0, 1], got {self.top_p}")
        if self.top_k is not None and self.top_k < 1:
            raise ValueError(f"top_k must be ≥ 1, got {self.top_k}")
        if self.repetition_penalty <= 0:
            raise ValueError(f"repetition_penalty must be > 0, got {self.repetition_penalty}")
        if self.max_new_token < 1:
            raise ValueError(f"max_new_token must be ≥ 1, got {self.max_new_token}")

    @property
    def is_greedy(self) -> bool:
        return self.greedy or self.temperature == 0.0


def repetition_penalty(
    logits: np.ndarray, history: np.ndarray, penalty: float, window: int
) -> np.ndarray:
    """ChatTTS ``CustomRepetitionPenaltyLogitsProcessorRepeat`` (in place on ``logits``).

    ``logits`` (Q, V); ``history`` (n, Q) codes generated so far in this utterance.
    """
    if penalty == 1.0 or len(history) == 0:
        return logits
    q, v = logits.shape
    recent = history[-window:] + np.arange(q) * v  # flat (codebook, code) index
    counts = np.bincount(recent.ravel(), minlength=q * v).reshape(q, v)
    alpha = np.power(np.float32(penalty), counts, dtype=np.float32)
    np.copyto(logits, np.where(logits < 0, logits * alpha, logits / alpha))
    return logits


def top_p_filter(logits: np.ndarray, top_p: float, keep: int = MIN_TOKENS_TO_KEEP) -> np.ndarray:
    """HF ``TopPLogitsWarper``: drop the ascending-sorted prefix whose mass is ≤ 1 − top_p.

    Computed from the top: a token survives iff the mass of the tokens above it is < top_p (the
    same set, without scattering a full sort back), and the ``keep`` largest always survive.
    """
    probs = _softmax(logits)
    desc = -np.sort(-probs, axis=-1)
    above = np.cumsum(desc, axis=-1, dtype=np.float64)
    above[:, 1:] = above[:, :-1].copy()
    above[:, 0] = 0.0
    m = np.maximum((above < top_p).sum(axis=-1), keep)
    threshold = desc[np.arange(len(desc)), m - 1]
    logits[probs < threshold[:, None]] = -np.inf
    return logits


def top_k_filter(logits: np.ndarray, top_k: int, keep: int = MIN_TOKENS_TO_KEEP) -> np.ndarray:
    """HF ``TopKLogitsWarper``: drop everything below the k-th largest value (k ≥ keep)."""
    k = min(max(top_k, keep), logits.shape[-1])
    kth = np.partition(logits, -k, axis=-1)[:, -k, None]
    logits[logits < kth] = -np.inf
    return logits


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def process_logits(
    logits: np.ndarray, history: np.ndarray, step: int, params: SamplingParams, eos: int
) -> np.ndarray:
    """Raw code logits (Q, V) → probabilities (Q, V), ChatTTS's order. ``logits`` is clobbered."""
    logits /= np.float32(params.temperature)
    repetition_penalty(logits, history, params.repetition_penalty, params.repetition_window)
    if params.top_p is not None:
        top_p_filter(logits, params.top_p)
    if params.top_k is not None:
        top_k_filter(logits, params.top_k)
    if step < params.min_new_token:
        logits[:, eos] = -np.inf
    return _softmax(logits)


def inverse_cdf(probs: np.ndarray, uniforms: np.ndarray) -> np.ndarray:
    """One draw per row: the first index whose cumulative mass exceeds ``u · total``.

    A zero-probability entry can never be drawn (its cumulative mass equals its predecessor's).
    """
    cdf = np.cumsum(probs, axis=-1, dtype=np.float64)
    idx = (cdf <= (uniforms * cdf[:, -1])[:, None]).sum(axis=-1)  # searchsorted(side="right")
    return np.minimum(idx, probs.shape[-1] - 1)


class CodeSampler:
    """Draws the 4 codes of a step; owns the seeded generator of one request."""

    def __init__(self, params: SamplingParams, eos: int, seed: int) -> None:
        self.params = params
        self.eos = eos
        self.rng = np.random.Generator(np.random.PCG64(seed))

    def sample(self, logits: np.ndarray, history: np.ndarray, step: int) -> np.ndarray:
        """``logits`` (Q, V) float32 (clobbered), ``history`` (n, Q) → codes (Q,) int64."""
        p = self.params
        if p.is_greedy:
            repetition_penalty(logits, history, p.repetition_penalty, p.repetition_window)
            if step < p.min_new_token:
                logits[:, self.eos] = -np.inf
            return logits.argmax(axis=-1)
        probs = process_logits(logits, history, step, p, self.eos)
        return inverse_cdf(probs, self.rng.random(logits.shape[0]))
