"""The duration predictor's rational-quadratic splines in some sixty nodes each instead of ~390.

Piper's stochastic duration predictor runs three ``ConvFlow`` layers in reverse; each ends in
``piecewise_rational_quadratic_transform`` (linear tails, ``K`` bins over ``[-B, B]``), on one
channel of a few dozen values. torch's exporter writes its in-place assignments
(``cumwidths[..., 0] = left`` and the like: seven of them) as ``ScatterND`` nodes fed by chains
of ``Shape``, ``Range``, ``Expand`` and ``Concat`` that build the indices, and its boolean
masks (``inputs[inside]``) as ``NonZero``, ``GatherND`` and ``ScatterND``: ~390 nodes a flow,
1 180 of the prior's, each a kernel of a few microseconds on a few hundred values
(docs/vits-engine.md, "Where a new line's time goes").

Rewritten at load, the spline runs on every value and ``Where`` keeps the input outside
``[-B, B]`` (the tails); each assignment of fixed values to the ends of the bins' last axis is
one ``Where`` with a constant mask (or a ``Pad`` with the value); the searches and gathers are
``GatherElements``. Every value inside the interval goes through the same float operations in
the same order as before, so the outputs are the same floats (tests/test_prior_rewrites.py).

A flow is rewritten only when its nodes are what Piper's exporter writes (the ops counted, the
constants the ones ``B``, ``K`` and the minimum bin size give); any other graph is left alone.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

from speakd.engines.vits.builder import GraphBuilder, prune_unread

# What torch's exporter writes for one reverse spline of Piper's (opset 15), by op.
_SIGNATURE = {
    "ScatterND": 10, "NonZero": 4, "GatherND": 5, "GatherElements": 7, "Softmax": 2,
    "Softplus": 1, "CumSum": 2, "Sqrt": 1, "Pow": 1, "ReduceSum": 1, "And": 1, "Not": 1,
    "GreaterOrEqual": 2, "LessOrEqual": 1, "Div": 4, "Neg": 2, "Pad": 3,
}  # fmt: skip
_SHAPE_OPS = {
    "Shape", "Gather", "Unsqueeze", "Concat", "Reshape", "Transpose", "Slice", "Sub", "Mul",
    "Add", "Cast", "Squeeze", "Expand", "Range", "Equal", "Where", "ConstantOfShape",
}  # fmt: skip
MIN_BIN = 1e-3  # Piper's min_bin_width, min_bin_height and min_derivative
EPS = 1e-6  # searchsorted's nudge of the last bin edge


@dataclass(frozen=True)
class _Spline:
    x: str  # [b, 1, t]: the channel the spline transforms
    params: str  # [b, 3K - 1, t]: the projection's widths, heights and derivatives (masked)
    scale: str  # what widths and heights are divided by (√ of the filter channels)
    bins: int
    bound: float
    out: str  # the transformed channel as the graph had it (a ScatterND's output)
    cone: list[onnx.NodeProto]


def fuse_splines(model: onnx.ModelProto) -> int:
    """Rewrite, in place, every reverse rational-quadratic spline of Piper's duration predictor;
    returns how many."""
    graph = model.graph
    producers = {o: n for n in graph.node for o in n.output}
    splines = [s for n in graph.node if (s := _spline(graph, n, producers)) is not None]
    if not splines:
        return 0
    b = GraphBuilder(graph, "/speakd_spline")
    built: dict[str, list[onnx.NodeProto]] = {}
    for i, spline in enumerate(splines):
        b.prefix = f"/speakd_spline/flow{i}"
        start = len(b.nodes)
        out = _build(b, spline)
        built[spline.out] = b.nodes[start:]
        for n in graph.node:  # the readers of the old output read the new one
            n.input[:] = [out if name == spline.out else name for name in n.input]
    ordered: list[onnx.NodeProto] = []
    for n in graph.node:
        ordered.append(n)
        for name in n.output:
            ordered.extend(built.get(name, []))
    del graph.node[:]
    graph.node.extend(ordered)
    prune_unread(graph, [n for s in splines for n in s.cone])
    return len(splines)


def _build(b: GraphBuilder, s: _Spline) -> str:
    """The spline of ``nflows.piecewise_rational_quadratic_transform`` in reverse, op for op."""
    k, bound = s.bins, s.bound

    def f32(value: float) -> str:
        return b.const(np.array(value, np.float32))

    def last(x: str, start: int, end: int) -> str:
        return b.op("Slice", x, b.ints(start), b.ints(end), b.ints(3))

    def ends(x: str, low: float, high: float) -> str:
        """``x`` with its first and last bin edge set to ``low`` and ``high``."""
        mask = np.zeros(k + 1, bool)
        mask[[0, -1]] = True
        values = np.zeros(k + 1, np.float32)
        values[0], values[-1] = low, high
        return b.op("Where", b.const(mask), b.const(values), x)

    def edges(unnormalized: str) -> str:
        share = b.op("Softmax", unnormalized, axis=-1)
        spread = np.float32(1.0) - np.float32(k) * np.float32(MIN_BIN)
        sizes = b.op("Add", b.op("Mul", f32(spread), share), f32(MIN_BIN))
        summed = b.op("CumSum", sizes, b.const(np.array(-1, np.int32)))
        padded = b.op("Pad", summed, b.ints(0, 0, 0, 1, 0, 0, 0, 0), f32(0.0))
        return b.op("Add", b.op("Mul", padded, f32(2 * bound)), f32(-bound))

    def gather(x: str) -> str:
        return b.op("GatherElements", x, index, axis=3)

    params = b.op("Transpose", b.op("Unsqueeze", s.params, b.ints(1)), perm=[0, 1, 3, 2])
    widths_u = b.op("Div", last(params, 0, k), s.scale)
    heights_u = b.op("Div", last(params, k, 2 * k), s.scale)
    constant = float(np.float32(np.log(np.exp(1 - MIN_BIN) - 1)))
    derivs_u = b.op("Pad", last(params, 2 * k, 3 * k - 1), b.ints(0, 0, 0, 1, 0, 0, 0, 1),
                    f32(constant))  # fmt: skip
    derivs = b.op("Add", b.op("Softplus", derivs_u), f32(MIN_BIN))
    x = b.op("Unsqueeze", s.x, b.ints(-1))  # [b, 1, t, 1]
    inside = b.op("And", b.op("GreaterOrEqual", x, f32(-bound)), b.op("LessOrEqual", x, f32(bound)))
    cumwidths = ends(edges(widths_u), -bound, bound)
    raw_heights = edges(heights_u)
    cumheights = ends(raw_heights, -bound, bound)
    searched = ends(raw_heights, -bound, float(np.float32(bound) + np.float32(EPS)))
    widths = b.op("Sub", last(cumwidths, 1, k + 1), last(cumwidths, 0, k))
    heights = b.op("Sub", last(cumheights, 1, k + 1), last(cumheights, 0, k))
    above = b.op("Cast", b.op("GreaterOrEqual", x, searched), to=TensorProto.INT64)
    found = b.op("Sub", b.op("ReduceSum", above, b.ints(-1), keepdims=1), b.ints(1))
    # outside [-B, B] the bin is out of range; clipped, the values there are dropped below
    index = b.op("Clip", found, b.const(np.array(0, np.int64)), b.const(np.array(k - 1, np.int64)))
    in_cumwidths, in_widths = gather(cumwidths), gather(widths)
    in_cumheights = gather(searched)
    in_delta = gather(b.op("Div", heights, widths))
    in_d, in_d1 = gather(derivs), gather(last(derivs, 1, k + 1))
    in_heights = gather(heights)
    offset = b.op("Sub", x, in_cumheights)
    slope = b.op("Sub", b.op("Add", in_d, in_d1), b.op("Mul", in_delta, f32(2.0)))
    t1 = b.op("Mul", offset, slope)
    a = b.op("Add", t1, b.op("Mul", in_heights, b.op("Sub", in_delta, in_d)))
    bb = b.op("Sub", b.op("Mul", in_heights, in_d), t1)
    c = b.op("Mul", b.op("Neg", in_delta), offset)
    discriminant = b.op("Sub", b.op("Pow", bb, f32(2.0)), b.op("Mul", b.op("Mul", a, f32(4.0)), c))
    root = b.op(
        "Div",
        b.op("Mul", c, f32(2.0)),
        b.op("Sub", b.op("Neg", bb), b.op("Sqrt", discriminant)),
    )
    spline = b.op("Add", b.op("Mul", root, in_widths), in_cumwidths)
    return b.op("Squeeze", b.op("Where", inside, spline, x), b.ints(-1))


def _spline(
    graph: onnx.GraphProto, node: onnx.NodeProto, producers: dict[str, onnx.NodeProto]
) -> _Spline | None:
    """The reverse spline whose output ``node`` (a ``Concat`` of a flow's two halves) reads."""
    if node.op_type != "Concat" or len(node.input) != 2:
        return None
    last_scatter = producers.get(node.input[1])
    if last_scatter is None or last_scatter.op_type != "ScatterND":
        return None
    scope = last_scatter.name.rsplit("/", 1)[0] + "/"
    cone = _cone(node.input[1], producers, scope)
    ops = Counter(n.op_type for n in cone)
    if any(ops[op] != count for op, count in _SIGNATURE.items()):
        return None
    if set(ops) - set(_SIGNATURE) - _SHAPE_OPS:
        return None
    inits = {i.name: i for i in graph.initializer}
    (low,) = [n for n in cone if n.op_type == "LessOrEqual"]
    (softplus,) = [n for n in cone if n.op_type == "Softplus"]
    x = low.input[0]
    if low.input[1] not in inits:
        return None
    bound = float(numpy_helper.to_array(inits[low.input[1]]))
    projections = [n for n in cone if n.op_type == "Mul" and producers.get(n.input[0]) is not None
                   and producers[n.input[0]].op_type == "Conv"]  # fmt: skip
    divs = {n.input[1] for n in cone if n.op_type == "Div" and n.input[1] in inits}
    if len(projections) != 1 or len(divs) != 1 or not softplus.input:
        return None
    conv = producers[projections[0].input[0]]
    weight = inits.get(conv.input[1])
    if weight is None or (weight.dims[0] + 1) % 3:
        return None
    bins = (weight.dims[0] + 1) // 3
    scale = next(iter(divs))
    expected = {
        -bound, bound, 2 * bound, MIN_BIN, 1.0, 2.0, 4.0, EPS, 0.0,
        float(np.float32(np.log(np.exp(1 - MIN_BIN) - 1))),
        float(numpy_helper.to_array(inits[scale])),
    }  # fmt: skip
    if _float_constants(cone, inits) != {float(np.float32(v)) for v in expected}:
        return None
    return _Spline(
        x=x,
        params=projections[0].output[0],
        scale=scale,
        bins=bins,
        bound=bound,
        out=node.input[1],
        cone=cone,
    )


def _float_constants(cone: list[onnx.NodeProto], inits: dict[str, onnx.TensorProto]) -> set[float]:
    """Every float scalar the cone reads or fills with."""
    values = set()
    for n in cone:
        tensors = [inits[i] for i in n.input if i in inits]
        tensors += [
            a.t for a in n.attribute if a.name == "value" and n.op_type == "ConstantOfShape"
        ]
        for t in tensors:
            if t.data_type == TensorProto.FLOAT and np.prod(t.dims, dtype=int) == 1:
                values.add(float(numpy_helper.to_array(t).reshape(-1)[0]))
    return values


def _cone(output: str, producers: dict[str, onnx.NodeProto], scope: str) -> list[onnx.NodeProto]:
    """The nodes of ``scope`` ``output`` is computed from, back to the ``Conv`` it starts from
    and to what comes from outside the scope (the flow's input, the mask)."""
    cone: dict[int, onnx.NodeProto] = {}
    todo = [output]
    while todo:
        node = producers.get(todo.pop())
        if node is None or node.op_type in ("Conv", "Split") or id(node) in cone:
            continue
        if not node.name.startswith(scope):
            continue
        cone[id(node)] = node
        todo.extend(i for i in node.input if i)
    return list(cone.values())
