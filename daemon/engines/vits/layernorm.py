"""One ``LayerNormalization`` node for each LayerNorm that torch's exporter wrote out op by op.

VITS normalises over channels: ``transpose(1, -1)``, ``F.layer_norm`` over the last axis, and back.
Exported at opset 15 (Piper's), ``F.layer_norm`` becomes nine nodes (``ReduceMean``, ``Sub``,
``Pow``, ``ReduceMean``, ``Add``, ``Sqrt``, ``Div``, ``Mul``, ``Add``). onnxruntime would fuse them
into its own ``LayerNormalization``, but its transpose optimiser runs first and moves the
transposes through the chain, leaving it to reduce over axis 1, which the fusion does not match.
So every LayerNorm of a Piper prior (36: the text encoder's 12 and the duration predictor's 24)
stays nine kernels over strided channels. Written as one node at load, before onnxruntime sees
the graph, they take a line's prior from about 18.3 to 16.2 ms on 2 cores (docs/vits-engine.md,
"Where a new line's time goes"). onnxruntime registers ``LayerNormalization`` in the ONNX domain
from version 1, so the graph keeps its opset.
"""

from __future__ import annotations

from collections import defaultdict

import onnx
from onnx import helper, numpy_helper


def fuse_layer_norms(model: onnx.ModelProto) -> int:
    """Rewrite, in place, every ``x → ReduceMean(-1) → Sub → Pow 2 → ReduceMean(-1) → Add eps →
    Sqrt → Div → Mul γ → Add β`` chain whose intermediates nothing else reads (no other node, not
    the graph's outputs); returns how many."""
    graph = model.graph
    readers: dict[str, list[onnx.NodeProto]] = defaultdict(list)
    for node in graph.node:
        for name in node.input:
            readers[name].append(node)
    constants = {i.name: i for i in graph.initializer}
    constants.update(
        {
            n.output[0]: a.t
            for n in graph.node
            if n.op_type == "Constant"
            for a in n.attribute
            if a.name == "value"
        }
    )
    outputs = {o.name for o in graph.output}  # read outside the graph: not the chain's alone
    fused: dict[int, onnx.NodeProto] = {}  # id of the chain's first node → its replacement
    gone: set[int] = set()
    for mean in graph.node:
        chain = _chain(mean, readers, constants)
        if chain is None or any(n.output[0] in outputs for n in chain[:-1]):
            continue
        var, add_eps, div, mul, add = chain[3], chain[4], chain[6], chain[7], chain[8]
        eps = float(numpy_helper.to_array(constants[_other(add_eps, var.output[0])]))
        fused[id(mean)] = helper.make_node(
            "LayerNormalization",
            [mean.input[0], _other(mul, div.output[0]), _other(add, mul.output[0])],
            [add.output[0]],
            name=f"{mean.name}/speakd_layernorm",
            axis=-1,
            epsilon=eps,
        )
        gone.update(id(n) for n in chain)
    nodes = [fused.get(id(n), n) for n in graph.node if id(n) in fused or id(n) not in gone]
    del graph.node[:]
    graph.node.extend(nodes)
    return len(fused)


def _other(node: onnx.NodeProto, name: str) -> str:
    """The input of a two-input ``node`` that is not ``name``."""
    return node.input[1] if node.input[0] == name else node.input[0]


def _chain(
    mean: onnx.NodeProto,
    readers: dict[str, list[onnx.NodeProto]],
    constants: dict[str, onnx.TensorProto],
) -> list[onnx.NodeProto] | None:
    """The nine nodes of a LayerNorm over the last axis starting at ``mean``, or None."""

    def only(node: onnx.NodeProto, op: str) -> onnx.NodeProto | None:
        after = readers[node.output[0]]
        return after[0] if len(after) == 1 and after[0].op_type == op else None

    def last_axis(node: onnx.NodeProto) -> bool:
        axes = [list(a.ints) for a in node.attribute if a.name == "axes"]
        return node.op_type == "ReduceMean" and len(node.input) == 1 and axes == [[-1]]

    def scalar(node: onnx.NodeProto, name: str, value: float | None = None) -> bool:
        c = constants.get(_other(node, name))
        if c is None:
            return False
        a = numpy_helper.to_array(c)
        return a.size == 1 and (value is None or float(a.reshape(-1)[0]) == value)

    def vector(node: onnx.NodeProto, name: str) -> bool:
        c = constants.get(_other(node, name))
        return c is not None and len(c.dims) == 1

    if not last_axis(mean) or (sub := only(mean, "Sub")) is None or sub.input[0] != mean.input[0]:
        return None
    after_sub = readers[sub.output[0]]
    pows = [n for n in after_sub if n.op_type == "Pow"]
    divs = [n for n in after_sub if n.op_type == "Div" and n.input[0] == sub.output[0]]
    if len(after_sub) != 2 or len(pows) != 1 or len(divs) != 1:
        return None
    pow_, div = pows[0], divs[0]
    var = only(pow_, "ReduceMean")
    add_eps = only(var, "Add") if var is not None and last_axis(var) else None
    sqrt = only(add_eps, "Sqrt") if add_eps is not None else None
    if var is None or add_eps is None or sqrt is None or div.input[1] != sqrt.output[0]:
        return None
    if not scalar(pow_, sub.output[0], 2.0) or not scalar(add_eps, var.output[0]):
        return None
    mul = only(div, "Mul")
    add = only(mul, "Add") if mul is not None else None
    if (
        mul is None
        or add is None
        or not vector(mul, div.output[0])
        or not vector(add, mul.output[0])
    ):
        return None
    return [mean, sub, pow_, var, add_eps, sqrt, div, mul, add]
