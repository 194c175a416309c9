"""``bench chattts`` phase 1, the GPT decode step, and the bandwidth floor it is read against.

``run_steps`` runs in one child process holding every contender's GPT (``OrtStep`` for speakd's
bundles, ``TorchStep`` for ChatTTS's torch modules) and times their steps interleaved;
``step_bytes``, ``floors`` and ``projection`` turn the bytes one step reads into its floor on this
machine and on the boards. ``speakd_tools.bench.engine.chattts`` runs the phases and reports.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path
from typing import Any

from ..harness.stats import loadavg, percentile

# --- board projection ------------------------------------------------------------------------

STEP_MS_AUDIO = 512 / 24  # one GPT step = 512 samples at 24 kHz = 21.33 ms of audio
BOARDS = {  # effective DRAM read bandwidth, GB/s (published memcpy figures of the boards)
    "Raspberry Pi 5": (9.0, 10.5),
    "RK3588": (12.4, 12.4),
}
NOT_STREAMED = ("cos_cache", "sin_cache")  # RoPE tables: GQA reads one row per step


def step_bytes(bundle: Path, contexts: tuple[int, ...]) -> dict[str, Any]:
    """Bytes one decode step must read: every GPT weight once + the KV cache up to ``ctx``."""
    import onnx

    manifest = json.loads((bundle / "manifest.json").read_text())
    model = manifest["model"]
    graph = onnx.load(str(bundle / "gpt.onnx")).graph
    weights = sum(
        len(t.raw_data) or onnx.numpy_helper.to_array(t).nbytes
        for t in graph.initializer
        if t.name not in NOT_STREAMED
    )
    kv_item = 1 if model.get("kv_dtype") == "int8" else 4
    per_pos = 2 * model["num_layers"] * model["num_heads"] * model["head_dim"] * kv_item
    return {
        "weights": weights,
        "kv_dtype": model.get("kv_dtype", "float32"),
        "kv": {str(c): per_pos * c for c in contexts},
    }


def floors(result: dict[str, Any]) -> dict[str, dict[str, dict[str, float]]]:
    """Per contender: ``step_ms`` (the interleaved GPT step's median) and ``floor_ms`` (bytes one
    step reads ÷ the measured read bandwidth), each by context; empty when either is missing."""
    gbps = result.get("machine", {}).get("read_gbps")
    per_step = result.get("bytes_per_step") or {}
    out: dict[str, dict[str, dict[str, float]]] = {}
    for name, steps in (result.get("steps") or {}).items():
        if name not in result.get("contenders", {}):
            continue  # the phase's load averages and load times
        b = per_step.get("fp32" if name == "torch" else name)
        out[name] = {
            "step_ms": {ctx: cell["median_ms"] for ctx, cell in steps.items()},
            "floor_ms": {
                ctx: round((b["weights"] + kv) / (gbps * 1e9) * 1e3, 3)
                for ctx, kv in (b["kv"] if b and gbps else {}).items()
            },
        }
    return out


def projection(bytes_per_step: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Bandwidth floor per board: ms/step = bytes / bandwidth; GPT-only RTF = ms / 21.33."""
    out: dict[str, Any] = {}
    for name, b in bytes_per_step.items():
        for ctx, kv in b["kv"].items():
            total = b["weights"] + kv
            row: dict[str, Any] = {"mb_per_step": round(total / 1e6, 1)}
            for board, (lo, hi) in BOARDS.items():
                slow, fast = total / (lo * 1e9) * 1e3, total / (hi * 1e9) * 1e3
                row[board] = {
                    "ms_per_step": [round(fast, 1), round(slow, 1)],
                    "gpt_rtf": [round(fast / STEP_MS_AUDIO, 2), round(slow / STEP_MS_AUDIO, 2)],
                }
            out.setdefault(name, {})[ctx] = row
    return out


# --- phase 1: GPT step, interleaved -------------------------------------------------------------


class OrtStep:
    """The engine's decode step (``GptRunner.step``) at a fixed context."""

    def __init__(self, bundle: Path, threads: int, prefix: int, seed: int) -> None:
        import numpy as np

        from speakd.engines.bundle import load_bundle
        from speakd.engines.chattts.gpt_runner import GptRunner, ModelSpec
        from speakd.engines.ortsession import make_session

        b = load_bundle(bundle, verify=False)
        spec = ModelSpec.from_manifest(b.manifest["model"])
        emb_code = np.load(b.file("emb_code.npy"))
        self.runner = GptRunner(make_session(b.file("gpt.onnx"), threads), spec, emb_code)
        rng = np.random.default_rng(seed)
        self.codes = rng.integers(0, spec.num_audio_tokens - 1, (64, spec.num_vq))
        embeds = emb_code[np.arange(spec.num_vq), rng.integers(0, 625, (prefix, spec.num_vq))]
        self.runner.prompt(embeds.sum(axis=1)[None].astype(np.float32))  # fills slots 0..prefix-1
        self.i = 0

    def __call__(self, ctx: int) -> None:
        self.runner.position = ctx
        self.runner.step(self.codes[self.i % len(self.codes)])
        self.i += 1


class TorchStep:
    """One ``GPT.generate`` code step of ChatTTS's own modules, at a fixed context."""

    def __init__(self, checkpoint: Path, threads: int, contexts: list[int], seed: int) -> None:
        import torch
        from torch.nn.utils import parametrize
        from transformers import DynamicCache

        from speakd_tools.chattts.modules import load_modules

        torch.set_num_threads(threads)
        self.torch, self.parametrize = torch, parametrize
        self.mods = load_modules(checkpoint)
        self.gpt = self.mods.gpt
        g = torch.Generator().manual_seed(seed)
        q = self.mods.sizes.num_vq
        self.codes = torch.randint(0, 625, (64, 1, 1, q), generator=g)
        self.caches: dict[int, Any] = {}
        with torch.inference_mode():
            for ctx in contexts:
                ids = torch.randint(0, 625, (1, ctx, q), generator=g)
                emb = torch.stack([self.gpt.emb_code[i](ids[:, :, i]) for i in range(q)], 3).sum(3)
                cache = DynamicCache()
                self.gpt.gpt(inputs_embeds=emb, past_key_values=cache, use_cache=True)
                self.caches[ctx] = cache
        self.i = 0

    def __call__(self, ctx: int) -> None:
        torch, gpt, q = self.torch, self.gpt, self.mods.sizes.num_vq
        cache = self.caches[ctx]
        ids = self.codes[self.i % len(self.codes)]
        self.i += 1
        with torch.inference_mode():
            extra = cache.get_seq_length() - ctx
            if extra:  # drop the previous timed step's token (transformers 5: crop(-n))
                cache.crop(-extra)
            emb = torch.stack([gpt.emb_code[i](ids[:, :, i]) for i in range(q)], 3).sum(3)
            out = gpt.gpt(
                inputs_embeds=emb,
                attention_mask=torch.ones(1, ctx + 1, dtype=torch.long),
                position_ids=torch.tensor([[ctx]]),
                cache_position=torch.tensor([ctx]),
                past_key_values=cache,
                use_cache=True,
            )
            h = out.last_hidden_state.float()
            with self.parametrize.cached():
                logits = torch.empty(1, 1, 626, q)
                for i in range(q):
                    logits[..., i] = gpt.head_code[i](h)


def run_steps(spec: dict[str, Any]) -> dict[str, Any]:
    """Phase 1 in this process: every present contender loaded, interleaved rounds."""
    contexts: list[int] = spec["contexts"]
    rounds, steps, warm = spec["rounds"], spec["steps_per_round"], spec["warmup"]
    timers: dict[str, Any] = {}
    load_s: dict[str, float] = {}
    for c in spec["contenders"]:
        t0 = time.perf_counter()
        if c["name"] == "torch":
            timers["torch"] = TorchStep(Path(c["path"]), spec["threads"], contexts, spec["seed"])
        else:
            timers[c["name"]] = OrtStep(
                Path(c["path"]), spec["threads"], max(contexts), spec["seed"]
            )
        load_s[c["name"]] = round(time.perf_counter() - t0, 2)
    names = list(timers)
    times: dict[str, dict[int, list[list[float]]]] = {n: {x: [] for x in contexts} for n in names}
    la0 = loadavg()
    for r in range(rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for ctx in contexts:
            for n in order:
                step = timers[n]
                for _ in range(warm):
                    step(ctx)
                got = []
                for _ in range(steps):
                    t0 = time.perf_counter()
                    step(ctx)
                    got.append((time.perf_counter() - t0) * 1e3)
                times[n][ctx].append(got)
    out: dict[str, Any] = {"loadavg_before": la0, "loadavg_after": loadavg(), "load_s": load_s}
    for n in names:
        out[n] = {}
        for ctx in contexts:
            flat = [t for rnd in times[n][ctx] for t in rnd]
            out[n][str(ctx)] = {
                "median_ms": round(statistics.median(flat), 3),
                "best_round_ms": round(min(statistics.median(rnd) for rnd in times[n][ctx]), 3),
                "p90_ms": round(percentile(flat, 90), 3),
                "n": len(flat),
            }
    return out
