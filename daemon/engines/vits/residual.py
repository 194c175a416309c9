"""HiFi-GAN's residual sums carried by the convolution that feeds them.

Each of the decoder's resblock layers is ``x + conv(leaky_relu(x))``: onnxruntime runs the
convolution, then an ``Add`` that reads both tensors again and writes a third, 18 times per
window on tensors of up to 32 × 6 400 values. onnxruntime's ``FusedConv`` (its ``com.microsoft``
domain, what its own fusions make of ``Conv`` + activation) takes a fourth input, a tensor of the
output's shape that the convolution's sums start from (MLAS's ``beta = 1``), so the sum costs no
pass of its own. The residual is then added before the bias rather than after it: the samples
can differ in the last bit of a float (tests/test_residual.py).
"""

from __future__ import annotations

from collections import defaultdict

import onnx
from onnx import helper

_UNARY = {"LeakyRelu", "Relu", "Tanh", "Sigmoid"}  # same shape out as in


def fuse_residual_adds(model: onnx.ModelProto) -> int:
    """Rewrite, in place, every ``Add(x, Conv(x or act(x)))`` whose convolution keeps its
    input's shape (as many filters as channels, stride 1, padding that keeps the length) and
    is read by nothing else, into a ``FusedConv`` with ``x`` as its sum; returns how many."""
    graph = model.graph
    readers: dict[str, list[onnx.NodeProto]] = defaultdict(list)
    for n in graph.node:
        for i in n.input:
            readers[i].append(n)
    made_by = {o: n for n in graph.node for o in n.output}
    constants = {i.name: i for i in graph.initializer}
    outputs = {o.name for o in graph.output}
    gone: set[int] = set()
    for conv in graph.node:
        after = readers[conv.output[0]]
        if conv.op_type != "Conv" or len(after) != 1 or after[0].op_type != "Add":
            continue
        add = after[0]
        residual = add.input[1] if add.input[0] == conv.output[0] else add.input[0]
        source = made_by.get(conv.input[0])
        feeds_conv = conv.input[0] == residual or (
            source is not None and source.op_type in _UNARY and source.input[0] == residual
        )
        if not feeds_conv or conv.output[0] in outputs or not _keeps_shape(conv, constants):
            continue
        conv.op_type, conv.domain = "FusedConv", "com.microsoft"
        conv.input.extend([""] * (3 - len(conv.input)) + [residual])
        conv.output[0] = add.output[0]
        gone.add(id(add))
    if gone:
        nodes = [n for n in graph.node if id(n) not in gone]
        del graph.node[:]
        graph.node.extend(nodes)
        if not any(o.domain == "com.microsoft" for o in model.opset_import):
            model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    return len(gone)


def _keeps_shape(conv: onnx.NodeProto, constants: dict[str, onnx.TensorProto]) -> bool:
    weight = constants.get(conv.input[1])
    if weight is None or len(weight.dims) != 3 or weight.dims[0] != weight.dims[1]:
        return False
    attrs = {a.name: helper.get_attribute_value(a) for a in conv.attribute}
    (k,) = attrs.get("kernel_shape", weight.dims[2:])
    (d,) = attrs.get("dilations", [1])
    left, right = attrs.get("pads", [0, 0])
    return (
        attrs.get("group", 1) == 1
        and attrs.get("strides", [1]) == [1]
        and attrs.get("auto_pad", b"NOTSET") in (b"NOTSET", "NOTSET")
        and left + right == d * (k - 1)
    )
