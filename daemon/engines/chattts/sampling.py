"""ChatTTS's code sampling in numpy, in ChatTTS's exact order (docs/chattts.md, "Sampling order").

temperature → repetition penalty (last 16 generated codes per codebook, EOS penalised too, as
ChatTTS's never-firing guard implies) → top-P (HF ``TopPLogitsWarper``, keep ≥ 3) → top-K (HF
``TopKLogitsWarper``, keep ≥ 3) → EOS mask while ``step < min_new_token`` → softmax → one draw per
codebook. The draw is an inverse CDF on a uniform from a seeded ``numpy.random.Generator``, so a
seed gives the same codes on every machine and tests can inject the uniforms. ChatTTS's
``torch.multinomial`` (re-seeded each step) cannot be reproduced in numpy; parity is checked on
the processed distributions with shared uniforms, and end to end with greedy decoding.

Every function takes rows stacked on the leading axes and reduces along the last one only, so the
batch decoder samples all rows that share sampling parameters in one pass (``sample_rows``) and
each row gets exactly the bits it would get alone.
"""

from __future__ import annotations

from collections.abc import Sequence
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
    return repetition_penalty_rows(logits[None], [history], penalty, window)[0]


def repetition_penalty_rows(
    logits: np.ndarray, histories: Sequence[np.ndarray], penalty: float, window: int
) -> np.ndarray:
    """``repetition_penalty`` of R rows at once: ``logits`` (R, Q, V), one history per row."""
    if penalty == 1.0 or not any(len(h) for h in histories):
        return logits
    _, q, v = logits.shape
    recent = [h[-window:] + np.arange(q) * v + i * q * v for i, h in enumerate(histories)]
    # only the codes in the window change (elsewhere alpha = penalty^0 = 1 leaves them exact)
    index, counts = np.unique(np.concatenate(recent).ravel(), return_counts=True)
    alpha = np.power(np.float32(penalty), counts, dtype=np.float32)
    flat = logits.reshape(-1)  # a view (C-contiguous)
    hit = flat[index]
    flat[index] = np.where(hit < 0, hit * alpha, hit / alpha)
    return logits


def top_p_filter(logits: np.ndarray, top_p: float, keep: int = MIN_TOKENS_TO_KEEP) -> np.ndarray:
    """HF ``TopPLogitsWarper``: drop the ascending-sorted prefix whose mass is ≤ 1 − top_p.

    Computed from the top: a token survives iff the mass of the tokens above it is < top_p (the
    same set, without scattering a full sort back), and the ``keep`` largest always survive.
    """
    probs = _softmax(logits)
    threshold = _top_p_threshold(-np.sort(-probs, axis=-1), top_p, keep)
    logits[probs < threshold[:, None]] = -np.inf
    return logits


def _top_p_threshold(desc: np.ndarray, top_p: float, keep: int) -> np.ndarray:
    """Over probabilities sorted descending (a whole row or its top part): the smallest that
    survives top-P (the mass above it is < top_p; at least ``keep`` survive)."""
    above = np.cumsum(desc, axis=-1, dtype=np.float64)
    above[:, 1:] = above[:, :-1].copy()
    above[:, 0] = 0.0
    m = np.maximum((above < top_p).sum(axis=-1), keep)
    return desc[np.arange(len(desc)), m - 1]


def top_k_filter(logits: np.ndarray, top_k: int, keep: int = MIN_TOKENS_TO_KEEP) -> np.ndarray:
    """HF ``TopKLogitsWarper``: drop everything below the k-th largest value (k ≥ keep)."""
    k = min(max(top_k, keep), logits.shape[-1])
    kth = np.partition(logits, -k, axis=-1)[:, -k, None]
    logits[logits < kth] = -np.inf
    return logits


def top_p_top_k_filter(
    logits: np.ndarray, top_p: float, top_k: int, keep: int = MIN_TOKENS_TO_KEEP
) -> np.ndarray:
    """``top_k_filter(top_p_filter(logits))``, the same bits, without sorting whole rows.

    Only the k largest logits can survive top-K, and they carry the k largest probabilities
    (softmax is monotonic), so top-P's cumulative mass is needed over those k only: if fewer
    than k survive top-P its threshold is one of them (the same prefix sums), and if k or more
    do, top-K alone decides. Either way a token is dropped iff its probability is below top-P's
    threshold or its logit below the k-th largest of what top-P kept.
    """
    k = min(max(top_k, keep), logits.shape[-1])
    rows = np.arange(len(logits))[:, None]
    probs = _softmax(logits)
    top = np.argpartition(logits, -k, axis=-1)[:, -k:]
    # counted over the k only (at most k survive here)
    threshold = _top_p_threshold(-np.sort(-probs[rows, top], axis=-1), top_p, keep)
    dropped = probs < threshold[:, None]
    # top-K's k-th value among what top-P kept (ties at the threshold included): the overall
    # k-th when top-P kept k or more, else -inf (top-K drops nothing more)
    kept = logits.shape[-1] - dropped.sum(axis=-1)
    kth = np.where(kept >= k, logits[rows, top].min(axis=-1), -np.inf)
    logits[dropped | (logits < kth[:, None])] = -np.inf
    return logits


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def process_logits(
    logits: np.ndarray, history: np.ndarray, step: int, params: SamplingParams, eos: int
) -> np.ndarray:
    """Raw code logits (Q, V) → probabilities (Q, V), ChatTTS's order. ``logits`` is clobbered."""
    return process_rows(logits[None], [history], [step], params, eos)[0]


def process_rows(
    logits: np.ndarray,
    histories: Sequence[np.ndarray],
    steps: Sequence[int],
    params: SamplingParams,
    eos: int,
) -> np.ndarray:
    """``process_logits`` of R rows with the same parameters: (R, Q, V) → (R, Q, V)."""
    if not logits.flags.c_contiguous:  # the filters write through a flat view
        raise ValueError("process_rows needs C-contiguous logits")
    logits /= np.float32(params.temperature)
    repetition_penalty_rows(logits, histories, params.repetition_penalty, params.repetition_window)
    flat = logits.reshape(-1, logits.shape[-1])  # a view: the filters write through
    if params.top_p is not None and params.top_k is not None:
        top_p_top_k_filter(flat, params.top_p, params.top_k)
    elif params.top_p is not None:
        top_p_filter(flat, params.top_p)
    elif params.top_k is not None:
        top_k_filter(flat, params.top_k)
    for i, step in enumerate(steps):
        if step < params.min_new_token:
            logits[i, :, eos] = -np.inf
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
        return sample_rows([self], logits[None], [history], [step])[0]


def sample_rows(
    samplers: Sequence[CodeSampler],
    logits: np.ndarray,
    histories: Sequence[np.ndarray],
    steps: Sequence[int],
) -> np.ndarray:
    """Codes (R, Q) for R rows whose samplers share one non-greedy ``SamplingParams``: one
    vectorised pass, each row drawing its uniforms from its own generator, so each row's codes
    are those it would draw alone. ``logits`` (R, Q, V) is clobbered."""
    p, eos = samplers[0].params, samplers[0].eos
    probs = process_rows(logits, histories, steps, p, eos)
    uniforms = np.concatenate([s.rng.random(logits.shape[1]) for s in samplers])
    return inverse_cdf(probs.reshape(-1, logits.shape[-1]), uniforms).reshape(len(samplers), -1)
