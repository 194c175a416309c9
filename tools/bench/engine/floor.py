"""Where a new text's first audio goes in a Piper voice, part by part, and how far each part is from
the floor of its arithmetic on this CPU.

    speakd-tools bench floor [--seed 5309] [--texts 20] [--runs 3] [--pitch 1.2] [--bundle PATH]

The texts are a screen reader's new text (``screenreader_nav.fresh``: lines, menu items and
say-all's first sentence, whose first clause is what it waits for), at Orca's default pitch (its
``PITCH 10``: +1.2 semitones, spoken slower and read back faster). Each text runs through the
engine's own sessions as ``synthesize`` runs them up to its first chunk, after ``IDLE_S`` of quiet
(a screen reader's pace), each part timed on its own: phonemes, the text encoder (a session of the
prior's graph up to the duration predictor's input), the rest of the prior (duration predictor,
alignment, seeded noise), and the first window's flow and decoder runs.

A part's **floor** is its multiply-adds (every Conv, ConvTranspose and MatMul at the run's shapes,
by ONNX shape inference: ``flops``) at the best fp32 GEMM speed measured in the same run and
threads (``gemm_peak``: onnxruntime's MatMul at the encoder's FFN shape and at 1024³): what the
part would cost if every multiply-add ran at the kernel's best speed and nothing else cost time.
The sum of the floors is the fp32 floor of the voice's first audio on this machine: no schedule
of the same arithmetic reaches below it.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

from ..harness.machine import describe, line
from ..harness.stats import median_s
from ..screenreader.screenreader_nav import Texts, fresh

IDLE_S = 0.3  # quiet before each text, as between a screen reader's keys
KINDS = ("line", "menu item", "say-all's first clause")
PARTS = ("phonemes", "text encoder", "duration predictor, alignment", "flow", "decoder")


def flops(model: onnx.ModelProto, shapes: dict[str, list[int]]) -> tuple[float, int]:
    """Multiply-adds × 2 of every Conv, ConvTranspose and MatMul in ``model`` with its inputs
    fixed to ``shapes``, and the number of such nodes whose shapes inference could not give
    (counted as 0: the result is then a lower bound)."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    for opset in m.opset_import:  # so that inference knows LayerNormalization (layernorm.py)
        if opset.domain in ("", "ai.onnx"):
            opset.version = max(opset.version, 17)
    for i in m.graph.input:
        if i.name in shapes:
            shape = i.type.tensor_type.shape
            del shape.dim[:]
            for v in shapes[i.name]:
                shape.dim.add().dim_value = v
    m = onnx.shape_inference.infer_shapes(m, data_prop=True)
    known: dict[str, list[int | None]] = {
        v.name: [
            d.dim_value if d.HasField("dim_value") else None for d in v.type.tensor_type.shape.dim
        ]
        for v in [*m.graph.value_info, *m.graph.input, *m.graph.output]
    }
    known.update({i.name: list(i.dims) for i in m.graph.initializer})
    total, unknown = 0.0, 0
    for n in m.graph.node:
        if n.op_type not in ("Conv", "ConvTranspose", "MatMul"):
            continue
        x, w, y = (known.get(t) or [] for t in (n.input[0], n.input[1], n.output[0]))
        if n.op_type == "MatMul":  # attention's products: a shape inference leaves partly open
            work = _matmul_work(x, w, y)
        elif None in x + w + y or not (x and w and y):
            work = None
        elif n.op_type == "Conv":  # every output element: C/group × kernel multiply-adds
            work = float(np.prod(y)) * float(np.prod(w[1:]))
        else:  # ConvTranspose: every input element, (O/group) × kernel of them
            work = float(np.prod(x)) * float(np.prod(w[1:]))
        if work is None:
            unknown += 1
        else:
            total += 2 * work
    return total, unknown


def _matmul_work(a: list[int | None], b: list[int | None], y: list[int | None]) -> float | None:
    """Multiply-adds of a MatMul (rows of ``a`` × its inner size × columns of ``b``), each size
    taken from whichever of the three shapes knows it; None when one stays unknown."""
    inner = next((d for d in (a[-1:] + b[-2:-1]) if d), None)
    cols = next((d for d in (b[-1:] + y[-1:]) if d), None)
    rows = 1
    for i in range(2, max(len(a), len(y)) + 1):  # a's leading dims, or the output's
        d = next((s[-i] for s in (a, y, b) if len(s) >= i and s[-i]), None)
        if d is None:
            return None
        rows *= d
    return None if inner is None or cols is None else float(rows * inner * cols)


def _matmul(m: int, k: int, n: int) -> bytes:
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.random.default_rng(0).normal(0, 1, (k, n)).astype("f4"), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "gemm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [m, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [m, n])],
        [w],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def gemm_peak(threads: int, ids: int) -> dict[str, float]:
    """GFLOP/s of onnxruntime's fp32 MatMul at the encoder FFN's shape (``ids`` × 576 × 768: its
    kernel-3 Conv of 192 → 768 channels as one GEMM) and at 1024³, median of 30 runs each."""
    from speakd.engines.ortsession import session_options

    out = {}
    for label, (m, k, n) in (("ffn", (ids, 576, 768)), ("1024^3", (1024, 1024, 1024))):
        s = ort.InferenceSession(
            _matmul(m, k, n), session_options(threads), ["CPUExecutionProvider"]
        )
        x = np.random.default_rng(1).normal(0, 1, (m, k)).astype("f4")
        out[label] = 2 * m * k * n / median_s(functools.partial(s.run, None, {"x": x}), 30) / 1e9
    return out


class _Timed:
    """A session whose runs are timed: ``calls`` holds (seconds, frames of its first input)."""

    def __init__(self, session: Any) -> None:
        self.session = session
        self.calls: list[tuple[float, int]] = []

    def get_outputs(self) -> Any:
        return self.session.get_outputs()

    def run(self, names: Any, feeds: dict[str, np.ndarray], run: Any = None) -> Any:
        t0 = time.perf_counter()
        out = self.session.run(names, feeds, run)
        self.calls.append((time.perf_counter() - t0, next(iter(feeds.values())).shape[-1]))
        return out


def encoder_graph(prior: onnx.ModelProto) -> onnx.ModelProto:
    """The prior's text encoder: its graph from the voice's inputs to the tensor the duration
    predictor (torch's ``/dp/`` scope) reads first."""
    from onnx.utils import Extractor

    first = next((n for n in prior.graph.node if n.name.startswith("/dp/")), None)
    if first is None:
        raise ValueError("no /dp/ nodes: not Piper's VITS export")
    inputs = [i.name for i in prior.graph.input if i.name in ("input", "input_lengths")]
    return Extractor(prior).extract_model(inputs, [first.input[0]])


def measure(args: argparse.Namespace, texts: Texts | None = None) -> dict[str, Any]:
    """``texts``: the run's (``bench screenreader --floor``: its own), else drawn from the seed."""
    from speakd.audio.pitch import by_resampling, slower
    from speakd.engines.base import SynthesisConfig
    from speakd.engines.ortsession import session_options
    from speakd.engines.vits.engine import VitsEngine, VitsVoice
    from speakd.engines.vits.graph import voice_graph
    from speakd.engines.vits.split import SplitVoice, lead_frames, split_voice
    from speakd.engines.vits.text import phonemize, split_clauses

    voice = VitsVoice.from_bundle(args.bundle) if args.bundle else VitsVoice.embedded()
    parts = split_voice(voice_graph(voice))
    encoder = encoder_graph(parts.prior)
    opts = session_options(args.threads)
    graphs = SplitVoice(parts, opts)
    engine = VitsEngine(graphs, voice)
    enc = ort.InferenceSession(encoder.SerializeToString(), opts, ["CPUExecutionProvider"])
    flow, decoder = _Timed(graphs._flow), _Timed(graphs._decoder)
    graphs._flow = flow
    graphs.use_decoder(decoder)
    joints = graphs.joints
    if texts is None:
        texts = fresh(args.seed, args.texts, args.texts, max(1, args.texts // 4))
    config = SynthesisConfig(pitch=args.pitch)
    params = engine._resolve(config)
    if by_resampling(engine, args.pitch):
        params = replace(params, length_scale=params.length_scale * slower(args.pitch))
    run = ort.RunOptions()
    rows: dict[str, dict[str, list[float]]] = {}
    gflop: dict[str, dict[str, list[float]]] = {}
    counted: dict[tuple[str, int], tuple[float, int]] = {}

    def count(part: str, model: onnx.ModelProto, shapes: dict[str, list[int]]) -> float:
        key = (part, next(iter(shapes.values()))[-1])
        if key not in counted:
            counted[key] = flops(model, shapes)
        return counted[key][0] / 1e9

    for kind, group in zip(KINDS, (texts.lines, texts.menu, texts.say_all), strict=True):
        ms, gf = rows.setdefault(kind, {}), gflop.setdefault(kind, {})
        for text in group:
            for _ in range(args.runs):
                time.sleep(IDLE_S)
                t0 = time.perf_counter()
                phonemes = split_clauses(
                    phonemize(voice.config.espeak_voice, text, voice.config.vowel_clusters)[0]
                )[0]
                t1 = time.perf_counter()
                feeds = engine._feeds(phonemes, params, 1)
                ids = int(feeds["input"].shape[1])
                enc_feeds = {k: feeds[k] for k in ("input", "input_lengths")}
                t2 = time.perf_counter()
                enc.run(None, enc_feeds, run)
                t3 = time.perf_counter()
                latents = graphs.prior(feeds, run)
                t4 = time.perf_counter()
                flow.calls.clear()
                decoder.calls.clear()
                next(iter(graphs.audio(latents, {}, run, lead_frames(latents.durations))))
                (flow_s, flow_frames), (dec_s, dec_frames) = flow.calls[0], decoder.calls[0]
                times = {
                    "phonemes": t1 - t0,
                    "text encoder": t3 - t2,
                    "prior": t4 - t3,  # the duration predictor's part: prior − encoder
                    "flow": flow_s,
                    "decoder": dec_s,
                }
                for part, s in times.items():
                    ms.setdefault(part, []).append(s * 1000)
                channels = int(latents.z_p.shape[1])
                ids_shape = {"input": [1, ids], "input_lengths": [1]}
                whole = count("prior", parts.prior, ids_shape)
                work = {
                    "phonemes": 0.0,
                    "text encoder": count("encoder", encoder, ids_shape),
                    "flow": count(
                        "flow", parts.flow, {joints.z_p: [1, channels, flow_frames],
                                             joints.mask: [1, 1, flow_frames]}
                    ),
                    "decoder": count(
                        "decoder", parts.decoder, {joints.z: [1, channels, dec_frames]}
                    ),
                }  # fmt: skip
                work["duration predictor, alignment"] = whole - work["text encoder"]
                for part, g in work.items():
                    gf.setdefault(part, []).append(g)
                ms.setdefault("ids", []).append(ids)
    ids_median = int(statistics.median(v for r in rows.values() for v in r["ids"]))
    peak = gemm_peak(args.threads, ids_median)
    return {
        "machine": describe(bandwidth=not args.no_bandwidth, threads=args.threads),
        "load": os.getloadavg(),
        "threads": args.threads,
        "pitch": args.pitch,
        "seed": args.seed,
        "runs": args.runs,
        "gemm_gflops": {k: round(v, 1) for k, v in peak.items()},
        "unknown_nodes": max(u for _, u in counted.values()),
        "kinds": {
            kind: {
                "n": len(rows[kind]["ids"]),
                "ids": statistics.median(rows[kind]["ids"]),
                "parts": {
                    part: {
                        "ms": round(_median_ms(rows[kind], part), 2),
                        "gflop": round(statistics.median(gflop[kind][part]), 3),
                    }
                    for part in PARTS
                },
            }
            for kind in KINDS
        },
    }


def _median_ms(rows: dict[str, list[float]], part: str) -> float:
    """A part's median ms; the duration predictor's is the prior's median less the encoder's (its
    own runs are the prior's, encoder included), never below 0 on a noisy machine."""
    if part != "duration predictor, alignment":
        return statistics.median(rows[part])
    return max(0.0, statistics.median(rows["prior"]) - statistics.median(rows["text encoder"]))


def table(r: dict[str, Any]) -> str:
    peak = max(r["gemm_gflops"].values())
    out = [
        line(r["machine"]),
        f"Load average {[round(x, 2) for x in r['load']]}; {r['threads']} threads; pitch "
        f"{r['pitch']} st; seed {r['seed']}; {r['runs']} runs per text after {IDLE_S} s idle.",
        "fp32 GEMM peak measured (onnxruntime MatMul): "
        + ", ".join(f"{k} {v} GFLOP/s" for k, v in r["gemm_gflops"].items())
        + f"; the floors divide by {peak}.",
        "",
        "| text | part | ms p50 | GFLOP | GFLOP/s | floor ms | × floor |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for kind, k in r["kinds"].items():
        total_ms = total_gf = 0.0
        for part, p in k["parts"].items():
            total_ms, total_gf = total_ms + p["ms"], total_gf + p["gflop"]
            floor = p["gflop"] / peak * 1000
            rate = f"{p['gflop'] / p['ms'] * 1000:.0f}" if p["gflop"] and p["ms"] else "–"
            times = f"{p['ms'] / floor:.1f}" if floor else "–"
            out.append(
                f"| {kind} (n={k['n']}, {k['ids']:.0f} ids) | {part} | {p['ms']:.1f} | "
                f"{p['gflop']:.2f} | {rate} | {floor:.1f} | {times} |"
            )
        floor = total_gf / peak * 1000
        out.append(
            f"| **{kind}** | **engine to first chunk** | **{total_ms:.1f}** | {total_gf:.2f} | "
            f"{total_gf / total_ms * 1000:.0f} | **{floor:.1f}** | {total_ms / floor:.1f} |"
        )
    if r["unknown_nodes"]:
        out.append(
            f"\nUp to {r['unknown_nodes']} GEMM nodes a graph without static shapes counted as 0."
        )
    return "\n".join(out)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--seed", type=int, default=5309, help="the new texts' draw")
    p.add_argument("--texts", type=int, default=20, help="lines and menu items each (say-all: ¼)")
    p.add_argument("--runs", type=int, default=3, help="runs per text (medians over all)")
    p.add_argument("--pitch", type=float, default=1.2, help="semitones (Orca's PITCH 10: 1.2)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--bundle", type=Path, help="a Piper voice bundle (default: the embedded voice)")
    p.add_argument("--no-bandwidth", action="store_true", help="skip the DRAM read measurement")
    p.add_argument("--json", action="store_true", help="print the numbers as JSON")
