"""The flow's 1-d convolutions as 2-d ones of height 1, so onnxruntime runs them in its blocked
channel layout (NCHWc).

onnxruntime's CPU ``Conv`` runs a 1-d convolution as an im2col copy and an SGEMM that packs that
copy again; its NCHWc kernels, which compute straight from channel blocks, only take 2-d
convolutions (its ``NchwcTransformer``). With its identities gone and its gates split
(``coupling.py``), the flow is convolutions joined by per-element ops, all of which the transformer
keeps in the blocked layout; only the coupling layers' split, flip and join leave it. Written as
2-d at load (an ``Unsqueeze`` of the input, every tensor [1, C, 1, T], a ``Squeeze`` of the output),
a screen reader's first window (~57 frames) takes about 13 % less CPU in the flow
(docs/vits-engine.md, "Where a new line's time goes"). The decoder stays 1-d: at 32–64 channels
the blocked kernels were slower there. The sums run in another order, so the latent frames differ
from the 1-d run's in the last bits of a float (tests/test_nchwc.py).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

# Ops that do not care about the tensors' rank once an axis of height 1 is put before time.
_ELEMENTWISE = {"Add", "Sub", "Mul", "Div", "Neg", "Exp", "Tanh", "Sigmoid", "Relu", "LeakyRelu"}
_CHANNEL_OPS = {"Split", "Concat", "Slice"}  # along axis 1 only


def conv1d_as_2d(model: onnx.ModelProto, source: str) -> bool:
    """Rewrite ``model`` in place when its only input is ``source`` ([1, C, T]) and all its nodes
    are 1-d ``Conv``, per-element ops and cuts or joins along channels; returns whether it did.
    Its reach must be read before (``split.reach`` takes 1-d convolutions)."""
    graph = model.graph
    constants = {i.name: i for i in graph.initializer}
    used = {i for n in graph.node for i in n.input}
    if [i.name for i in graph.input if i.name in used] != [source]:
        return False  # a speaker's [1, C, 1] conditioning would broadcast along the wrong axis
    if not all(_rank_free(n, constants) for n in graph.node):
        return False
    weights = {n.input[1] for n in graph.node if n.op_type == "Conv"}
    if any(n.op_type != "Conv" and weights & set(n.input) for n in graph.node):
        return False
    for name in weights:
        constants[name].dims.insert(2, 1)
    for node in graph.node:
        if node.op_type == "Conv":
            _as_2d(node)
    flat, tall = source, f"{source}/speakd_2d"
    for node in graph.node:
        node.input[:] = [tall if i == flat else i for i in node.input]
    axis = f"{source}/speakd_height_axis"
    graph.initializer.append(numpy_helper.from_array(np.array([2], np.int64), axis))
    squeezes = []
    for out in graph.output:
        for node in graph.node:
            node.output[:] = [f"{out.name}/speakd_2d" if o == out.name else o for o in node.output]
        squeezes.append(helper.make_node("Squeeze", [f"{out.name}/speakd_2d", axis], [out.name]))
    graph.node.insert(0, helper.make_node("Unsqueeze", [flat, axis], [tall]))
    graph.node.extend(squeezes)
    del graph.value_info[:]  # 3-d shapes of tensors that are 4-d now
    return True


def _rank_free(node: onnx.NodeProto, constants: dict[str, onnx.TensorProto]) -> bool:
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    if node.op_type == "Conv":
        return (
            node.input[1] in constants
            and len(constants[node.input[1]].dims) == 3
            and attrs.get("auto_pad", b"NOTSET") in (b"NOTSET", "NOTSET")
        )
    if node.op_type in _ELEMENTWISE:
        return True
    if node.op_type == "Slice":
        axes = node.input[3] if len(node.input) > 3 else ""
        return axes in constants and numpy_helper.to_array(constants[axes]).tolist() == [1]
    return node.op_type in _CHANNEL_OPS and attrs.get("axis", 0) == 1


def _as_2d(node: onnx.NodeProto) -> None:
    """A 1-d ``Conv``'s attributes for height 1 (``kernel_shape``, when given, and the others)."""
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    (d,), (s,) = attrs.get("dilations", [1]), attrs.get("strides", [1])
    left, right = attrs.get("pads", [0, 0])
    tall = {"dilations": [1, d], "strides": [1, s], "pads": [0, left, 0, right]}
    if "kernel_shape" in attrs:
        tall["kernel_shape"] = [1, *attrs["kernel_shape"]]
    kept = [a for a in node.attribute if a.name not in tall and a.name != "auto_pad"]
    del node.attribute[:]
    node.attribute.extend(kept)
    node.attribute.extend(helper.make_attribute(k, v) for k, v in tall.items())
