"""Profiles behind docs/benchmarks.md "Where the time goes" (evidence, not a benchmark table).

speakd-tools bench profile nodes BUNDLE...          # node types after ORT's optimiser
speakd-tools bench profile ort BUNDLE [--ctx 500]   # ORT profiler: time per node type
speakd-tools bench profile loop BUNDLE [--steps 150]  # cProfile of the decode loop
speakd-tools bench profile threads BUNDLE           # threads × spinning, interleaved
speakd-tools bench profile machine BUNDLE           # ISA, DRAM read GB/s, MatMulNBits kernel,
                                                    # and this box's step floor
speakd-tools bench profile batch BUNDLE [--rows 1,8] [--steps 300]  # bench batch's iterations by
                                                    # part, the GPT step by op type and by scope
speakd-tools bench profile attention BUNDLE [--rows 1,8] [--ctx 300]  # the GPT's attention alone,
                                                    # by KV cache type (attention.py)
speakd-tools bench profile gemm [--rows 1,2,4,8,16,64]  # the weight GEMM kernels' GOPS by rows,
                                                    # weights in cache
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import json
import os
import pstats
import re
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
import onnxruntime as ort

from speakd.engines.ortsession import session_options

from ..harness.machine import ISA_FLAGS, cpu, describe, line, read_bandwidth
from ..harness.stats import median_s

TEXT = "Please remember to close the kitchen window before you leave."


def _runner(bundle: Path, opts: ort.SessionOptions, ctx: int) -> Any:
    from speakd.engines.bundle import load_bundle
    from speakd.engines.chattts.gpt_runner import GptRunner, ModelSpec

    b = load_bundle(bundle, verify=False)
    spec = ModelSpec.from_manifest(b.manifest["model"])
    sess = ort.InferenceSession(str(b.file("gpt.onnx")), opts, providers=["CPUExecutionProvider"])
    r = GptRunner(sess, spec, np.load(b.file("emb_code.npy")))
    r.prompt(np.random.default_rng(0).normal(0, 0.02, (1, ctx, spec.hidden_size)).astype("f4"))
    return r


def nodes(bundles: list[Path]) -> None:
    import onnx

    for bundle in bundles:
        path = bundle / "gpt.onnx"
        with tempfile.TemporaryDirectory() as tmp:
            o = session_options(2)
            o.optimized_model_filepath = str(Path(tmp) / "opt.onnx")
            o.add_session_config_entry(
                "session.optimized_model_external_initializers_file_name", "opt.onnx.data"
            )
            ort.InferenceSession(str(path), o, providers=["CPUExecutionProvider"])
            opt = onnx.load(o.optimized_model_filepath, load_external_data=False).graph.node
            src = onnx.load(str(path), load_external_data=False).graph.node
            for label, graph in (("file", src), ("optimised", opt)):
                c = collections.Counter(n.op_type for n in graph)
                print(f"{bundle} {label}: {sum(c.values())} nodes {dict(c.most_common())}")


def ort_profile(bundle: Path, ctx: int, steps: int) -> None:
    o = session_options(2)
    o.enable_profiling = True
    o.profile_file_prefix = str(Path(tempfile.gettempdir()) / "speakd-ortprof")
    r = _runner(bundle, o, ctx)
    for _ in range(steps):
        r.position = ctx
        r.step(np.array([1, 2, 3, 4]))
    path = r.session.end_profiling()
    events = json.loads(Path(path).read_text())
    os.remove(path)
    total: collections.Counter[str] = collections.Counter()
    count: collections.Counter[str] = collections.Counter()
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            total[e["args"]["op_name"]] += e["dur"]
            count[e["args"]["op_name"]] += 1
    all_us = sum(total.values())
    print(f"{bundle} ctx {ctx}, {steps} steps, load {os.getloadavg()[0]:.1f}")
    for op, us in total.most_common():
        print(f"  {op:34s} {100 * us / all_us:5.1f} %  {us / count[op]:8.1f} µs/node")


GEMMS = ("MatMulNBits", "MatMulInteger", "DynamicQuantizeMatMul", "MatMul")


def scope(node: str, op: str) -> str:
    """What a GPT node is for, from the names ``speakd_tools.chattts.gpt_graph`` (and the
    calibrators, which keep the MatMul's name as a prefix) give: the weight GEMMs by layer part
    (qkv, o, gate/up, down, logits), attention, the per-row activation quantization around an
    int8 GEMM (``rowquant``), and the rest (norms, activations, splits)."""
    if op == "GroupQueryAttention":
        return "attention (GQA)"
    part = re.search(r"MatMul/(qkv|o|gu|d|logits)_", node)
    if part and op in GEMMS:
        return f"GEMM {part.group(1)}"
    if part:
        return "row quantization (rowq)"
    return "norms, activations, splits"


def _step_runs(events: list[dict]) -> dict[int, list[list[dict]]]:
    """The profile's decode-step runs (one new token per row), by rows, each as its node
    events; prompt passes (more than one token) are left out."""
    runs = sorted((e for e in events if e.get("name") == "model_run"), key=lambda e: e["ts"])
    nodes = sorted(
        (e for e in events if e.get("cat") == "Node" and e["name"].endswith("_kernel_time")),
        key=lambda e: e["ts"],
    )
    out: dict[int, list[list[dict]]] = collections.defaultdict(list)
    i = 0
    for run in runs:
        mine = []
        while i < len(nodes) and nodes[i]["ts"] <= run["ts"] + run["dur"]:
            if nodes[i]["ts"] >= run["ts"]:
                mine.append(nodes[i])
            i += 1
        gqa = next((n for n in mine if n["args"]["op_name"] == "GroupQueryAttention"), None)
        if gqa is None:
            continue
        rows, tokens = next(iter(gqa["args"]["input_type_shape"][0].values()))[:2]
        if tokens == 1:
            out[rows].append([run, *mine])
    return out


def batch_profile(bundle: Path, rows: list[int], steps: int) -> None:
    """``bench batch``'s throughput at each of ``rows`` (forced ``steps``-step sentences, the
    daemon's exact batching) with the GPT session under ORT's profiler: each iteration's wall
    time by part, then the decode step's ORT run and kernels by op type and by scope (ms per
    step; the profiler's own cost is in these, not in ``bench batch``'s)."""
    from speakd.engines.chattts import engine as chattts_engine

    from .batch import throughput

    def profiled(path: Path, threads: int, spinning: bool = True) -> ort.InferenceSession:
        opts = session_options(threads, spinning)
        if Path(path).name == "gpt.onnx":
            opts.enable_profiling = True
            opts.profile_file_prefix = str(Path(tempfile.gettempdir()) / "speakd-batchprof")
        return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])

    with mock.patch.object(chattts_engine, "make_session", profiled):
        eng = chattts_engine.ChatTTSEngine.load(bundle, threads=2, batch_size=max(rows))
    throughput(eng, min(2, max(rows)), 8)  # first-run allocations out of the numbers
    cells = {r: throughput(eng, r, steps)[0] for r in rows}
    path = eng.gpt.session.end_profiling()
    events = json.loads(Path(path).read_text())
    os.remove(path)
    by_rows = _step_runs(events)
    print(f"{bundle} ({eng.precision}), {steps}-step sentences, load {os.getloadavg()[0]:.1f}")
    for r in rows:
        it = cells[r]["iteration_ms"]
        print(f"{r} row(s), ms per iteration: " + ", ".join(f"{k} {v:.2f}" for k, v in it.items()))
        runs = by_rows.get(max(r, eng.batch.decoder.min_rows), [])
        if not runs:
            continue
        n = len(runs)
        by_op: collections.Counter[str] = collections.Counter()
        by_scope: collections.Counter[str] = collections.Counter()
        for run in runs:
            for e in run[1:]:
                by_op[e["args"]["op_name"]] += e["dur"]
                by_scope[scope(e["name"], e["args"]["op_name"])] += e["dur"]
        run_ms = sum(run[0]["dur"] for run in runs) / n / 1e3
        kernel_ms = sum(by_op.values()) / n / 1e3
        print(f"  GPT step ({n} runs): ORT run {run_ms:.2f} ms, kernels {kernel_ms:.2f} ms")
        for label, counter in (("op", by_op), ("scope", by_scope)):
            for k, us in counter.most_common():
                ms = us / n / 1e3
                print(f"    {label} {k:34s} {ms:7.3f} ms  {100 * ms / run_ms:5.1f} %")


def loop(bundle: Path, steps: int) -> None:
    from speakd.engines.base import SynthesisConfig
    from speakd.engines.chattts.engine import ChatTTSEngine

    eng = ChatTTSEngine.load(bundle, threads=2)
    cfg = SynthesisConfig(seed=1, extra={"max_new_token": steps, "min_new_token": steps})
    text = eng.normalize_text(TEXT)
    eng.decode(text, cfg, seed=1)  # warm
    prof = cProfile.Profile()
    t0 = time.perf_counter()
    prof.enable()
    utt = eng.decode(text, cfg, seed=1)
    prof.disable()
    ms = (time.perf_counter() - t0) / len(utt.codes) * 1e3
    print(f"{len(utt.codes)} steps, {ms:.2f} ms/step incl. sampling, load {os.getloadavg()[0]:.1f}")
    pstats.Stats(prof).sort_stats("tottime").print_stats(12)


def threads(bundle: Path, rounds: int) -> None:
    variants = {
        f"{t} thread(s), spinning {'on' if s else 'off'}": (t, s)
        for t in (1, 2)
        for s in (True, False)
    }
    runners = {k: _runner(bundle, session_options(t, s), 120) for k, (t, s) in variants.items()}
    times: dict[str, list[float]] = {k: [] for k in runners}
    names = list(runners)
    for rnd in range(rounds):
        for k in names[rnd % 4 :] + names[: rnd % 4]:
            for i in range(8):
                runners[k].position = 100
                t0 = time.perf_counter()
                runners[k].step(np.array([1, 2, 3, 4]))
                if i >= 2:
                    times[k].append((time.perf_counter() - t0) * 1e3)
    print(f"{bundle} ctx 100, load {os.getloadavg()}")
    for k, v in times.items():
        print(f"  {k:28s} median {statistics.median(v):7.2f} ms  min {min(v):7.2f}")


def _matmul_nbits_model(k: int, n: int, count: int) -> bytes:
    """``count`` independent [m,k]x[k,n] MatMuls, quantized like the shipped GPT (4-bit b256
    symmetric, accuracy level 4)."""
    from onnx import TensorProto, helper, numpy_helper
    from onnxruntime.quantization.matmul_nbits_quantizer import (
        DefaultWeightOnlyQuantConfig,
        MatMulNBitsQuantizer,
    )

    rng = np.random.default_rng(0)
    weights = [
        numpy_helper.from_array(rng.normal(0, 0.02, (k, n)).astype(np.float32), f"w{i}")
        for i in range(count)
    ]
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", f"w{i}"], [f"y{i}"]) for i in range(count)],
        "matmuls",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["m", k])],
        [helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, ["m", n]) for i in range(count)],
        weights,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    config = DefaultWeightOnlyQuantConfig(
        block_size=256, is_symmetric=True, accuracy_level=4, bits=4
    )
    q = MatMulNBitsQuantizer(
        model, bits=4, block_size=256, is_symmetric=True, accuracy_level=4, algo_config=config
    )
    q.process()
    return q.model.model.SerializeToString()


def _matmul_int8_model(k: int, n: int) -> bytes:
    """One [m,k]x[k,n] ``MatMulInteger`` with uint8 activations (zero point 128) and int8 weights,
    as the per-row int8 graphs run it (``speakd_tools.calibrate.rowquant``)."""
    from onnx import TensorProto, helper, numpy_helper

    from ...calibrate.rowquant import weight_int8

    wq, _ = weight_int8(np.random.default_rng(0).normal(0, 0.02, (k, n)).astype(np.float32))
    graph = helper.make_graph(
        [helper.make_node("MatMulInteger", ["x", "w", "zp"], ["y"])],
        "matmul_int8",
        [helper.make_tensor_value_info("x", TensorProto.UINT8, ["m", k])],
        [helper.make_tensor_value_info("y", TensorProto.INT32, ["m", n])],
        [numpy_helper.from_array(wq, "w"), numpy_helper.from_array(np.array(128, np.uint8), "zp")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    return model.SerializeToString()


def _run_us(sess: ort.InferenceSession, x: np.ndarray, runs: int) -> float:
    """Median µs of ``sess`` run on ``x`` (its one input)."""
    feed = {sess.get_inputs()[0].name: x}
    return median_s(lambda: sess.run(None, feed), runs) * 1e6


def matmul_nbits_us(count: int, threads: int, k: int = 768, n: int = 6144, m: int = 1) -> float:
    """Median µs per 4-bit MatMulNBits at M = ``m`` (the GPT's gate/up shape): ``count`` = 1
    keeps its weights in cache, ``count`` = 40 streams them from DRAM as a decode step does."""
    sess = ort.InferenceSession(
        _matmul_nbits_model(k, n, count),
        session_options(threads),
        providers=["CPUExecutionProvider"],
    )
    x = np.random.default_rng(1).normal(size=(m, k)).astype(np.float32)
    return _run_us(sess, x, 40 if count == 1 else 15) / count


def gemm(rows: list[int], k: int = 768, n: int = 6144) -> list[dict[str, Any]]:
    """The two invariant weight GEMMs the GPT can run on, weights in cache (their arithmetic
    rate, not DRAM's): 4-bit ``MatMulNBits`` (CompInt8, the shipped int4) and the int8
    ``MatMulInteger`` of the per-row graphs, at each row count, in GOPS."""
    int8 = ort.InferenceSession(
        _matmul_int8_model(k, n), session_options(2), providers=["CPUExecutionProvider"]
    )
    rng = np.random.default_rng(1)
    out = []
    for m in rows:
        us = {
            "int4 MatMulNBits b256 acc4": matmul_nbits_us(1, 2, k, n, m),
            "int8 MatMulInteger U8S8": _run_us(
                int8, rng.integers(0, 256, (m, k)).astype(np.uint8), 40
            ),
        }
        out += [{"kernel": name, "rows": m, "us": t, "gops": 2 * m * k * n / t / 1e3}
                for name, t in us.items()]  # fmt: skip
    return out


def machine(bundle: Path) -> None:
    """Why this box's GPT step sits where it does: its ISA, its DRAM read bandwidth, the 4-bit
    kernel's speed with weights hot vs streamed, and the bandwidth floor of one decode step."""
    from .chattts_step import step_bytes

    info = cpu()
    print(f"cpu: {info['model']}, {info['logical_cores']} logical cores, load {os.getloadavg()}")
    print("isa: " + ", ".join(f"{f} {'yes' if info['flags'][f] else 'no'}" for f in ISA_FLAGS))
    bw = {t: read_bandwidth(t) for t in (1, 2)}
    print(f"DRAM read: {bw[1]:.1f} GB/s (1 thread), {bw[2]:.1f} GB/s (2 threads)")
    nbytes = 768 * 6144 // 2
    for count, label in ((1, "weights in cache"), (40, "40 weights streamed")):
        us = matmul_nbits_us(count, 2)
        print(f"MatMulNBits 768x6144 4-bit b256 acc4, M=1, 2 threads, {label}: "
              f"{us:.0f} µs ({nbytes / us / 1e3:.1f} GB/s)")  # fmt: skip
    steps = step_bytes(bundle, (100, 500))
    for ctx, kv in steps["kv"].items():
        total = steps["weights"] + kv
        print(f"{bundle.name} step at ctx {ctx}: {total / 1e6:.1f} MB read → floor "
              f"{total / (bw[2] * 1e9) * 1e3:.2f} ms at {bw[2]:.1f} GB/s")  # fmt: skip


def attention(bundle: Path, rows: list[int], ctx: int) -> None:
    """The GPT's attention alone at each KV type onnxruntime's CPU kernel takes (attention.py)."""
    from speakd.engines.bundle import load_bundle

    from .attention import Shape, table

    model = load_bundle(bundle, verify=False).manifest["model"]
    shape = Shape(model["num_layers"], model["num_heads"], model["head_dim"], model["max_context"])
    print(f"{bundle}: {shape}, context {ctx}, 2 threads; {line(describe(threads=2))}")
    for cell in table(shape, rows, ctx):
        print(f"  {cell['rows']} row(s), KV {cell['kv']:16s} {cell['ms']:7.2f} ms"
              f"  cache {cell['kv_mb']:6.1f} MB  {cell['gb_s']:5.1f} GB/s")  # fmt: skip


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "what",
        choices=["nodes", "ort", "loop", "threads", "machine", "batch", "attention", "gemm"],
    )
    p.add_argument("bundles", nargs="*", type=Path, help="every part but gemm: one or more")
    p.add_argument("--ctx", type=int, default=500)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--rows", default="1,8", help="batch, attention, gemm: rows (default 1,8)")


def run(a: argparse.Namespace) -> int:
    if a.what != "gemm" and not a.bundles:
        raise SystemExit(f"bench profile {a.what}: give a bundle")
    rows = [int(r) for r in a.rows.split(",")]
    if a.what == "nodes":
        nodes(a.bundles)
    elif a.what == "ort":
        ort_profile(a.bundles[0], a.ctx, a.steps)
    elif a.what == "loop":
        loop(a.bundles[0], a.steps)
    elif a.what == "machine":
        machine(a.bundles[0])
    elif a.what == "batch":
        batch_profile(a.bundles[0], rows, a.steps)
    elif a.what == "gemm":
        print(f"K 768, N 6144 (gate/up), 2 threads; {line(describe(threads=2))}")
        for c in gemm(rows):
            print(f"  {c['kernel']:28s} M={c['rows']:<4d} {c['us']:8.1f} µs {c['gops']:7.1f} GOPS")
    elif a.what == "attention":
        attention(a.bundles[0], rows, a.ctx)
    else:
        threads(a.bundles[0], a.rounds)
    return 0
