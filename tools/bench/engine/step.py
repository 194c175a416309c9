"""The GPT decode step by rows and precision, beside its floor, its FLOPs and its kernel path.

    speakd-tools bench step --bundle FLOAT_BUNDLE [--variants fp32,int8,int8-rows,int4-b256,…]
        [--bundles NAME=BUNDLE …] [--rows 1,2,4,8] [--ctx 300] [--rounds 5] [--work DIR]

Each variant's ``gpt.onnx`` is made from the float bundle's (``--work`` keeps them between runs):
``fp32`` as exported; ``int8``: ``quantize_dynamic`` (``DynamicQuantizeMatMul``, one activation
scale over all rows); ``int8-rows``: int8 weights, a scale per activation row
(``speakd_tools.calibrate.rowquant``); ``int4-bN[-accA]``: ``MatMulNBits`` block N, accuracy
level A (default 4). ``--bundles`` adds finished bundles as they are (a calibrated int4 with its
int8 KV cache). Every graph runs in one process, interleaved rounds, each step one
``run_with_iobinding`` over rows ``[0, r)`` of a ``[8, 12, ctx_max, 64]`` KV at context ``--ctx``.

Per variant and rows: the median ms, the floor (weight bytes + r rows of KV up to ``ctx``, ÷ the
measured 2-thread read bandwidth), the FLOPs (2 per weight per row + attention's 4·ctx·hidden per
layer per row), and whether row 0's logits are bit-identical alone, beside other rows and at every
width (``exact``: yes at every width; ``≥2``: from two rows up; ``no``). The MLAS kernel each op
runs on this CPU comes from its flags (onnxruntime's ``platform.cpp`` dispatch order).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from ..harness.machine import describe, line
from ..harness.stats import loadavg

ROWS = (1, 2, 4, 8)


def kernel_paths(flags: dict[str, bool]) -> dict[str, str]:
    """Which MLAS kernel each precision's MatMuls take (onnxruntime 1.2x–1.32 ``platform.cpp``:
    later checks override earlier ones; AMX serves the U8S8 QGEMM only, never the 4-bit path)."""
    if flags.get("asimddp") or flags.get("i8mm"):
        dot = "i8mm (ummla)" if flags.get("i8mm") else "dotprod (udot)"
        return {"fp32": "NEON SGEMM", "int8": dot, "int4": f"QNBitGemm NEON {dot}"}
    q4 = q8 = "AVX2 (vpmaddubsw, int16 pairs saturate)"
    if flags.get("avx_vnni"):
        q4 = q8 = "AVX-VNNI (vpdpbusd ymm)"
    if flags.get("avx512_vnni"):
        q4 = q8 = "AVX-512 VNNI (vpdpbusd zmm)"
    if flags.get("amx_int8"):
        q8 = "AMX tiles (int8)"
    fp32 = "AVX-512F SGEMM" if flags.get("avx512f") else "AVX2 FMA SGEMM"
    return {"fp32": fp32, "int8": q8, "int4": f"SQNBitGemm CompInt8 {q4}"}


def _kind(path: Path) -> str:
    """The precision a gpt.onnx's weight MatMuls run at, from its op types."""
    import onnx

    ops = {n.op_type for n in onnx.load(str(path), load_external_data=False).graph.node}
    if "MatMulNBits" in ops:
        return "int4"
    return "int8" if ops & {"MatMulInteger", "DynamicQuantizeMatMul"} else "fp32"


def build(variant: str, src: Path, dst: Path) -> Path:
    """``dst`` (made once) holding ``variant`` of ``src`` (a float gpt.onnx)."""
    if dst.exists():
        return dst
    if variant == "fp32":
        return src
    import onnx

    if variant == "int8-rows":
        from speakd_tools.calibrate.rowquant import quantize_file

        quantize_file(src, dst)
    elif variant == "int8":
        from onnxruntime.quantization import QuantType, quantize_dynamic

        from speakd_tools.calibrate.quantizers import _with_types

        with tempfile.TemporaryDirectory(prefix="speakd-step-") as tmp:
            quantize_dynamic(
                _with_types(src, Path(tmp)),
                dst,
                op_types_to_quantize=["MatMul"],
                per_channel=True,
                weight_type=QuantType.QInt8,
                extra_options={
                    "DefaultTensorType": onnx.TensorProto.FLOAT,
                    "MatMulConstBOnly": True,
                },
            )
    elif variant.startswith("int4-b"):
        from onnxruntime.quantization.matmul_nbits_quantizer import (
            DefaultWeightOnlyQuantConfig,
            MatMulNBitsQuantizer,
        )

        block, _, acc = variant.removeprefix("int4-b").partition("-acc")
        block_size, level = int(block), int(acc or 4)
        cfg = DefaultWeightOnlyQuantConfig(
            block_size=block_size, is_symmetric=True, accuracy_level=level, bits=4
        )
        q = MatMulNBitsQuantizer(
            onnx.load(str(src)),
            bits=4,
            block_size=block_size,
            is_symmetric=True,
            accuracy_level=level,
            algo_config=cfg,
        )
        q.process()
        onnx.save(q.model.model, str(dst))
    else:
        raise ValueError(f"unknown variant {variant!r}")
    return dst


class Graph:
    """One gpt.onnx session with bindings over rows [0, r) of 8-row buffers at a fixed context."""

    def __init__(self, path: Path, model: dict[str, Any], threads: int, ctx: int) -> None:
        import onnxruntime as ort

        from speakd.engines.ortsession import make_session

        self.session = make_session(path, threads)
        kv_type = next(i.type for i in self.session.get_inputs() if i.name == "past_key_0")
        kv_dtype = np.int8 if "int8" in kv_type else np.float32
        b, h = max(ROWS), model["hidden_size"]
        shape = (b, model["num_heads"], ctx + 8, model["head_dim"])
        self.kv = [np.zeros(shape, kv_dtype) for _ in range(2 * model["num_layers"])]
        self.embeds = np.random.default_rng(0).normal(0, 1, (b, 1, h)).astype(np.float32)
        self.hidden = np.zeros((b, 1, h), np.float32)
        self.logits = np.zeros((b, 1, model["num_vq"] * model["num_audio_tokens"]), np.float32)
        self.seqlens = np.full((b,), ctx, np.int32)
        self.total = np.array(ctx + 1, np.int32)
        self.kv_item = np.dtype(kv_dtype).itemsize
        self._ort, self._bindings = ort, {}  # type: ignore[var-annotated]

    def _binding(self, rows: int) -> Any:
        if rows not in self._bindings:
            ort = self._ort
            b, keep = self.session.io_binding(), []
            arrays = {
                "inputs_embeds": self.embeds[:rows],
                "seqlens_k": self.seqlens[:rows],
                "total_sequence_length": self.total,
            }
            for name, a in arrays.items():
                keep.append(ort.OrtValue.ortvalue_from_numpy(a))
                b.bind_ortvalue_input(name, keep[-1])
            for name, a in (("hidden", self.hidden[:rows]), ("logits", self.logits[:rows])):
                keep.append(ort.OrtValue.ortvalue_from_numpy(a))
                b.bind_ortvalue_output(name, keep[-1])
            for i, a in enumerate(self.kv):
                keep.append(ort.OrtValue.ortvalue_from_numpy(a[:rows]))
                kind = ("key", "value")[i % 2]
                b.bind_ortvalue_input(f"past_{kind}_{i // 2}", keep[-1])
                b.bind_ortvalue_output(f"present_{kind}_{i // 2}", keep[-1])
            self._bindings[rows] = (b, keep)
        return self._bindings[rows][0]

    def step(self, rows: int) -> None:
        self.session.run_with_iobinding(self._binding(rows))

    def invariance(self) -> str:
        """Row 0's logits alone, at every width and beside different rows: ``exact``, ``≥2``
        (identical from two rows up, as ``BatchDecoder.min_rows = 2`` uses) or ``no``."""
        keep = self.embeds.copy()
        got = {}
        for rows in ROWS:
            self.step(rows)
            got[rows] = self.logits[0].copy()
        self.embeds[1:] *= -3.0
        self.step(max(ROWS))
        got[0] = self.logits[0].copy()
        self.embeds[...] = keep
        wide = [got[r] for r in (0, *ROWS[1:])]
        if not all(np.array_equal(wide[0], g) for g in wide):
            return "no"
        return "exact" if np.array_equal(got[1], got[2]) else "≥2"


def weight_bytes(path: Path) -> tuple[int, int]:
    """(bytes of the weights a step reads, their parameter count) of a gpt.onnx."""
    import onnx

    from .chattts_step import NOT_STREAMED

    graph = onnx.load(str(path), load_external_data=False).graph
    nbytes = params = 0
    for t in graph.initializer:
        if t.name in NOT_STREAMED or len(t.dims) < 1:
            continue
        nbytes += len(t.raw_data) or onnx.numpy_helper.to_array(t).nbytes
    for n in graph.node:  # parameters = what the MatMuls multiply (4-bit: N × K attributes)
        attrs = {a.name: a.i for a in n.attribute}
        if n.op_type == "MatMulNBits":
            params += attrs["N"] * attrs["K"]
    if not params:
        dims = {t.name: list(t.dims) for t in graph.initializer}
        mm = [n.input[1] for n in graph.node if n.op_type in ("MatMul", "MatMulInteger")]
        params = sum(int(np.prod(dims[w])) for w in mm if w in dims)
        params += sum(
            int(np.prod(dims[n.input[1]]))
            for n in graph.node
            if n.op_type == "DynamicQuantizeMatMul" and n.input[1] in dims
        )
    return nbytes, params


def renders(bundles: dict[str, Path], threads: int, rounds: int, window: int = 36) -> dict:
    """Decoder + Vocos ms for one ``window``-step window, and for 8 windows stacked in one run
    vs one run each (what ``Vocoder.batched`` chooses between), per bundle; interleaved rounds.
    ``invariant``: the graphs' own load-time probe (``Vocoder.batch_invariant``)."""
    from speakd.engines.chattts.vocoder import Vocoder
    from speakd.engines.ortsession import make_session

    vocoders = {
        n: Vocoder(
            make_session(b / "decoder.onnx", threads), make_session(b / "vocos.onnx", threads)
        )
        for n, b in bundles.items()
    }
    rng = np.random.default_rng(0)
    windows = [rng.normal(0, 1, (window, 768)).astype(np.float32) for _ in range(8)]
    cases = {"1 window": (windows[:1], False), "8 one by one": (windows, False)}
    cases["8 stacked"] = (windows, True)
    times: dict[str, dict[str, list[float]]] = {n: {c: [] for c in cases} for n in vocoders}
    for rnd in range(rounds):
        for n in list(vocoders)[rnd % len(vocoders) :] + list(vocoders)[: rnd % len(vocoders)]:
            for case, (ws, stacked) in cases.items():
                vocoders[n].batched = stacked
                vocoders[n].spectra_many(ws)  # warm
                t0 = time.perf_counter()
                vocoders[n].spectra_many(ws)
                times[n][case].append((time.perf_counter() - t0) * 1e3)
    return {
        n: {"invariant": v.batch_invariant(768)}
        | {c: round(statistics.median(times[n][c]), 2) for c in cases}
        for n, v in vocoders.items()
    }


def measure(args: argparse.Namespace) -> dict[str, Any]:
    import onnxruntime as ort

    manifest = json.loads((args.bundle / "manifest.json").read_text())
    model = manifest["model"]
    work = Path(args.work or tempfile.mkdtemp(prefix="speakd-step-"))
    work.mkdir(parents=True, exist_ok=True)
    paths: dict[str, Path] = {}
    conv_nets = {"fp32": args.bundle}
    build_s: dict[str, float] = {}
    for v in [v for v in args.variants.split(",") if v]:
        t0 = time.perf_counter()
        paths[v] = build(v, args.bundle / "gpt.onnx", work / f"gpt-{v}.onnx")
        build_s[v] = round(time.perf_counter() - t0, 1)
    for spec in args.bundles:
        name, _, path = spec.partition("=")
        paths[name] = Path(path) / "gpt.onnx"
        conv_nets[name] = Path(path)
    machine = describe(threads=args.threads)
    graphs = {n: Graph(p, model, args.threads, args.ctx) for n, p in paths.items()}
    invariance = {n: g.invariance() for n, g in graphs.items()}
    la0 = loadavg()
    times: dict[str, dict[int, list[float]]] = {n: {r: [] for r in ROWS} for n in graphs}
    names = list(graphs)
    for rnd in range(args.rounds):
        order = names[rnd % len(names) :] + names[: rnd % len(names)]
        for rows in ROWS:
            for n in order:
                for _ in range(args.warmup):
                    graphs[n].step(rows)
                for _ in range(args.steps):
                    t0 = time.perf_counter()
                    graphs[n].step(rows)
                    times[n][rows].append((time.perf_counter() - t0) * 1e3)
    gbps = machine["read_gbps"]
    per_pos = 2 * model["num_layers"] * model["num_heads"] * model["head_dim"]
    attn_flops = 4 * args.ctx * model["hidden_size"] * model["num_layers"]
    kernels = kernel_paths(machine["flags"])
    variants = {}
    for n, g in graphs.items():
        nbytes, params = weight_bytes(paths[n])
        cells = {}
        for rows in ROWS:
            floor_bytes = nbytes + rows * per_pos * args.ctx * g.kv_item
            cells[str(rows)] = {
                "median_ms": round(statistics.median(times[n][rows]), 3),
                "floor_ms": round(floor_bytes / (gbps * 1e9) * 1e3, 3),
                "gflop": round(rows * (2 * params + attn_flops) / 1e9, 2),
            }
        variants[n] = {
            "path": str(paths[n]),
            "weight_mb": round(nbytes / 1e6, 1),
            "params_m": round(params / 1e6, 1),
            "kv_dtype": "int8" if g.kv_item == 1 else "float32",
            "kernel": kernels[_kind(paths[n])],
            "batch_invariant": invariance[n],
            "build_s": build_s.get(n),
            "rows": cells,
        }
    return {
        "bundle": str(args.bundle),
        "onnxruntime": ort.__version__,
        "ctx": args.ctx,
        "threads": args.threads,
        "rounds": args.rounds,
        "steps_per_round": args.steps,
        "machine": machine,
        "loadavg_before": la0,
        "loadavg_after": loadavg(),
        "variants": variants,
        "renders": renders(conv_nets, args.threads, args.rounds),
    }


def table(result: dict[str, Any]) -> str:
    m = result["machine"]
    out = [
        line(m),
        f"onnxruntime {result['onnxruntime']}, {result['threads']} threads, ctx {result['ctx']},"
        f" {result['rounds']} rounds × {result['steps_per_round']} steps; load average"
        f" {result['loadavg_before']} → {result['loadavg_after']}",
        "",
        "| variant | kernel | KV | weights MB | invariant | "
        + " | ".join(f"{r} row{'s' if r > 1 else ''} ms (floor, GFLOP)" for r in ROWS)
        + " | 8 rows ÷ 1 row |",
        "|---|---|---|---:|---|" + "---:|" * (len(ROWS) + 1),
    ]
    for n, v in result["variants"].items():
        c = v["rows"]
        cells = " | ".join(
            f"{c[str(r)]['median_ms']:.2f} ({c[str(r)]['floor_ms']:.2f}, {c[str(r)]['gflop']:.1f})"
            for r in ROWS
        )
        ratio = c[str(max(ROWS))]["median_ms"] / c["1"]["median_ms"]
        out.append(
            f"| {n} | {v['kernel']} | {v['kv_dtype']} | {v['weight_mb']} |"
            f" {v['batch_invariant']} | {cells} | {ratio:.2f}× |"
        )
    out += [
        "",
        "Decoder + Vocos, 36-step windows (ms): | bundle | invariant | 1 window | 8 one by one |"
        " 8 stacked |",
    ]
    for n, r in result.get("renders", {}).items():
        out.append(
            f"| {n} | {r['invariant']} | {r['1 window']} | {r['8 one by one']} | {r['8 stacked']} |"
        )
    return "\n".join(out)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--bundle", type=Path, required=True, help="float bundle (its gpt.onnx)")
    p.add_argument(
        "--variants",
        default="fp32,int8,int8-rows,int4-b32,int4-b128,int4-b256",
        help="built from the float gpt.onnx (int4-bN[-accA])",
    )
    p.add_argument("--bundles", nargs="*", default=[], metavar="NAME=BUNDLE", help="as they are")
    p.add_argument("--ctx", type=int, default=300, help="context of every step (default 300)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=10, help="timed steps per round and cell")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--work", type=Path, help="folder for the built graphs (default: a temp dir)")
    p.add_argument("--json", action="store_true")
