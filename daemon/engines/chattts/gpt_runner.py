"""The GPT decode loop on one ``gpt.onnx`` session with an in-place KV cache (docs/chattts.md).

Each layer's ``past_*`` and ``present_*`` are bound to the *same* preallocated fixed-capacity
buffer, so GroupQueryAttention writes the new keys/values in place and nothing is concatenated or
copied per step. The small per-step inputs (the summed code embedding, ``seqlens_k``,
``total_sequence_length``) and the outputs (``hidden``, ``logits``) are numpy arrays that back
their OrtValues (on CPU ``ortvalue_from_numpy`` shares memory), so a step writes 3 small arrays in
place and reads 2 views: no binding and no allocation besides the 4 sampled codes. The prompt goes
through the same graph and the same KV buffers (S = prompt length). "Resetting" the cache for the
next sentence is just starting again at position 0: GQA only reads ``seqlens_k + 1`` slots.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnxruntime as ort

from speakd.engines.chattts.sampling import CodeSampler
from speakd.engines.spans import span

log = logging.getLogger(__name__)

EMPTY_RETRIES = 8  # ChatTTS ensure_non_empty: EOS at step 0 → draw again (it regenerates)


@dataclass(frozen=True)
class ModelSpec:
    """The manifest's ``model`` section (docs/bundle-format.md)."""

    num_layers: int
    num_heads: int
    head_dim: int
    hidden_size: int
    num_vq: int
    num_audio_tokens: int
    eos_token: int
    max_context: int
    kv_dtype: str
    token_ids: dict[str, int]

    @classmethod
    def from_manifest(cls, model: dict[str, Any]) -> ModelSpec:
        names = [f for f in cls.__dataclass_fields__ if f != "kv_dtype"]
        missing = [f for f in names if f not in model]
        if missing:
            raise KeyError(f"manifest.json model: missing {', '.join(missing)}")
        return cls(kv_dtype=model.get("kv_dtype", "float32"), **{f: model[f] for f in names})


@dataclass
class DecodeStats:
    prompt_tokens: int = 0
    prompt_ms: float = 0.0
    steps: int = 0
    decode_ms: float = 0.0
    stop: str = ""  # "eos" | "max_new_token" | "context" | "cancelled" | "empty"

    @property
    def ms_per_step(self) -> float:
        return self.decode_ms / self.steps if self.steps else 0.0


class GptRunner:
    """Owns the KV buffers and bindings of one session; one utterance at a time."""

    def __init__(self, session: ort.InferenceSession, spec: ModelSpec, emb_code: np.ndarray):
        self.session = session
        self.spec = spec
        self.emb_code = np.ascontiguousarray(emb_code, np.float32)  # (Q, V, hidden)
        kv_dtype = np.dtype(spec.kv_dtype)
        shape = (1, spec.num_heads, spec.max_context, spec.head_dim)
        self._kv = [np.zeros(shape, kv_dtype) for _ in range(2 * spec.num_layers)]
        self._kv_ort = [ort.OrtValue.ortvalue_from_numpy(a) for a in self._kv]
        h, qv = spec.hidden_size, spec.num_vq * spec.num_audio_tokens
        self.step_embeds = np.zeros((1, 1, h), np.float32)
        self.seqlens = np.zeros((1,), np.int32)
        self.total = np.zeros((), np.int32)
        self.hidden = np.zeros((1, 1, h), np.float32)
        self.logits = np.zeros((1, 1, qv), np.float32)
        self._step_binding, self._step_values = self._bind(
            self.step_embeds, self.hidden, self.logits
        )
        self.position = 0

    def _bind(
        self, embeds: np.ndarray, hidden: np.ndarray, logits: np.ndarray
    ) -> tuple[ort.IOBinding, list[ort.OrtValue]]:
        """A binding over numpy-backed OrtValues; keep the returned values alive with it."""
        b = self.session.io_binding()
        keep = [ort.OrtValue.ortvalue_from_numpy(a) for a in (embeds, hidden, logits)]
        keep += [ort.OrtValue.ortvalue_from_numpy(a) for a in (self.seqlens, self.total)]
        b.bind_ortvalue_input("inputs_embeds", keep[0])
        b.bind_ortvalue_output("hidden", keep[1])
        b.bind_ortvalue_output("logits", keep[2])
        b.bind_ortvalue_input("seqlens_k", keep[3])
        b.bind_ortvalue_input("total_sequence_length", keep[4])
        for i in range(self.spec.num_layers):
            for j, kind in enumerate(("key", "value")):
                kv = self._kv_ort[2 * i + j]
                b.bind_ortvalue_input(f"past_{kind}_{i}", kv)
                b.bind_ortvalue_output(f"present_{kind}_{i}", kv)  # same buffer: in place
        return b, keep

    def prompt(self, embeds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Run the prompt (1, S, hidden) from position 0; return the last hidden and logits."""
        s = embeds.shape[1]
        if s >= self.spec.max_context:
            raise ValueError(f"prompt of {s} tokens does not fit the {self.spec.max_context} KV")
        hidden = np.zeros((1, s, self.spec.hidden_size), np.float32)
        logits = np.zeros((1, s, self.logits.shape[-1]), np.float32)
        binding, _values = self._bind(np.ascontiguousarray(embeds, np.float32), hidden, logits)
        self.seqlens[0] = s - 1
        self.total[...] = s
        self.session.run_with_iobinding(binding)
        self.position = s
        return hidden[0, -1], logits[0, -1]

    def step(self, codes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Feed the 4 codes of the previous step; return views of hidden (h,) and logits (Q·V,)."""
        e, out = self.emb_code, self.step_embeds[0, 0]
        np.add(e[0, codes[0]], e[1, codes[1]], out=out)
        for q in range(2, self.spec.num_vq):
            np.add(out, e[q, codes[q]], out=out)
        self.seqlens[0] = self.position
        self.total[...] = self.position + 1
        self.session.run_with_iobinding(self._step_binding)
        self.position += 1
        return self.hidden[0, 0], self.logits[0, 0]

    def generate(
        self,
        prompt_embeds: np.ndarray,
        sampler: CodeSampler,
        cancel: threading.Event | None = None,
        stats: DecodeStats | None = None,
    ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """ChatTTS ``GPT.generate`` (code pass, batch 1): yields (codes (Q,), hidden (h,)) per
        step; the step where any codebook draws EOS is dropped. The hidden is a view that the next
        step overwrites: copy it if you keep it."""
        spec, stats = self.spec, stats if stats is not None else DecodeStats()
        q, v, eos = spec.num_vq, spec.num_audio_tokens, spec.eos_token
        t0 = time.perf_counter()
        with span("gpt prompt"):
            hidden, logits = self.prompt(prompt_embeds)
        t1 = time.perf_counter()
        stats.prompt_tokens, stats.prompt_ms = prompt_embeds.shape[1], (t1 - t0) * 1e3
        max_new = min(sampler.params.max_new_token, spec.max_context - self.position)
        history = np.zeros((max_new, q), np.int64)
        scratch = np.empty((q, v), np.float32)
        stats.stop = "max_new_token" if max_new == sampler.params.max_new_token else "context"
        try:
            for i in range(max_new):
                if cancel is not None and cancel.is_set():
                    stats.stop = "cancelled"
                    return
                with span("sampling"):
                    codes = self._draw(scratch, logits, history[:i], i, sampler)
                if (codes == eos).any():
                    stats.stop = "eos" if i else "empty"
                    return
                history[i] = codes
                stats.steps = i + 1
                yield codes, hidden
                if i + 1 < max_new:
                    with span("gpt step"):
                        hidden, logits = self.step(codes)
        finally:
            stats.decode_ms = (time.perf_counter() - t1) * 1e3

    @staticmethod
    def _draw(
        scratch: np.ndarray, logits: np.ndarray, history: np.ndarray, i: int, sampler: CodeSampler
    ) -> np.ndarray:
        q, v = scratch.shape
        for _ in range(1 if i or sampler.params.is_greedy else EMPTY_RETRIES):
            np.copyto(scratch, logits.reshape(q, v))
            codes = sampler.sample(scratch, history, i)
            if not (codes == sampler.eos).any():
                break
        return codes
