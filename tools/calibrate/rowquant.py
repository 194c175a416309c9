"""Int8 MatMuls with a scale per activation row: a row's result never depends on the other rows.

``quantize_dynamic`` writes ``DynamicQuantizeMatMul``, which quantizes the whole activation tensor
with one scale, so stacking rows (a batched decode step, a padded prompt pass, stacked
Decoder/Vocos windows) changes every row's rounding. Here every MatMul with a constant weight
becomes::

    s = max(|x|, over the last axis, per row)          Abs, ReduceMax, Max(·, tiny)
    q = QuantizeLinear(x / s, 1/127, 128)  (uint8)     Div, QuantizeLinear
    y = MatMulInteger(q, Wq, 128) · s · w_scale/127    MatMulInteger, Cast, Mul, Mul

with ``Wq`` int8 per output channel (symmetric, ``w_scale = max|W[:, n]| / 127``). Each row
(token) has its own scale, and the sum is exact int32 arithmetic, so whatever kernel onnxruntime
picks for M rows (MLAS U8S8 QGEMM: AVX2, AVX-VNNI, AVX-512 VNNI, AMX; Arm udot/ummla) gives every
row the same bits as M = 1. Unsigned activations with zero point 128 are the pair x86's VNNI
instructions multiply natively (``vpdpbusd``: u8 × s8); on AVX2 without VNNI, MLAS's ``vpmaddubsw``
pairs saturate at int16, which loses accuracy the same way for every row (still invariant).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

_PREFIX = "rowq"


def weight_int8(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """[K, N] float → (int8 [K, N], scale [N]) symmetric per output channel."""
    scale = np.maximum(np.abs(w).max(axis=0), 1e-12) / 127.0
    q = np.clip(np.round(w / scale), -127, 127).astype(np.int8)
    return q, scale.astype(np.float32)


def rewrite(model: onnx.ModelProto, skip: set[str] | frozenset[str] = frozenset()) -> int:
    """Rewrite ``model`` in place: every MatMul whose B is a 2-D initializer (nodes named in
    ``skip`` excepted) gets per-row int8 activations. Returns the number of MatMuls rewritten."""
    graph = model.graph
    inits = {i.name: i for i in graph.initializer}
    consts = [
        numpy_helper.from_array(np.array(1e-30, np.float32), f"{_PREFIX}_tiny"),
        numpy_helper.from_array(np.array(1 / 127, np.float32), f"{_PREFIX}_step"),
        numpy_helper.from_array(np.array(128, np.uint8), f"{_PREFIX}_zp"),
        numpy_helper.from_array(np.array([-1], np.int64), f"{_PREFIX}_axis"),
    ]
    tiny, step, zp, axis = (c.name for c in consts)
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 21)
    nodes: list[onnx.NodeProto] = []
    weights: set[str] = set()
    count = 0
    for node in graph.node:
        w_name = node.input[1] if node.op_type == "MatMul" else ""
        if w_name not in inits or node.name in skip or len(inits[w_name].dims) != 2:
            nodes.append(node)
            continue
        if w_name not in weights:
            wq, ws = weight_int8(numpy_helper.to_array(inits[w_name]).astype(np.float32))
            consts += [
                numpy_helper.from_array(wq, f"{w_name}_{_PREFIX}_q"),
                numpy_helper.from_array(ws / np.float32(127), f"{w_name}_{_PREFIX}_s"),
            ]
            weights.add(w_name)
        x, y = node.input[0], node.output[0]
        p = f"{node.name or y}_{_PREFIX}"
        mk = helper.make_node
        nodes += [
            mk("Abs", [x], [f"{p}_abs"], name=f"{p}_Abs"),
            mk("ReduceMax", [f"{p}_abs", axis], [f"{p}_max"], keepdims=1, name=f"{p}_Max")
            if opset >= 18  # axes became an input in opset 18
            else mk(
                "ReduceMax", [f"{p}_abs"], [f"{p}_max"], axes=[-1], keepdims=1, name=f"{p}_Max"
            ),
            mk("Max", [f"{p}_max", tiny], [f"{p}_s"], name=f"{p}_Floor"),
            mk("Div", [x, f"{p}_s"], [f"{p}_unit"], name=f"{p}_Div"),
            mk("QuantizeLinear", [f"{p}_unit", step, zp], [f"{p}_q"], name=f"{p}_Quantize"),
            mk(
                "MatMulInteger",
                [f"{p}_q", f"{w_name}_{_PREFIX}_q", zp],
                [f"{p}_i32"],
                name=f"{p}_MatMulInteger",
            ),
            mk("Cast", [f"{p}_i32"], [f"{p}_f32"], to=TensorProto.FLOAT, name=f"{p}_Cast"),
            mk("Mul", [f"{p}_f32", f"{p}_s"], [f"{p}_row"], name=f"{p}_MulRow"),
            mk("Mul", [f"{p}_row", f"{w_name}_{_PREFIX}_s"], [y], name=f"{p}_MulChannel"),
        ]
        count += 1
    # a weight's float copy goes unless some untouched node still reads it
    still_read = {i for n in nodes for i in n.input}
    keep = [i for i in graph.initializer if i.name not in weights or i.name in still_read]
    del graph.initializer[:]
    graph.initializer.extend(keep + consts)
    del graph.node[:]
    graph.node.extend(nodes)
    return count


def quantize_file(src: Path, dst: Path, skip: set[str] | frozenset[str] = frozenset()) -> int:
    """``rewrite`` from file to file (weights inline: every graph here is < 2 GB)."""
    model = onnx.load(str(src))
    count = rewrite(model, skip)
    onnx.save(model, str(dst))
    return count
