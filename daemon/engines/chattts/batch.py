"""B decode rows on one ``gpt.onnx`` session: the batched twin of ``GptRunner``.

A CPU decode step is bound by reading the weights, so advancing B rows costs little more than one.
Every layer's KV is one buffer ``[B, H, ctx, D]`` allocated once; row b owns slot b (its view
``kv[b:b+1]``). Per row: its own position (``seqlens_k[b]``, GroupQueryAttention rotates and
writes each row at its own position), seeded ``CodeSampler``, repetition window (its own history),
``max_new_token`` and EOS.

- Prompt pass: a B = 1 run on the new row's slot view, so rows mid-decode are untouched. It is
  either the whole prompt (``prefill_chunk = 0``, bit-identical to ``GptRunner``'s prompt pass) or
  fixed chunks of ``prefill_chunk`` tokens (chunk boundaries depend on the prompt only, so the
  result does not depend on what else is decoding), one chunk per scheduler iteration. Whole
  prompts of rows in adjacent slots (nothing mid-decode between them) share one run, right-padded
  to the longest, when the graph gives each row exactly its own B = 1 result
  (``prompts_batch_exact``: float graphs do; 4-bit graphs with an int8 KV cache round a
  multi-row prompt differently): rows admitted together then step, and render, in step.
- Decode step: one run over the contiguous slots ``[lo, hi)`` from the lowest to the highest
  stepping slot (``window``; one binding per window, built on first use); other slots are not
  touched. A slot in the window that is not stepping (free or mid-prompt; the scheduler never pauses
  a row inside the window it steps) computes a throw-away row that writes only at the position its
  own next pass overwrites. Rows of a batched step are computed independently (per-row GEMM rows and
  attention), so a row's codes and hiddens are the same whatever shares the batch
  (tests/test_chattts_batch.py checks it against ``GptRunner``).
  That holds for fp32/fp16 graphs and, from two rows up, for 4-bit ``MatMulNBits`` graphs (they
  quantize activations per row, but a lone row takes the M = 1 kernel, whose float rounding
  differs: such graphs always step at least ``min_rows = 2`` slots). It does not hold for graphs
  that quantize activations across the batch (``DynamicQuantizeLinear``: one scale for all rows);
  ``batch_invariant()`` measures which case the loaded graph is.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import onnxruntime as ort

from speakd.engines.chattts.gpt_runner import DecodeStats, GptRunner, ModelSpec
from speakd.engines.chattts.sampling import CodeSampler, SamplingParams, sample_rows
from speakd.machine.memory import release_pages


def sentence_sampler(params: SamplingParams, eos: int, seed: int, index: int) -> CodeSampler:
    """Sentence ``index`` of a request draws from its own stream: PCG64(seed) jumped ``index``
    times (sentence 0 = ``CodeSampler(seed)``), so it does not depend on how many draws the
    sentences before it made, nor on the order rows decode in."""
    sampler = CodeSampler(params, eos, seed)
    if index:
        sampler.rng = np.random.Generator(np.random.PCG64(seed).jumped(index))
    return sampler


@dataclass(eq=False)
class Row:
    """One sentence being decoded. ``on_step(codes, hidden)`` gets views: copy what you keep."""

    embeds: np.ndarray  # (S, hidden) prompt embeddings
    sampler: CodeSampler
    on_step: Callable[[np.ndarray, np.ndarray], None]
    cancel: Callable[[], bool] = lambda: False
    stats: DecodeStats = field(default_factory=DecodeStats)
    slot: int = -1
    prefilled: int = 0  # prompt tokens already in the KV
    position: int = 0  # next KV position
    step: int = 0  # codes generated (= steps kept)
    max_new: int = 0
    history: np.ndarray = field(default_factory=lambda: np.zeros((0, 4), np.int64))
    logits: np.ndarray | None = None  # fresh logits to sample from
    hidden: np.ndarray | None = None  # the hidden that produced them
    codes: np.ndarray | None = None  # codes to feed at the next step
    done: bool = False

    @property
    def prompt_len(self) -> int:
        return len(self.embeds)


class BatchDecoder:
    """KV slots, prompt passes and batched steps; the scheduler decides who runs when."""

    def __init__(
        self,
        session: ort.InferenceSession,
        spec: ModelSpec,
        emb_code: np.ndarray,
        batch_size: int,
        prefill_chunk: int = 0,
        row_context: int | None = None,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be ≥ 1, got {batch_size}")
        self.session = session
        self.spec = spec
        self.batch_size = batch_size
        self.prefill_chunk = prefill_chunk
        self.row_context = min(row_context or spec.max_context, spec.max_context)
        self.emb_code = np.ascontiguousarray(emb_code, np.float32)
        b, h, qv = batch_size, spec.hidden_size, spec.num_vq * spec.num_audio_tokens
        shape = (b, spec.num_heads, self.row_context, spec.head_dim)
        # Allocated once for the engine's life; pages are touched only as rows use positions
        # and given back when a row leaves its slot (release()).
        self.kv = [np.zeros(shape, np.dtype(spec.kv_dtype)) for _ in range(2 * spec.num_layers)]
        self._slot_kv = [
            [ort.OrtValue.ortvalue_from_numpy(a[s : s + 1]) for a in self.kv] for s in range(b)
        ]
        self.embeds = np.zeros((b, 1, h), np.float32)
        self.seqlens = np.zeros((b,), np.int32)
        self.total = np.zeros((), np.int32)
        self.hidden = np.zeros((b, 1, h), np.float32)
        self.logits = np.zeros((b, 1, qv), np.float32)
        self._windows: dict[tuple[int, int], tuple[ort.IOBinding, list[ort.OrtValue]]] = {}
        self._scratch = np.empty((spec.num_vq, spec.num_audio_tokens), np.float32)
        self.rows: list[Row | None] = [None] * b
        self.min_rows = 1  # slots every decode step runs over (batch_invariant() may raise it)
        self.prompts_batched = False  # set from prompts_batch_exact()

    def _bind(
        self,
        arrays: tuple[np.ndarray, ...],
        kv: list[ort.OrtValue],
    ) -> tuple[ort.IOBinding, list[ort.OrtValue]]:
        """Binding over numpy-backed OrtValues (embeds, hidden, logits, seqlens, total) + KV."""
        binding = self.session.io_binding()
        keep = [ort.OrtValue.ortvalue_from_numpy(a) for a in arrays]
        names = ("inputs_embeds", "hidden", "logits", "seqlens_k", "total_sequence_length")
        for name, value in zip(names, keep, strict=True):
            if name in ("hidden", "logits"):
                binding.bind_ortvalue_output(name, value)
            else:
                binding.bind_ortvalue_input(name, value)
        for i in range(self.spec.num_layers):
            for j, kind in enumerate(("key", "value")):
                binding.bind_ortvalue_input(f"past_{kind}_{i}", kv[2 * i + j])
                binding.bind_ortvalue_output(f"present_{kind}_{i}", kv[2 * i + j])  # in place
        return binding, keep + kv

    def window(self, slots: list[int]) -> tuple[int, int]:
        """The slots ``[lo, hi)`` a step over ``slots`` runs on: contiguous, ≥ ``min_rows``."""
        lo, hi = min(slots), max(slots) + 1
        if hi - lo < self.min_rows:
            hi = min(self.batch_size, lo + self.min_rows)
            lo = max(0, hi - self.min_rows)
        return lo, hi

    def _window_binding(self, lo: int, hi: int) -> ort.IOBinding:
        if (lo, hi) not in self._windows:
            kv = [ort.OrtValue.ortvalue_from_numpy(a[lo:hi]) for a in self.kv]
            arrays = (
                self.embeds[lo:hi],
                self.hidden[lo:hi],
                self.logits[lo:hi],
                self.seqlens[lo:hi],
                self.total,
            )
            self._windows[lo, hi] = self._bind(arrays, kv)
        return self._windows[lo, hi][0]

    def batch_invariant(self) -> bool:
        """Is a row's step output bit-identical whatever the other rows hold? Probes steps on the
        free slots (call before admitting anything; they are left free). A graph that is exact
        from two rows up only (M-dependent kernels) gets ``min_rows = 2``."""
        if self.batch_size < 2 or any(r is not None for r in self.rows):
            return True
        rng = np.random.default_rng(0)
        q, v = self.spec.num_vq, self.spec.num_audio_tokens
        probe = [self.emb_code[np.arange(q), rng.integers(0, v, q)].sum(0) for _ in range(3)]
        n_max = min(3, self.batch_size)
        self.seqlens[:n_max] = 0
        self.total[...] = 1

        def row0(n: int, company: float) -> np.ndarray:
            self.embeds[:n_max, 0] = probe[:n_max]
            self.embeds[1:n_max, 0] *= company
            self.session.run_with_iobinding(self._window_binding(0, n))
            return self.logits[0, 0].copy()

        reference = row0(2, 8.0)
        others = [row0(2, -3.0), row0(n_max, 0.5)]
        if not all(np.array_equal(reference, o) for o in others):
            return False
        if not np.array_equal(row0(1, 1.0), reference):
            self.min_rows = 2
        return True

    def prompts_batch_exact(self) -> bool:
        """Does a row's whole prompt give bit-identical hidden and logits in a padded multi-row
        pass and alone? Probes the free slots 0..1 (call before admitting anything)."""
        if self.batch_size < 2 or self.prefill_chunk or any(r is not None for r in self.rows):
            return False
        rng = np.random.default_rng(1)
        h = self.spec.hidden_size
        rows = [
            Row(rng.normal(0, 0.5, (n, h)).astype(np.float32), None, lambda c, x: None)  # type: ignore[arg-type]
            for n in (5, 8)
        ]
        alone = []
        for slot, row in enumerate(rows):
            row.slot = slot
            self.prefill(row)
            alone.append((row.hidden.copy(), row.logits.copy()))  # type: ignore[union-attr]
        self._prefill_window(rows, 0, 2)
        return all(
            np.array_equal(a[0], r.hidden) and np.array_equal(a[1], r.logits)
            for a, r in zip(alone, rows, strict=True)
        )

    # --- slots -------------------------------------------------------------------------------

    def free_slots(self) -> int:
        return sum(r is None for r in self.rows)

    def admit(self, row: Row) -> None:
        """Give ``row`` the lowest free slot (keeps the step's prefix short)."""
        if row.prompt_len >= self.row_context:
            raise ValueError(
                f"prompt of {row.prompt_len} tokens does not fit the {self.row_context} KV"
            )
        slot = self.rows.index(None)
        self.rows[slot] = row
        row.slot, row.prefilled, row.position, row.step = slot, 0, 0, 0
        params = row.sampler.params
        row.max_new = min(params.max_new_token, self.row_context - row.prompt_len)
        row.history = np.zeros((row.max_new, self.spec.num_vq), np.int64)
        row.stats.prompt_tokens = row.prompt_len
        row.stats.stop = "max_new_token" if row.max_new == params.max_new_token else "context"

    def release(self, row: Row) -> None:
        if 0 <= row.slot < self.batch_size and self.rows[row.slot] is row:
            self.rows[row.slot] = None
            for a in self.kv:
                release_pages(a[row.slot].ctypes.data, a[row.slot].nbytes)
        row.done, row.logits, row.hidden, row.codes = True, None, None, None

    # --- forward passes ----------------------------------------------------------------------

    def prefill(self, row: Row) -> bool:
        """Run the next prompt chunk of ``row`` into its slot; True once the prompt is all in."""
        t0 = time.perf_counter()
        p, s_all = row.prefilled, row.prompt_len
        s = s_all - p if self.prefill_chunk <= 0 else min(self.prefill_chunk, s_all - p)
        embeds = np.ascontiguousarray(row.embeds[None, p : p + s], np.float32)
        hidden = np.zeros((1, s, self.spec.hidden_size), np.float32)
        logits = np.zeros((1, s, self.logits.shape[-1]), np.float32)
        seqlens = np.array([p + s - 1], np.int32)
        total = np.array(p + s, np.int32)
        binding, _keep = self._bind(
            (embeds, hidden, logits, seqlens, total), self._slot_kv[row.slot]
        )
        self.session.run_with_iobinding(binding)
        row.prefilled = row.position = p + s
        row.stats.prompt_ms += (time.perf_counter() - t0) * 1e3
        if row.prefilled < s_all:
            return False
        row.hidden, row.logits = hidden[0, -1], logits[0, -1]
        return True

    def prefill_together(self, rows: list[Row]) -> list[Row]:
        """Whole-prompt passes: of ``rows`` (each before its prompt), the longest run of adjacent
        slots starting at the first row's, nothing mid-decode between, in one padded pass when
        ``prompts_batched``, else the first row alone. Returns the rows prefilled."""
        first = rows[0]
        if not self.prompts_batched or self.prefill_chunk:
            self.prefill(first)
            return [first]
        waiting = {r.slot: r for r in rows if r.prefilled == 0}
        hi = first.slot + 1
        while hi < self.batch_size and (hi in waiting or self.rows[hi] is None):
            hi += 1
        while self.rows[hi - 1] is None:  # end on a row, not a free slot
            hi -= 1
        group = [waiting[s] for s in range(first.slot, hi) if s in waiting]
        if len(group) == 1:
            self.prefill(first)
        else:
            self._prefill_window(group, first.slot, hi)
        return group

    def _prefill_window(self, rows: list[Row], lo: int, hi: int) -> None:
        """One pass over slots ``[lo, hi)``: each row's whole prompt, right-padded; free slots
        in the window compute a throw-away one-token prompt."""
        t0 = time.perf_counter()
        s_max, h, qv = max(r.prompt_len for r in rows), self.spec.hidden_size, self.logits.shape[-1]
        embeds = np.zeros((hi - lo, s_max, h), np.float32)
        seqlens = np.zeros((hi - lo,), np.int32)
        for r in rows:
            embeds[r.slot - lo, : r.prompt_len] = r.embeds
            seqlens[r.slot - lo] = r.prompt_len - 1
        hidden = np.zeros((hi - lo, s_max, h), np.float32)
        logits = np.zeros((hi - lo, s_max, qv), np.float32)
        kv = [ort.OrtValue.ortvalue_from_numpy(a[lo:hi]) for a in self.kv]
        binding, _keep = self._bind(
            (embeds, hidden, logits, seqlens, np.array(s_max, np.int32)), kv
        )
        self.session.run_with_iobinding(binding)
        ms = (time.perf_counter() - t0) * 1e3
        for r in rows:
            i, n = r.slot - lo, r.prompt_len
            r.prefilled = r.position = n
            r.hidden, r.logits = hidden[i, n - 1], logits[i, n - 1]
            r.stats.prompt_ms += ms

    def step(self, rows: list[Row]) -> tuple[int, int]:
        """One batched decode step for ``rows`` (each has ``codes`` to feed); returns the slot
        window it ran over."""
        if not rows:
            return 0, 0
        t0 = time.perf_counter()
        lo, hi = self.window([r.slot for r in rows])
        e, out = self.emb_code, self.embeds[:, 0]
        out[lo:hi] = 0.0
        for s in range(lo, hi):  # idle/prefilling slots write where their next prompt pass will
            r = self.rows[s]
            self.seqlens[s] = 0 if r is None else r.position
        for r in rows:
            assert r.codes is not None
            c = r.codes
            np.add(e[0, c[0]], e[1, c[1]], out=out[r.slot])
            for q in range(2, self.spec.num_vq):
                np.add(out[r.slot], e[q, c[q]], out=out[r.slot])
        self.total[...] = int(self.seqlens[lo:hi].max()) + 1
        self.session.run_with_iobinding(self._window_binding(lo, hi))
        ms = (time.perf_counter() - t0) * 1e3
        for r in rows:
            r.position += 1
            r.codes = None
            r.hidden, r.logits = self.hidden[r.slot, 0], self.logits[r.slot, 0]
            r.stats.decode_ms += ms
        return lo, hi

    def sample(self, rows: list[Row]) -> list[bool]:
        """Draw each row's codes from its fresh logits (``GptRunner.generate``'s rules); per row,
        False when it has ended (``row.stats.stop`` says why). Rows past their first step that
        share sampling parameters draw in one vectorised pass (``sample_rows``: the same codes
        as one by one)."""
        q, v = self.spec.num_vq, self.spec.num_audio_tokens
        drawn: dict[int, np.ndarray] = {}
        groups: dict[SamplingParams, list[Row]] = {}
        for row in rows:
            if row.cancel():
                row.stats.stop = "cancelled"
            elif row.step and not row.sampler.params.is_greedy:
                groups.setdefault(row.sampler.params, []).append(row)
            else:  # greedy, or the first step with its empty-draw retries: one by one
                assert row.logits is not None
                drawn[id(row)] = GptRunner._draw(
                    self._scratch, row.logits, row.history[: row.step], row.step, row.sampler
                )
        for group in groups.values():
            logits = np.stack([r.logits.reshape(q, v) for r in group])  # type: ignore[union-attr]
            codes = sample_rows(
                [r.sampler for r in group],
                logits,
                [r.history[: r.step] for r in group],
                [r.step for r in group],
            )
            drawn.update((id(r), c) for r, c in zip(group, codes, strict=True))
        return [self._advance(row, drawn[id(row)]) if id(row) in drawn else False for row in rows]

    def _advance(self, row: Row, codes: np.ndarray) -> bool:
        i = row.step
        assert row.hidden is not None
        row.logits = None
        if (codes == self.spec.eos_token).any():
            row.stats.stop = "eos" if i else "empty"
            return False
        row.history[i] = codes
        row.step = row.stats.steps = i + 1
        row.on_step(codes, row.hidden)
        if row.step >= row.max_new:
            return False  # stop already says max_new_token / context
        row.codes = codes
        return True
