"""Batched decoding on the tiny bundle: real ONNX sessions, real KV slots.

The reference is the unbatched path: ``GptRunner.generate`` (one row, its own KV) and the engine
with ``batch_size = 1``. Random weights: lengths are forced with min/max_new_token.
"""

from __future__ import annotations

import copy
import logging
import mmap
import threading
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from speakd.audio import join_chunks
from speakd.cache.store import CacheStore, Clip
from speakd.engines.base import SynthesisConfig
from speakd.engines.chattts.batch import BatchDecoder, Row, sentence_sampler
from speakd.engines.chattts.batch_scheduler import BatchScheduler, Sentence
from speakd.engines.chattts.engine import ChatTTSEngine
from speakd.engines.chattts.gpt_runner import DecodeStats
from speakd.engines.chattts.sampling import SamplingParams
from speakd.engines.chattts.vocoder import Vocoder
from speakd.request.messages import SpeakRequest
from speakd.request.resolver import Resolver
from speakd_tools.precompute import Prompt, synthesize_batch
from tests.waits import wait_until

TEXTS = [
    "Hello world, the kitchen lights are on.",
    "今天天气很好。",
    "The front door is locked for the night.",
    "Short one.",
    "A much longer sentence follows here, with several words and a pause.",
    "Good night.",
]
LENGTHS = [40, 6, 70, 3, 55, 20]  # steps per sentence (min = max), short and long mixed


@pytest.fixture(scope="module")
def single(tiny_bundle: Path) -> ChatTTSEngine:
    return ChatTTSEngine.load(tiny_bundle, threads=1)


@pytest.fixture(scope="module")
def batched(tiny_bundle: Path) -> ChatTTSEngine:
    return ChatTTSEngine.load(tiny_bundle, threads=1, batch_size=4)


def _sentences(engine: ChatTTSEngine, seed: int, lengths: list[int]) -> list[Sentence]:
    params = engine.audio_params(SynthesisConfig())
    out = []
    for i, (text, n) in enumerate(zip(TEXTS, lengths, strict=True)):
        p = SamplingParams(max_new_token=n, min_new_token=n)
        out.append(Sentence(engine.prompt_embeds(text, params), sentence_sampler(p, 625, seed, i)))
    return out


def _unbatched(engine: ChatTTSEngine, sentence: Sentence) -> tuple[np.ndarray, np.ndarray]:
    """Codes and one-row streamed audio of one sentence through ``GptRunner`` alone."""
    sampler = copy.deepcopy(sentence.sampler)  # same seeded stream, left untouched
    codes, hiddens = [], []
    for c, h in engine.gpt.generate(sentence.embeds, sampler, None, DecodeStats()):
        codes.append(c.copy())
        hiddens.append(h.copy())
    audio = engine.vocoder.waveform(np.array(hiddens)) if hiddens else np.zeros(0, np.float32)
    return np.array(codes).reshape(-1, 4), audio


def test_batch_rows_equal_unbatched_rows(single: ChatTTSEngine, batched: ChatTTSEngine) -> None:
    """Six mixed-length sentences through 4 slots (continuous batching: freed slots are reused)
    give each sentence exactly the codes of decoding it alone, and audio of the right length."""
    sentences = _sentences(batched, seed=3, lengths=LENGTHS)
    refs = [_unbatched(single, s) for s in sentences]
    before = dict(batched.batch.counters)
    codes_out: list[list[np.ndarray]] = []
    audio: dict[int, list[np.ndarray]] = {}
    order, row_steps_at_first_audio = [], -1
    for index, chunk in batched.batch.stream(sentences, codes_out=codes_out):
        if not order:
            row_steps_at_first_audio = batched.batch.counters["row_steps"] - before["row_steps"]
        order.append(index)
        audio.setdefault(index, []).append(chunk)
    assert order == sorted(order)  # streamed in sentence order
    after = batched.batch.counters
    steps, row_steps = after["steps"] - before["steps"], after["row_steps"] - before["row_steps"]
    assert after["admitted"] - before["admitted"] == len(TEXTS)
    assert row_steps > 1.5 * steps  # rows really shared steps
    assert row_steps_at_first_audio < sum(LENGTHS) // 2  # sentence 1 sounded early
    for i, ((ref_codes, ref_audio), got) in enumerate(zip(refs, codes_out, strict=True)):
        np.testing.assert_array_equal(np.array(got).reshape(-1, 4), ref_codes, err_msg=f"row {i}")
        assert len(ref_codes) == LENGTHS[i]
        wave = np.concatenate(audio[i])
        assert len(wave) == len(ref_audio) == (2 * LENGTHS[i] - 1) * 256


def test_rows_admitted_together_share_prompt_passes_and_renders(
    batched: ChatTTSEngine,
) -> None:
    """Float graphs give a row the same prompt result in a padded multi-row pass and the same
    spectra stacked: rows admitted together share one prompt pass, then step and render in
    step, their chunks sharing Decoder/Vocos runs; each row's audio is the audio it streams
    alone."""
    assert batched.batch.decoder.prompts_batched and batched.vocoder.batched
    sentences = _sentences(batched, seed=11, lengths=[30, 30, 30, 30, 20, 20])[:4]
    alone = [
        np.concatenate([a for _, a in batched.batch.stream([copy.deepcopy(s)])]) for s in sentences
    ]
    before = dict(batched.batch.counters)
    batched.batch.paced = False  # nobody listens: every waiting row is admitted at once
    try:
        audio: dict[int, list[np.ndarray]] = {}
        for index, chunk in batched.batch.stream(sentences):
            audio.setdefault(index, []).append(chunk)
    finally:
        batched.batch.paced = True
    c = {k: v - before[k] for k, v in batched.batch.counters.items()}
    # sentence 1 alone (later sentences wait for its first audio), then 2-4 in one pass
    assert c["prompt_passes"] == 2 and c["admitted"] == 4
    assert c["render_runs"] <= c["renders"] / 2  # sentences 2-4's chunks three to a run
    assert c["render_ms"] > 0 and c["sample_ms"] > 0  # bench batch's time per iteration by part
    for i, ref in enumerate(alone):
        assert np.array_equal(np.concatenate(audio[i]), ref), f"row {i}"


def test_engine_batched_equals_batch_size_one(
    single: ChatTTSEngine, batched: ChatTTSEngine
) -> None:
    """Two concurrent multi-sentence requests on the batched engine: each request's PCM is
    byte-identical to the unbatched engine's (whatever shared their steps)."""
    cfg_a = SynthesisConfig(seed=5, extra={"max_new_token": 50, "min_new_token": 8})
    cfg_b = SynthesisConfig(seed=9, extra={"max_new_token": 30, "min_new_token": 30})
    text_a = "第一句话。第二句话比较长一点。第三句。"
    text_b = "Turn the lights off. Lock the door."
    ref_a = join_chunks(single.synthesize(text_a, cfg_a))
    ref_b = join_chunks(single.synthesize(text_b, cfg_b))
    results: dict[str, bytes] = {}

    def run(name: str, text: str, cfg: SynthesisConfig) -> None:
        joined = join_chunks(batched.synthesize(text, cfg))
        assert joined is not None
        results[name] = joined.pcm

    before = dict(batched.batch.counters)
    threads = [
        threading.Thread(target=run, args=("a", text_a, cfg_a)),
        threading.Thread(target=run, args=("b", text_b, cfg_b)),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert ref_a is not None and ref_b is not None
    assert results["a"] == ref_a.pcm
    assert results["b"] == ref_b.pcm
    after = batched.batch.counters
    assert after["admitted"] - before["admitted"] == 5
    assert after["row_steps"] - before["row_steps"] > after["steps"] - before["steps"]


def test_cancel_one_request_leaves_the_other_unchanged(
    single: ChatTTSEngine, batched: ChatTTSEngine
) -> None:
    cfg = SynthesisConfig(seed=21, extra={"max_new_token": 80, "min_new_token": 80})
    keep_text, drop_text = "The other request keeps going.", "This one is cancelled early."
    ref = join_chunks(single.synthesize(keep_text, cfg))
    cancel = threading.Event()
    kept: list = []
    t = threading.Thread(target=lambda: kept.extend(batched.synthesize(keep_text, cfg)))
    dropped = batched.synthesize(drop_text, cfg, cancel)
    t.start()
    next(dropped)  # the cancelled request sounded, then stops
    cancel.set()
    at_cancel = dict(batched.batch.counters)
    assert list(dropped) == []
    t.join(60)
    got = join_chunks(kept)
    assert ref is not None and got is not None and got.pcm == ref.pcm
    # the cancelled row left the batch at once: after the cancel (at most one step in flight)
    # every step advanced the kept row alone
    after = batched.batch.counters
    shared = (after["row_steps"] - at_cancel["row_steps"]) - (after["steps"] - at_cancel["steps"])
    assert shared <= 1
    assert batched.batch.decoder.free_slots() == batched.batch_size


def test_batch_variant_graph_falls_back_to_one_row(
    batched: ChatTTSEngine, tiny_bundle: Path, monkeypatch: pytest.MonkeyPatch, caplog
) -> None:
    """The fp32 graph is batch-invariant (measured at load); a graph that is not (activations
    quantized per batch) would change a seed's audio, so the engine decodes one row at a time."""
    assert batched.batch_invariant and batched.concurrent_synthesis
    monkeypatch.setattr(BatchDecoder, "batch_invariant", lambda self: False)
    strict = ChatTTSEngine.load(tiny_bundle, threads=1, batch_size=4)
    assert strict.batch is None and strict.batch_size == 1 and not strict.concurrent_synthesis
    assert "not batch-invariant" in caplog.text
    loose = ChatTTSEngine.load(tiny_bundle, threads=1, batch_size=4, batch_exact=False)
    assert loose.batch is not None and loose.batch_size == 4


class _LoneRowRounding:
    """The tiny fp32 session, except that a step over one row rounds its logits differently, as
    ``MatMulNBits``' M = 1 kernel does on full-size 4-bit graphs (the tiny graph is too small to
    show it). ``company=True`` also lets row 0 depend on row 1, as per-batch activation scales
    do. Records how many rows each decode step ran over."""

    def __init__(self, session, company: bool = False) -> None:
        self.session, self.company, self.rows_run = session, company, []
        self.decoder: BatchDecoder | None = None

    def io_binding(self):
        return self.session.io_binding()

    def run_with_iobinding(self, binding) -> None:
        self.session.run_with_iobinding(binding)
        dec = self.decoder
        if dec is None:
            return
        lo, hi = next((k for k, (b, _) in dec._windows.items() if b is binding), (0, 0))
        n = hi - lo
        if n:  # a decode step (0: a prompt pass)
            self.rows_run.append(n)
        if n == 1:
            dec.logits[lo, 0, 0] += 1e-3
        elif n > 1 and self.company:
            dec.logits[lo, 0, 0] += 1e-3 * float(dec.embeds[lo + 1, 0, 0])


def _probe_decoder(engine: ChatTTSEngine, session: _LoneRowRounding) -> BatchDecoder:
    dec = BatchDecoder(session, engine.spec, engine.gpt.emb_code, 4)  # type: ignore[arg-type]
    session.decoder = dec
    return dec


def test_lone_row_kernel_makes_every_step_run_two_rows(single: ChatTTSEngine) -> None:
    """A graph exact from two rows up only is still batch-invariant: every step then runs over
    ≥ 2 slots, so a lone row's codes equal its codes beside other rows."""
    session = _LoneRowRounding(single.gpt.session)
    dec = _probe_decoder(single, session)
    assert dec.batch_invariant() and dec.min_rows == 2
    session.rows_run.clear()
    sentence = _sentences(single, seed=4, lengths=LENGTHS)[5]
    embeds = sentence.embeds.reshape(-1, sentence.embeds.shape[-1])
    row = Row(embeds, copy.deepcopy(sentence.sampler), lambda c, h: None)
    dec.admit(row)
    assert dec.prefill(row)
    while dec.sample([row])[0]:
        dec.step([row])
    assert session.rows_run and min(session.rows_run) == 2  # never the lone-row kernel
    np.testing.assert_array_equal(row.history, _unbatched(single, sentence)[0])


def test_graph_whose_rows_see_each_other_is_not_batch_invariant(single: ChatTTSEngine) -> None:
    dec = _probe_decoder(single, _LoneRowRounding(single.gpt.session, company=True))
    assert not dec.batch_invariant()


class _SimulatedClock:
    """Time that moves only when the simulated engine works: the same on any machine, however
    loaded (a real clock would let the test's own scheduling delays count as engine time)."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


class _SlowSteps:
    """The tiny fp32 session on a simulated clock, as on a 2-core CPU where a 4-bit step is
    compute-bound: a decode step costs ``ms_per_slot`` per slot of its window, a prompt pass
    60 ms. Records the slots of every step."""

    def __init__(self, engine: ChatTTSEngine, clock: _SimulatedClock, ms_per_slot: float) -> None:
        self.session, self.clock, self.ms_per_slot = engine.gpt.session, clock, ms_per_slot
        self.decoder = BatchDecoder(self, engine.spec, engine.gpt.emb_code, 4)  # type: ignore[arg-type]
        self.windows: list[tuple[int, int]] = []

    def io_binding(self):
        return self.session.io_binding()

    def run_with_iobinding(self, binding) -> None:
        self.session.run_with_iobinding(binding)
        lo, hi = next((k for k, (b, _) in self.decoder._windows.items() if b is binding), (0, 0))
        if hi > lo:  # a decode step (a prompt pass is not in the window table)
            self.windows.append((lo, hi))
        self.clock.t += (self.ms_per_slot * (hi - lo) if hi > lo else 60.0) / 1e3


class _SlowVocoder(Vocoder):
    """The tiny Decoder/Vocos, each window step rendered costing ``ms_per_step`` simulated."""

    def __init__(self, engine: ChatTTSEngine, clock: _SimulatedClock, ms_per_step: float) -> None:
        super().__init__(engine.vocoder.decoder, engine.vocoder.vocos)
        self.clock, self.ms_per_step = clock, ms_per_step

    def spectra_many(self, windows: list[np.ndarray]) -> list[tuple[np.ndarray, np.ndarray]]:
        self.clock.t += self.ms_per_step * sum(len(w) for w in windows) / 1e3
        return super().spectra_many(windows)


class _DeliveryTimes(BatchScheduler):
    """Records (simulated time, audio seconds) of every chunk handed to the caller."""

    arrivals: list[tuple[float, float]]

    def _deliver(self, job, item) -> None:
        super()._deliver(job, item)
        held = job.request.held and job.request.held[-1][1] is item
        if isinstance(item, np.ndarray) and not held:
            self.arrivals.append((self._clock(), len(item) / 24000))


def _three_sentences(
    engine: ChatTTSEngine, ms_per_slot: float, paced: bool
) -> tuple[float, _SlowSteps, BatchScheduler]:
    """One request of three 60-step sentences on ``_SlowSteps``: the gaps a real-time listener
    hears (simulated time), the steps, the scheduler. Each sentence's codes must equal its
    unbatched codes whatever the pacing did (a paused row resumes unchanged)."""
    from speakd_tools.bench.engine.engine import playback

    clock = _SimulatedClock()
    steps = _SlowSteps(engine, clock, ms_per_slot)
    scheduler = _DeliveryTimes(
        steps.decoder, _SlowVocoder(engine, clock, 0.5), engine.schedule, paced, clock
    )
    scheduler.arrivals = []
    sentences = _sentences(engine, seed=6, lengths=[60, 60, 60, *LENGTHS[3:]])[:3]
    refs = [_unbatched(engine, s)[0] for s in sentences]
    codes_out: list[list[np.ndarray]] = []
    list(scheduler.stream(sentences, codes_out=codes_out))
    for i, (ref, got) in enumerate(zip(refs, codes_out, strict=True)):
        np.testing.assert_array_equal(np.array(got).reshape(-1, 4), ref, err_msg=f"row {i}")
    return playback(scheduler.arrivals)["stall_s"], steps, scheduler


@pytest.mark.parametrize("paced", [True, False])
def test_pacing_keeps_the_playing_sentence_ahead_of_its_listener(
    single: ChatTTSEngine, paced: bool
) -> None:
    """A CPU where a lone row is faster than real time and wider steps are not. Unpaced, every
    row steps every time and the listener of sentence 1 waits for audio again and again; paced,
    sentence 1 steps alone (the others pause) whenever its buffered audio runs short, so it plays
    without a gap, and the rows still share steps when it is ahead."""
    stall, steps, scheduler = _three_sentences(single, ms_per_slot=10.0, paced=paced)
    assert sum(hi - lo > 1 for lo, hi in steps.windows) > 10  # the rows did share steps
    if paced:
        assert stall == 0.0, f"{stall:.2f} s of gaps"
        assert scheduler.counters["paced_steps"] > 0
    else:
        assert stall > 0.25, f"only {stall:.2f} s of gaps"  # the case pacing exists for


def test_pacing_lets_every_row_step_when_even_a_lone_row_is_slower_than_real_time(
    single: ChatTTSEngine,
) -> None:
    """When one row alone cannot keep up with its listener, the listener waits whatever runs:
    pacing then steps every row (the text ends soonest) instead of stepping sentence 1 alone."""
    _, steps, scheduler = _three_sentences(single, ms_per_slot=30.0, paced=True)
    c = scheduler.counters
    assert c["paced_steps"] < 0.4 * c["steps"], c  # only the first sentence's start is paced
    assert sum(hi - lo == 3 for lo, hi in steps.windows) > 30


def test_kv_is_allocated_once(batched: ChatTTSEngine) -> None:
    """Admissions reuse the B slots: the KV buffers are the same objects and running more
    sentences allocates nothing of KV size."""
    dec = batched.batch.decoder
    kv_ids = [id(a) for a in dec.kv]
    kv_bytes = sum(a.nbytes for a in dec.kv)
    assert kv_bytes == 2 * dec.spec.num_layers * dec.batch_size * dec.spec.num_heads * (
        dec.row_context * dec.spec.head_dim * 4
    )
    lengths = [12, 4, 16, 3, 10, 6]
    list(batched.batch.stream(_sentences(batched, seed=1, lengths=lengths)))  # warm
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        for seed in (2, 3):
            list(batched.batch.stream(_sentences(batched, seed=seed, lengths=lengths)))
        grown, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert [id(a) for a in dec.kv] == kv_ids
    assert peak - base < kv_bytes / 8  # per-row buffers only (hidden history, audio chunks)
    assert grown - base < 1 << 20


def test_a_finished_row_gives_its_kv_pages_back(batched: ChatTTSEngine) -> None:
    """Once its row leaves, a slot's KV pages go back to the system (they read as zeros), so the
    daemon's RSS follows the rows in flight, not the longest sentence each slot has held; and the
    next rows in those slots still decode exactly as before."""
    dec, page = batched.batch.decoder, mmap.PAGESIZE
    lengths = [12, 4, 16, 3, 10, 6]
    first = list(batched.batch.stream(_sentences(batched, seed=5, lengths=lengths)))
    assert dec.free_slots() == dec.batch_size
    for a in dec.kv:
        for slot in range(dec.batch_size):
            view = a[slot].view(np.uint8).reshape(-1)
            lo = -(-view.ctypes.data // page) * page - view.ctypes.data
            hi = (view.ctypes.data + view.nbytes) // page * page - view.ctypes.data
            assert hi - lo >= page  # the slot spans whole pages
            assert not view[lo:hi].any()
    again = list(batched.batch.stream(_sentences(batched, seed=5, lengths=lengths)))
    assert [i for i, _ in again] == [i for i, _ in first]
    assert all(np.array_equal(a, b) for (_, a), (_, b) in zip(first, again, strict=True))


def test_chunked_prompt_pass_matches_whole(single: ChatTTSEngine, tiny_bundle: Path) -> None:
    """prefill_chunk feeds the prompt in pieces; greedy codes equal the whole-prompt pass."""
    chunked = ChatTTSEngine.load(tiny_bundle, threads=1, batch_size=2, prefill_chunk=5)
    params = chunked.audio_params(SynthesisConfig())
    p = SamplingParams(max_new_token=30, min_new_token=30, greedy=True)
    sentences = [
        Sentence(chunked.prompt_embeds(t, params), sentence_sampler(p, 625, 0, i))
        for i, t in enumerate(TEXTS[:3])
    ]
    codes_out: list[list[np.ndarray]] = []
    list(chunked.batch.stream(sentences, codes_out=codes_out))
    assert chunked.batch.counters["prompt_passes"] > len(sentences)
    for s, got in zip(sentences, codes_out, strict=True):
        ref, _ = _unbatched(single, s)
        np.testing.assert_array_equal(np.array(got).reshape(-1, 4), ref)


def test_concurrent_cache_misses_share_steps_and_cancel_alone(
    single: ChatTTSEngine, batched: ChatTTSEngine, tmp_path: Path
) -> None:
    """Through the cache: three misses at once run side by side (no engine lock), share decode
    steps, stream the same audio as one by one and are stored; the cancelled one is not stored
    and disturbs nobody."""
    cfg = SynthesisConfig(extra={"max_new_token": 40, "min_new_token": 40})
    texts = ["Kitchen lights on.", "Front door locked.", "Garage is open."]
    refs = [join_chunks(single.synthesize(t, cfg)) for t in texts[:2]]
    with CacheStore(tmp_path / "cache.db") as store:
        source = Resolver(batched, store)
        before = dict(batched.batch.counters)
        out: dict[int, list] = {0: [], 1: []}
        threads = [
            threading.Thread(
                target=lambda i=i: out[i].extend(
                    source.stream(SpeakRequest(text=texts[i], config=cfg), threading.Event())
                )
            )
            for i in (0, 1)
        ]
        cancel = threading.Event()
        dropped = source.stream(SpeakRequest(text=texts[2], config=cfg), cancel)
        for t in threads:
            t.start()
        next(dropped)
        cancel.set()
        assert list(dropped) == []
        for t in threads:
            t.join(60)
        after = batched.batch.counters
        assert after["row_steps"] - before["row_steps"] > 1.5 * (after["steps"] - before["steps"])
        for i, ref in enumerate(refs):
            got = join_chunks(out[i])
            assert ref is not None and got is not None and got.pcm == ref.pcm
        wait_until(lambda: source.status()["cache"]["stored"] >= 2, "two stored clips")
        status = source.status()["cache"]
        assert status["stored"] == 2 and status["synth"] == 3


def test_precompute_batch_equals_one_by_one(single: ChatTTSEngine, batched: ChatTTSEngine) -> None:
    prompts = [
        Prompt("Welcome home.", params=(("max_new_token", 24), ("min_new_token", 24))),
        Prompt("今天很好。", seed=4, params=(("max_new_token", 30), ("min_new_token", 10))),
        Prompt("The alarm is set.", params=(("max_new_token", 16), ("min_new_token", 16))),
    ]
    before = dict(batched.batch.counters)
    clips = synthesize_batch(batched, prompts)
    refs = synthesize_batch(single, prompts)
    after = batched.batch.counters
    assert after["row_steps"] - before["row_steps"] > after["steps"] - before["steps"]
    for clip, ref in zip(clips, refs, strict=True):
        assert isinstance(clip, Clip) and isinstance(ref, Clip)
        assert (clip.key, clip.audio, clip.params) == (ref.key, ref.audio, ref.params)


def test_batch_worker_log_lines_name_their_request(batched: ChatTTSEngine, caplog) -> None:
    """The decode worker serves many requests; each request's lines carry its id and voice."""
    from speakd.machine import logcontext

    logcontext.install()
    caplog.set_level(logging.DEBUG, logger="speakd.engines.chattts.batch_scheduler")
    with logcontext.request_context("door-7", "default"):
        list(batched.batch.stream(_sentences(batched, seed=1, lengths=LENGTHS)[:2]))
    done = [r for r in caplog.records if "sentence" in r.getMessage() and "done" in r.getMessage()]
    assert len(done) == 2 and {(r.request_id, r.voice) for r in done} == {("door-7", "default")}


@pytest.mark.parametrize("rtf", [0.6, 0.83, 0.95])
@pytest.mark.parametrize("paced", [True, False])
def test_a_slow_engine_holds_its_first_audio_and_then_plays_without_a_gap(
    single: ChatTTSEngine, rtf: float, paced: bool
) -> None:
    """One 300-step sentence on an engine that decodes at ``rtf`` × real time (a simulated step
    clock, renders included). Released at its first chunk, the growing chunks outrun the
    listener; held by the start gate, the first audio comes later and nothing stalls after it.
    The audio is the same either way."""
    from speakd_tools.bench.engine.engine import playback

    clock = _SimulatedClock()
    render_ms = 0.5  # per window step: ~1.6 window steps per decode step with the default schedule
    steps = _SlowSteps(single, clock, ms_per_slot=rtf * 21.333 - 2.5 * render_ms)
    scheduler = _DeliveryTimes(
        steps.decoder, _SlowVocoder(single, clock, render_ms), single.schedule, paced, clock
    )
    scheduler.arrivals = []
    sentence = _sentences(single, seed=8, lengths=[300, *LENGTHS[1:]])[0]
    audio = [a for _, a in scheduler.stream([sentence])]
    heard = playback(scheduler.arrivals)
    first = scheduler.arrivals[0][0]
    assert sum(len(a) for a in audio) == (2 * 300 - 1) * 256
    assert rtf - 0.03 < clock.t / ((2 * 300 - 1) * 256 / 24000) <= rtf  # the speed simulated
    if paced:
        assert heard["stall_s"] == 0.0, heard
    elif rtf > 0.5:
        assert heard["stall_s"] > 0.02, heard  # the gaps the gate exists for
    if rtf >= 0.83:
        assert first > 2 * 12 * rtf * 21.333e-3 or not paced  # it did wait for more than chunk 0


def test_equal_windows_share_one_decoder_and_vocos_run_with_the_same_spectra(
    single: ChatTTSEngine,
) -> None:
    """The batched vocoder stacks equal-length windows into one run each and leaves other
    lengths alone; every window's spectra are bit-identical to its own run (float conv nets)."""
    runs: list[int] = []

    class _Counting:
        def __init__(self, session) -> None:
            self.session = session

        def run(self, names, feeds):
            runs.append(next(iter(feeds.values())).shape[0])
            return self.session.run(names, feeds)

    voc = single.vocoder
    assert voc.batch_invariant(single.spec.hidden_size)
    batched = Vocoder(_Counting(voc.decoder), voc.vocos, batched=True)  # type: ignore[arg-type]
    rng = np.random.default_rng(3)
    windows = [
        rng.normal(0, 1, (n, single.spec.hidden_size)).astype(np.float32) for n in (20, 33, 20, 20)
    ]
    got = batched.spectra_many(windows)
    # the three 20-step windows in one run (checked once against the first alone), 33 alone
    assert sorted(runs) == [1, 1, 3] and batched.stackable == {20: True}
    runs.clear()
    batched.spectra_many(windows)
    assert sorted(runs) == [1, 3]  # a length checked once stacks without the check
    for window, (real, imag) in zip(windows, got, strict=True):
        ref_real, ref_imag = voc.spectra(window)
        assert np.array_equal(real, ref_real) and np.array_equal(imag, ref_imag)


def test_conv_nets_whose_rows_see_each_other_are_not_batched(single: ChatTTSEngine) -> None:
    """One activation scale over the stacked rows (dynamic int8 MatMuls) makes a window's
    spectra depend on its company: the probe says so, and such an engine renders one by one."""

    class _SharedScale:
        def __init__(self, session) -> None:
            self.session = session

        def run(self, names, feeds):
            return self.session.run(names, {k: v / np.abs(v).max() for k, v in feeds.items()})

    voc = Vocoder(_SharedScale(single.vocoder.decoder), single.vocoder.vocos)  # type: ignore[arg-type]
    assert not voc.batch_invariant(single.spec.hidden_size)
    # stacked anyway, a length that rounds differently is found and rendered one by one
    voc.batched = True
    rng = np.random.default_rng(4)
    windows = [rng.normal(0, s, (14, single.spec.hidden_size)).astype(np.float32) for s in (1, 9)]
    got = voc.spectra_many(windows)
    assert voc.stackable == {14: False}
    for window, (real, _imag) in zip(windows, got, strict=True):
        assert np.array_equal(real, voc.spectra_many([window])[0][0])


class _SlowSession:
    """A one-row GPT session on a simulated clock: every run (step or prompt) costs ``ms``."""

    def __init__(self, session, clock: _SimulatedClock, ms: float) -> None:
        self.session, self.clock, self.ms = session, clock, ms

    def io_binding(self):
        return self.session.io_binding()

    def run_with_iobinding(self, binding) -> None:
        self.session.run_with_iobinding(binding)
        self.clock.t += self.ms / 1e3


@pytest.mark.parametrize("paced", [True, False])
def test_the_one_row_path_holds_its_first_audio_too(tiny_bundle: Path, paced: bool) -> None:
    """``batch_size = 1`` (``synthesize`` straight through ``GptRunner``) at RTF ≈ 0.9 on a
    simulated clock: held by the gate it plays without a gap after its first audio; released at
    its first chunk it stalls. The PCM is the same."""
    from speakd_tools.bench.engine.engine import playback

    engine = ChatTTSEngine.load(tiny_bundle, threads=1, paced=paced)
    clock = _SimulatedClock()
    engine.clock = clock
    engine.gpt.session = _SlowSession(engine.gpt.session, clock, 0.9 * 21.333 - 1.2)
    engine.vocoder = _SlowVocoder(engine, clock, 0.5)
    cfg = SynthesisConfig(seed=2, extra={"max_new_token": 300, "min_new_token": 300})
    arrivals = [(clock(), c.frames / 24000) for c in engine.synthesize("Good morning.", cfg)]
    assert sum(s for _, s in arrivals) == pytest.approx((2 * 300 - 1) * 256 / 24000)
    assert 0.85 < clock.t / ((2 * 300 - 1) * 256 / 24000) <= 0.95
    stall = playback(arrivals)["stall_s"]
    assert stall == 0.0 if paced else stall > 0.1, stall


def test_bench_batch_bounds_throughput_by_the_step_alone(batched: ChatTTSEngine) -> None:
    """``bench batch``'s "step only" column: the rows' audio per second if the GPT step were
    the only cost. The measured throughput pays renders and sampling too, so it is below."""
    from speakd_tools.bench.engine.batch import throughput

    cell, pcm = throughput(batched, rows=2, steps=12)
    assert pcm and cell["audio_s"] == pytest.approx(2 * (2 * 12 - 1) * 256 / 24000)
    assert cell["step_only_audio_s_per_s"] == pytest.approx(
        2 * 512 / 24000 / (cell["ms_per_step"] / 1e3)
    )
    assert cell["audio_s_per_s"] < cell["step_only_audio_s_per_s"]
