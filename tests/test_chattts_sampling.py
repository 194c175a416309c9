"""numpy sampling vs ChatTTS's own processors (torch), on random logits with shared uniforms."""

from __future__ import annotations

import numpy as np
import pytest

from speakd.engines.chattts.sampling import (
    CodeSampler,
    SamplingParams,
    inverse_cdf,
    process_logits,
    process_rows,
    repetition_penalty,
    sample_rows,
    top_k_filter,
    top_p_filter,
)

EOS = 625
V = 626


def _random_case(rng: np.random.Generator, n_hist: int) -> tuple[np.ndarray, np.ndarray]:
    logits = (rng.standard_normal((4, V)) * 3).astype(np.float32)
    history = rng.integers(0, 30, size=(n_hist, 4))  # small range → real repetitions
    history[rng.random(history.shape) < 0.05] = EOS
    return logits, history


def test_inverse_cdf_never_draws_a_zero_probability_code() -> None:
    probs = np.zeros((4, V), np.float32)
    probs[:, [3, 7, 9]] = [0.2, 0.5, 0.3]
    for u in np.linspace(0, 1, 50, endpoint=False):
        codes = inverse_cdf(probs, np.full(4, u))
        assert set(codes.tolist()) <= {3, 7, 9}
    assert inverse_cdf(probs, np.full(4, 0.1)).tolist() == [3] * 4
    assert inverse_cdf(probs, np.full(4, 0.69)).tolist() == [7] * 4
    assert inverse_cdf(probs, np.full(4, 0.71)).tolist() == [9] * 4


def test_filters_keep_at_least_three() -> None:
    logits = np.array([[10.0, 0.3, 0.2, 0.1, -1.0] + [-50.0] * (V - 5)] * 4, np.float32)
    kept = np.isfinite(top_p_filter(logits.copy(), 0.01)).sum(axis=1)
    assert kept.tolist() == [3] * 4
    flat = np.array([[1.0, 0.9, 0.8, 0.7, 0.6] + [-50.0] * (V - 5)] * 4, np.float32)
    # probabilities ≈ .242 .219 .198 .179 .162: a token stays while the mass above it is < top_p
    for top_p, n in ((0.5, 3), (0.7, 4), (0.9, 5)):
        assert np.isfinite(top_p_filter(flat.copy(), top_p)).sum(axis=1).tolist() == [n] * 4
    kept = np.isfinite(top_k_filter(logits.copy(), 1)).sum(axis=1)
    assert kept.tolist() == [3] * 4
    logits[:, 3] = 0.2
    kept = np.isfinite(top_k_filter(logits.copy(), 1)).sum(axis=1)
    assert kept.tolist() == [4] * 4  # ties at the 3rd value are kept, as in HF (value threshold)


def test_repetition_penalty_counts_only_the_window() -> None:
    logits = np.full((4, V), 2.0, np.float32)
    logits[:, 1] = -2.0
    history = np.array([[1, 1, 1, 1]] * 20 + [[5, 5, 5, 5]] * 16)
    out = repetition_penalty(logits.copy(), history, 1.05, 16)
    assert out[0, 1] == pytest.approx(-2.0)  # 1 is outside the last 16
    assert out[0, 5] == pytest.approx(2.0 / 1.05**16, rel=1e-5)
    out = repetition_penalty(logits.copy(), history[:22], 1.05, 16)
    assert out[0, 1] == pytest.approx(-2.0 * 1.05**14, rel=1e-5)  # negative: multiplied


def test_min_new_token_masks_eos_and_seed_is_deterministic() -> None:
    logits = np.zeros((4, V), np.float32)
    logits[:, EOS] = 50.0
    params = SamplingParams(min_new_token=2)
    s = CodeSampler(params, EOS, seed=1)
    assert EOS not in s.sample(logits.copy(), np.zeros((0, 4), np.int64), step=0)
    assert s.sample(logits.copy(), np.zeros((0, 4), np.int64), step=2).tolist() == [EOS] * 4
    rng = np.random.default_rng(3)
    draws = []
    for seed in (7, 7, 8):
        s = CodeSampler(SamplingParams(temperature=1.0), EOS, seed)
        draws.append([s.sample(_random_case(rng, 5)[0] * 0, np.zeros((0, 4)), 0) for _ in range(3)])
    assert np.array_equal(draws[0], draws[1])
    assert not np.array_equal(draws[0], draws[2])


@pytest.mark.host
def test_numpy_processing_equals_chattts_processors() -> None:
    torch = pytest.importorskip("torch")
    processors = pytest.importorskip("ChatTTS.model.processors")

    rng = np.random.default_rng(0)
    params = SamplingParams()  # ChatTTS InferCodeParams defaults
    warpers, procs = processors.gen_logits(
        num_code=EOS, top_P=params.top_p, top_K=params.top_k,
        repetition_penalty=params.repetition_penalty,
    )  # fmt: skip
    assert len(procs) == 1 and len(warpers) == 2
    temperature = torch.tensor([params.temperature] * 4).view(-1, 1)
    mismatched_codes = 0
    for trial in range(200):
        n_hist = int(rng.integers(0, 40))
        logits, history = _random_case(rng, n_hist)
        step = n_hist
        min_new = 3 if trial % 4 == 0 else 0
        p = SamplingParams(min_new_token=min_new)

        # ChatTTS (gpt.py generate): logits (B·4, V); input ids of row q = codes of codebook q.
        t_logits = torch.from_numpy(logits.copy()) / temperature
        t_tokens = torch.from_numpy(history.T.copy()).long()
        for proc in (*procs, *warpers):
            t_logits = proc(t_tokens, t_logits)
        if step < min_new:
            t_logits[:, EOS] = -torch.inf
        t_probs = torch.softmax(t_logits, dim=-1).numpy()

        np_probs = process_logits(logits.copy(), history, step, p, EOS)
        assert np.array_equal(np_probs > 0, t_probs > 0), f"support differs at trial {trial}"
        np.testing.assert_allclose(np_probs, t_probs, rtol=1e-5, atol=1e-7)

        u = rng.random(4)
        mismatched_codes += int((inverse_cdf(np_probs, u) != inverse_cdf(t_probs, u)).sum())
    assert mismatched_codes == 0


@pytest.mark.host
def test_greedy_equals_argmax_of_chattts_processed_scores() -> None:
    torch = pytest.importorskip("torch")
    processors = pytest.importorskip("ChatTTS.model.processors")
    _, procs = processors.gen_logits(num_code=EOS, top_P=0.7, top_K=20, repetition_penalty=1.05)
    rng = np.random.default_rng(1)
    sampler = CodeSampler(SamplingParams(greedy=True), EOS, seed=0)
    for _ in range(50):
        logits, history = _random_case(rng, int(rng.integers(1, 30)))
        t = procs[0](torch.from_numpy(history.T.copy()).long(), torch.from_numpy(logits.copy()))
        assert sampler.sample(logits.copy(), history, 5).tolist() == t.argmax(-1).tolist()


def _reference_probs(
    logits: np.ndarray, history: np.ndarray, step: int, p: SamplingParams
) -> np.ndarray:
    """The processing written out step by step on whole rows (dense repetition penalty, full
    top-P sort, then top-K): the oracle for the fused, row-stacked path."""
    logits = logits / np.float32(p.temperature)
    if len(history):
        recent = history[-p.repetition_window :] + np.arange(4) * V
        counts = np.bincount(recent.ravel(), minlength=4 * V).reshape(4, V)
        alpha = np.power(np.float32(p.repetition_penalty), counts, dtype=np.float32)
        logits = np.where(logits < 0, logits * alpha, logits / alpha)
    logits = top_k_filter(top_p_filter(logits, p.top_p), p.top_k)
    if step < p.min_new_token:
        logits[:, EOS] = -np.inf
    e = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


@pytest.mark.parametrize("ties", [False, True])
def test_rows_processed_together_get_the_bits_each_gets_alone(ties: bool) -> None:
    """8 rows at once (``process_rows``, fused top-P/top-K, sparse repetition penalty) give each
    row bit for bit the probabilities of the plain processing of that row alone, over top-P
    values that keep fewer and more than top-K, and with logits rounded to create ties."""
    rng = np.random.default_rng(7)
    for trial in range(60):
        p = SamplingParams(
            top_p=float(rng.choice([0.05, 0.3, 0.7, 0.95, 1.0])),
            top_k=int(rng.choice([1, 3, 20, 100])),
            min_new_token=int(rng.choice([0, 5])),
        )
        cases = [_random_case(rng, int(rng.integers(0, 40))) for _ in range(8)]
        logits = np.stack([c[0] for c in cases])
        if ties:
            logits = np.round(logits * 2) / 2  # many equal logits, equal probabilities
        histories = [c[1] for c in cases]
        steps = [len(h) for h in histories]
        got = process_rows(logits.copy(), histories, steps, p, EOS)
        for i in range(8):
            want = _reference_probs(logits[i], histories[i], steps[i], p)
            assert np.array_equal(got[i], want), f"trial {trial} row {i} {p}"
            alone = process_logits(logits[i].copy(), histories[i], steps[i], p, EOS)
            assert np.array_equal(alone, want)


def test_sample_rows_draws_what_each_sampler_draws_alone() -> None:
    rng = np.random.default_rng(3)
    cases = [_random_case(rng, 20) for _ in range(5)]
    together = sample_rows(
        [CodeSampler(SamplingParams(), EOS, seed) for seed in range(5)],
        np.stack([c[0] for c in cases]), [c[1] for c in cases], [20] * 5,
    )  # fmt: skip
    for seed, (logits, history) in enumerate(cases):
        alone = CodeSampler(SamplingParams(), EOS, seed).sample(logits.copy(), history, 20)
        assert together[seed].tolist() == alone.tolist()
