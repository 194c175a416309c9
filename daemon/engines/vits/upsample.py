"""HiFi-GAN's transposed convolutions as ordinary convolutions whose outputs interleave (polyphase).

A ``ConvTranspose`` of stride ``s`` and kernel ``k = m·s`` scatters each input frame into ``k``
outputs. onnxruntime runs it as a GEMM into a column buffer of ``k·C_out`` rows and then adds the
columns into place (col2im) on one thread. Read the other way, output ``o = p·s − pad + r``
(``r`` < ``s``) gathers exactly the ``m`` input frames ``p − m + 1 … p``, with taps
``W[:, :, (m − 1 − t)·s + r]``: one ``Conv`` of kernel ``m`` into ``s·C_out`` channels (the
channel ``co·s + r`` is phase ``r`` of output channel ``co``), no zero multiplied and no column
buffer, then a reshape and transpose lay the phases side by side along time and a slice drops
the ``pad`` outputs the transposed convolution cuts off. The sums are the same products added in
another order, so the samples can differ in the last bit of a float (tests/test_upsample.py).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

_INT64_MAX = np.iinfo(np.int64).max


def polyphase_upsamplers(model: onnx.ModelProto) -> int:
    """Rewrite, in place, every 1-d ``ConvTranspose`` (one group, no dilation or output padding,
    constant weights) that makes exactly ``stride`` outputs per input frame; returns how many.
    The result mixes time steps in ways ``split.reach`` refuses (reshape, slice along time): it is
    for the session, after the reach is read from the original."""
    graph = model.graph
    constants = {i.name: i for i in graph.initializer}
    nodes: list[onnx.NodeProto] = []
    count = 0
    for node in graph.node:
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        shape = _upsampler(node, attrs, constants)
        if shape is None:
            nodes.append(node)
            continue
        stride, pad = shape
        weight = numpy_helper.to_array(constants[node.input[1]])
        bias = numpy_helper.to_array(constants[node.input[2]]) if len(node.input) > 2 else None
        nodes.extend(_polyphase(graph, node, weight, bias, stride, pad))
        count += 1
    if count:
        used = {i for n in nodes for i in n.input}
        for i in reversed(range(len(graph.initializer))):  # in place, as coupling.py does
            if graph.initializer[i].name not in used:
                del graph.initializer[i]
        del graph.node[:]
        graph.node.extend(nodes)
    return count


def _upsampler(
    node: onnx.NodeProto, attrs: dict, constants: dict[str, onnx.TensorProto]
) -> tuple[int, int] | None:
    """(stride, left pad) of a ``ConvTranspose`` this rewrite covers, else None."""
    if node.op_type != "ConvTranspose" or node.input[1] not in constants:
        return None
    if len(node.input) > 2 and node.input[2] not in constants:
        return None
    if attrs.get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET") or "output_shape" in attrs:
        return None
    kernel = attrs.get("kernel_shape") or list(constants[node.input[1]].dims[2:])
    if len(kernel) != 1 or attrs.get("group", 1) != 1 or attrs.get("dilations", [1]) != [1]:
        return None
    (k,) = kernel
    (stride,) = attrs.get("strides", [1])
    pad_l, pad_r = attrs.get("pads", [0, 0])
    if any(attrs.get("output_padding", [])) or k - pad_l - pad_r != stride or stride < 2:
        return None
    return stride, pad_l


def _polyphase(
    graph: onnx.GraphProto,
    node: onnx.NodeProto,
    weight: np.ndarray,
    bias: np.ndarray | None,
    stride: int,
    pad: int,
) -> list[onnx.NodeProto]:
    """The ``Conv``, ``Reshape``, ``Transpose``, ``Reshape`` and ``Slice`` that replace ``node``."""
    c_in, c_out, k = weight.shape
    taps = -(-k // stride)  # m; a kernel that is not a multiple of the stride gets zero taps
    full = np.zeros((c_in, c_out, taps * stride), weight.dtype)
    full[:, :, :k] = weight
    # conv[co·s + r, ci, t] = W[ci, co, (m − 1 − t)·s + r]
    conv_w = full.reshape(c_in, c_out, taps, stride)[:, :, ::-1, :].transpose(1, 3, 0, 2)
    conv_w = np.ascontiguousarray(conv_w.reshape(c_out * stride, c_in, taps))
    extra = -(-pad // stride)  # frames past the end whose phases reach the last kept output
    name = f"{node.name}/speakd_polyphase"
    inits = [numpy_helper.from_array(conv_w, f"{name}/W")]
    if bias is not None:  # every phase of an output channel gets its bias
        inits.append(numpy_helper.from_array(np.repeat(bias, stride), f"{name}/B"))
    cut = extra * stride - pad  # outputs after the last kept one
    inits += [
        numpy_helper.from_array(np.array([0, c_out, stride, -1], np.int64), f"{name}/phases"),
        numpy_helper.from_array(np.array([0, c_out, -1], np.int64), f"{name}/joined"),
        numpy_helper.from_array(np.array([pad], np.int64), f"{name}/start"),
        numpy_helper.from_array(np.array([-cut if cut else _INT64_MAX], np.int64), f"{name}/end"),
        numpy_helper.from_array(np.array([2], np.int64), f"{name}/axis"),
    ]
    graph.initializer.extend(inits)
    x, y = node.input[0], node.output[0]
    conv_in = [x, f"{name}/W"] + ([f"{name}/B"] if bias is not None else [])
    return [
        helper.make_node(
            "Conv", conv_in, [f"{name}/conv"], name=f"{name}/Conv",
            kernel_shape=[taps], pads=[taps - 1, extra],
        ),
        helper.make_node(
            "Reshape", [f"{name}/conv", f"{name}/phases"], [f"{name}/phases_out"],
            name=f"{name}/Reshape",
        ),
        helper.make_node(
            "Transpose", [f"{name}/phases_out"], [f"{name}/interleaved"],
            name=f"{name}/Transpose", perm=[0, 1, 3, 2],
        ),
        helper.make_node(
            "Reshape", [f"{name}/interleaved", f"{name}/joined"], [f"{name}/joined_out"],
            name=f"{name}/Reshape_1",
        ),
        helper.make_node(
            "Slice",
            [f"{name}/joined_out", f"{name}/start", f"{name}/end", f"{name}/axis"],
            [y],
            name=f"{name}/Slice",
        ),
    ]  # fmt: skip
