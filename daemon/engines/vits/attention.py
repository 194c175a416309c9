"""Piper's relative-position attention as some twenty nodes a layer instead of about a hundred.

VITS's text encoder attends with a relative-position window of ``w`` (4 in Piper): each score
gains ``q_i · E_k[j - i + w]`` for ``|j - i| ≤ w``, each output ``Σ_r p_{i,i+r} · E_v[r + w]``.
torch computes both over all ``2t - 1`` relative positions (the embeddings zero-padded to the
sentence's length) and moves between relative and absolute positions by padding, flattening and
reslicing; its exporter writes that, with the shapes each step computes, as about a hundred small
nodes a layer (600 of the prior's 2 300), each a kernel of a few microseconds on a few thousand
values (docs/vits-engine.md, "Where a new line's time goes").

Rewritten at load, a layer multiplies by the ``2w + 1`` embeddings only and moves between the two
position systems with one ``GatherElements`` each, from index tables built once per run for all
layers; the reshapes take constant shapes. Each score and output sums the same products in the
same order as before (the dropped terms were exact zeros), so the outputs are the same floats
(tests/test_prior_rewrites.py), but for inputs near 128 ids (125–131 on AVX-512), where
onnxruntime's GEMM splits the old product's sum over ``2t - 1 ≈ 256`` relative positions into
blocks: z_p then moves by up to 1e-5, the audio by a 16-bit step on a few samples (render 5).

A layer is rewritten only when its nodes are what Piper's exporter writes (the ops counted,
the embeddings' and projections' shapes, heads shared); any other graph is left as it is.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import numpy_helper

from speakd.engines.vits.builder import GraphBuilder, prune_unread

# What torch's exporter writes for one of Piper's attention layers (opset 15), by op: the
# products (scores, relative keys, values, relative values), the mask, the softmax and the pads
# of the embeddings and of the two position changes.
_SIGNATURE = {"MatMul": 4, "Softmax": 1, "Where": 1, "Equal": 1, "Div": 1, "Pad": 6}
_SHAPE_OPS = {
    "Shape", "Gather", "Unsqueeze", "Concat", "Reshape", "Transpose", "Slice", "Sub", "Mul",
    "Add", "Cast", "Constant", "Squeeze",
}  # fmt: skip


@dataclass(frozen=True)
class _Layer:
    q: str
    k: str
    v: str
    mask: str  # [b, 1, t, t], 0 where a position is padding
    scale: str  # the scalar the queries are divided by (√ of the channels per head)
    fill: str  # the score a masked position gets
    zero: str  # what the mask is compared with
    emb_k: np.ndarray  # [2w + 1, channels per head]
    emb_v: np.ndarray
    heads: int
    out: onnx.NodeProto  # conv_o, which reads the heads' joined output
    cone: list[onnx.NodeProto]  # the nodes between the projections and conv_o


def fuse_relative_attention(model: onnx.ModelProto) -> int:
    """Rewrite, in place, every relative-position attention layer of Piper's text encoder;
    returns how many."""
    graph = model.graph
    if not any(o.domain in ("", "ai.onnx") and o.version >= 15 for o in model.opset_import):
        return 0  # Shape's start and end (below) are opset 15
    layers = [layer for n in graph.node if (layer := _layer(graph, n)) is not None]
    if not layers:
        return 0
    b = GraphBuilder(graph, "/speakd_relpos")
    window = (layers[0].emb_k.shape[0] - 1) // 2
    if any(layer.emb_k.shape[0] != 2 * window + 1 for layer in layers):
        return 0
    index = _Index(b, layers[0], window)
    nodes = {id(layer.out): _rewrite(b, layer, index, i) for i, layer in enumerate(layers)}
    ordered: list[onnx.NodeProto] = []
    for n in graph.node:
        if id(n) == id(layers[0].out):
            ordered.extend(index.nodes)
        ordered.extend(nodes.get(id(n), []))
        ordered.append(n)
    del graph.node[:]
    graph.node.extend(ordered)
    prune_unread(graph, [n for layer in layers for n in layer.cone])
    return len(layers)


class _Index:
    """The index tables of a run (its ``t`` from the first layer's queries), shared by all
    layers: ``keys`` [b, h, t, t] picks a relative logit (padded with a zero each side) for each
    absolute position, ``values`` [b, h, t, 2w + 1] a probability (likewise padded) for each
    relative one."""

    def __init__(self, b: GraphBuilder, first: _Layer, window: int) -> None:
        start = len(b.nodes)
        batch = b.op("Shape", first.q, start=0, end=1)
        length = b.op("Shape", first.q, start=2, end=3)
        t = b.op("Squeeze", length)
        r = b.op("Range", b.const(np.array(0, np.int64)), t, b.const(np.array(1, np.int64)))
        rows, cols = b.op("Unsqueeze", r, b.ints(1)), b.op("Unsqueeze", r, b.ints(0))
        width = 2 * window + 1
        # logit j - i + w of row i sits at column j - i + w + 1 of the padded logits
        keys = b.op(
            "Clip",
            b.op("Add", b.op("Sub", cols, rows), b.const(np.array(window + 1, np.int64))),
            b.const(np.array(0, np.int64)),
            b.const(np.array(width + 1, np.int64)),
        )
        # relative position r of row i reads column i + r + 1 of the padded probabilities
        values = b.op(
            "Clip",
            b.op("Add", rows, b.const(np.arange(1 - window, window + 2, dtype=np.int64)[None])),
            b.const(np.array(0, np.int64)),
            b.op("Add", t, b.const(np.array(1, np.int64))),
        )
        heads = b.ints(first.heads)
        self.keys = b.op("Expand", keys, b.op("Concat", batch, heads, length, length, axis=0))
        self.values = b.op(
            "Expand", values, b.op("Concat", batch, heads, length, b.ints(width), axis=0)
        )
        self.nodes = b.nodes[start:]


def _rewrite(b: GraphBuilder, layer: _Layer, index: _Index, i: int) -> list[onnx.NodeProto]:
    start = len(b.nodes)
    b.prefix = f"/speakd_relpos/layer{i}"
    per_head = layer.emb_k.shape[1]
    heads_shape = b.ints(0, layer.heads, per_head, -1)
    pad_one = b.ints(0, 0, 0, 1, 0, 0, 0, 1)  # a zero column each side of the last axis
    q = b.op("Transpose", b.op("Reshape", layer.q, heads_shape), perm=[0, 1, 3, 2])
    k = b.op("Reshape", layer.k, heads_shape)
    v = b.op("Transpose", b.op("Reshape", layer.v, heads_shape), perm=[0, 1, 3, 2])
    q = b.op("Div", q, layer.scale)
    relative = b.op("MatMul", q, b.const(np.ascontiguousarray(layer.emb_k.T)))
    local = b.op("GatherElements", b.op("Pad", relative, pad_one), index.keys, axis=3)
    scores = b.op("Add", b.op("MatMul", q, k), local)
    masked = b.op("Where", b.op("Equal", layer.mask, layer.zero), layer.fill, scores)
    p = b.op("Softmax", masked, axis=-1)
    weights = b.op("GatherElements", b.op("Pad", p, pad_one), index.values, axis=3)
    out = b.op("Add", b.op("MatMul", p, v), b.op("MatMul", weights, b.const(layer.emb_v)))
    joined = b.op(
        "Reshape",
        b.op("Transpose", out, perm=[0, 1, 3, 2]),
        b.ints(0, layer.heads * per_head, -1),
    )
    layer.out.input[0] = joined
    return b.nodes[start:]


def _layer(graph: onnx.GraphProto, conv_o: onnx.NodeProto) -> _Layer | None:
    """The attention layer whose output projection is ``conv_o``, if it is Piper's."""
    if conv_o.op_type != "Conv" or "/conv_o/" not in conv_o.name:
        return None
    producers = {o: n for n in graph.node for o in n.output}
    inits = {i.name: i for i in graph.initializer}
    cone, leaves = _cone(conv_o.input[0], producers)
    ops = Counter(n.op_type for n in cone)
    if any(ops[op] != count for op, count in _SIGNATURE.items()):
        return None
    if set(ops) - set(_SIGNATURE) - _SHAPE_OPS:
        return None
    convs = {
        role: producers[name]
        for name in leaves
        if name in producers
        for role in ("conv_q", "conv_k", "conv_v")
        if producers[name].op_type == "Conv" and f"/{role}/" in producers[name].name
    }
    embeddings = {
        role: numpy_helper.to_array(inits[name])
        for name in leaves
        if name in inits
        for role in ("emb_rel_k", "emb_rel_v")
        if name.endswith(role)
    }
    (equal,) = [n for n in cone if n.op_type == "Equal"]
    (where,) = [n for n in cone if n.op_type == "Where"]
    (div,) = [n for n in cone if n.op_type == "Div"]
    if len(convs) != 3 or len(embeddings) != 2 or where.input[0] != equal.output[0]:
        return None
    emb_k, emb_v = embeddings["emb_rel_k"], embeddings["emb_rel_v"]
    channels = inits[conv_o.input[1]].dims[1] if conv_o.input[1] in inits else 0
    if emb_k.ndim != 3 or emb_k.shape[0] != 1 or emb_k.shape != emb_v.shape:
        return None  # one embedding shared by all heads, as Piper's
    per_head = emb_k.shape[2]
    scale = inits.get(div.input[1])
    if (
        not per_head
        or channels % per_head
        or scale is None
        or not math.isclose(float(numpy_helper.to_array(scale)), math.sqrt(per_head), rel_tol=1e-6)
        or equal.input[1] not in inits
        or where.input[1] not in inits
    ):
        return None
    return _Layer(
        q=convs["conv_q"].output[0],
        k=convs["conv_k"].output[0],
        v=convs["conv_v"].output[0],
        mask=equal.input[0],
        scale=div.input[1],
        fill=where.input[1],
        zero=equal.input[1],
        emb_k=emb_k[0],
        emb_v=emb_v[0],
        heads=channels // per_head,
        out=conv_o,
        cone=cone,
    )


def _cone(
    output: str, producers: dict[str, onnx.NodeProto]
) -> tuple[list[onnx.NodeProto], set[str]]:
    """The nodes ``output`` is computed from, back to the projections (``Conv`` outputs), the
    mask (what ``Equal`` compares), initializers and graph inputs; and the names it stops at."""
    cone: dict[int, onnx.NodeProto] = {}
    leaves: set[str] = set()
    todo = [output]
    while todo:
        name = todo.pop()
        node = producers.get(name)
        if node is None or node.op_type == "Conv":
            leaves.add(name)
            continue
        if id(node) in cone:
            continue
        cone[id(node)] = node
        inputs = node.input[1:] if node.op_type == "Equal" else node.input
        leaves.update(node.input[:1] if node.op_type == "Equal" else [])
        todo.extend(i for i in inputs if i)
    return list(cone.values()), leaves
