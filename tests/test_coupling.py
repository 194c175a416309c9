"""The flow without its identities (``x · mask``, ``x + zeros``, ``x · exp(−0)``) and with its
gated convolutions split by their slices gives the same bits, in 156 nodes instead of 292."""

from __future__ import annotations

import collections

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper
from onnx.utils import Extractor

from speakd.engines.vits.coupling import simplify_flow


def _session(model: onnx.ModelProto) -> ort.InferenceSession:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def test_the_embedded_flow_loses_its_identities_and_keeps_its_bits() -> None:
    from speakd.engines.vits.engine import VitsVoice
    from speakd.engines.vits.graph import voice_graph
    from speakd.engines.vits.split import split_voice

    model = voice_graph(VitsVoice.embedded())
    parts = split_voice(model)  # its flow already simplified
    j = parts.joints
    original = Extractor(model).extract_model([j.z_p, j.mask], [parts.flow.graph.output[0].name])
    before = collections.Counter(n.op_type for n in original.graph.node)
    after = collections.Counter(n.op_type for n in parts.flow.graph.node)
    assert sum(before.values()) == 292 and sum(after.values()) == 156
    assert after["Shape"] == after["ConstantOfShape"] == after["Exp"] == 0
    assert after["Slice"] == 4  # the channel flips between coupling layers; no half-slices
    assert after["Conv"] == before["Conv"] + 28  # each gate and res/skip conv split in two
    assert [i.name for i in parts.flow.graph.input] == [j.z_p]  # the mask: ones, dropped
    a, b = _session(original), _session(parts.flow)
    for frames in (57, 131):
        z_p = np.random.default_rng(frames).normal(0, 1, (1, 192, frames)).astype("f4")
        ref = a.run(None, {j.z_p: z_p, j.mask: np.ones((1, 1, frames), "f4")})[0]
        assert np.array_equal(b.run(None, {j.z_p: z_p})[0], ref)


def _gated(
    cond_channels: int = 4, sliced_elsewhere: bool = False, other_mask_use: bool = False
) -> onnx.ModelProto:
    """One WaveNet layer: conv → + zeros_like → tanh/sigmoid halves → ·; a skip sum started
    from zeros shaped like a ``cond_channels`` tensor; · mask. ``sliced_elsewhere``: the conv's
    output also leaves the graph; ``other_mask_use``: the mask is also read by a non-Mul."""
    rng = np.random.default_rng(0)
    c = 4
    inits = [
        numpy_helper.from_array(rng.normal(0, 0.5, (2 * c, c, 3)).astype("f4"), "w"),
        numpy_helper.from_array(rng.normal(0, 0.5, 2 * c).astype("f4"), "b"),
        numpy_helper.from_array(rng.normal(0, 0.5, (cond_channels, c, 1)).astype("f4"), "wc"),
        *(
            numpy_helper.from_array(np.array([v], np.int64), name)
            for name, v in (("zero", 0), ("half", c), ("end", 2**62), ("one", 1))
        ),
    ]
    n = helper.make_node
    nodes = [
        n("Mul", ["x", "mask"], ["h"]),
        n("Conv", ["h", "w", "b"], ["conv"], kernel_shape=[3], pads=[1, 1]),
        n("Shape", ["conv"], ["conv_shape"]),
        n("ConstantOfShape", ["conv_shape"], ["g"]),
        n("Add", ["conv", "g"], ["in_act"]),
        n("Slice", ["in_act", "zero", "half", "one"], ["t_in"]),
        n("Slice", ["in_act", "half", "end", "one"], ["s_in"]),
        n("Tanh", ["t_in"], ["t"]),
        n("Sigmoid", ["s_in"], ["s"]),
        n("Mul", ["t", "s"], ["acts"]),
        n("Conv", ["h", "wc"], ["cond"], kernel_shape=[1]),
        n("Shape", ["cond"], ["cond_shape"]),
        n("ConstantOfShape", ["cond_shape"], ["skip0"]),
        n("Add", ["skip0", "acts"], ["skip"]),
        n("Mul", ["skip", "mask"], ["masked"]),
        n("Tanh", ["masked"], ["y"]),
    ]
    outputs = ["y"] + (["conv"] if sliced_elsewhere else [])
    if other_mask_use:
        nodes.append(n("Add", ["mask", "mask"], ["mask2"]))
        outputs.append("mask2")
    graph = helper.make_graph(
        nodes,
        "wn",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, "t"]),
            helper.make_tensor_value_info("mask", TensorProto.FLOAT, [1, 1, "t"]),
        ],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15)])


def _outputs(model: onnx.ModelProto, x: np.ndarray) -> list[np.ndarray]:
    s = _session(model)
    feeds = {"x": x, "mask": np.ones((1, 1, x.shape[2]), "f4")}
    return s.run(None, {i.name: feeds[i.name] for i in s.get_inputs()})


def test_a_wavenet_layer_is_two_gated_convolutions_and_a_product() -> None:
    model = _gated()
    x = np.random.default_rng(1).normal(0, 1, (1, 4, 9)).astype("f4")
    before = _outputs(model, x)
    assert simplify_flow(model, "x", "mask") == (4, 1)  # 2 masks, 2 zeros; 1 conv split
    ops = collections.Counter(n.op_type for n in model.graph.node)
    assert ops == {"Conv": 2, "Tanh": 2, "Sigmoid": 1, "Mul": 1}  # the cond conv: dead now
    assert [i.name for i in model.graph.input] == ["x"]
    assert np.array_equal(_outputs(model, x)[0], before[0])


def test_what_is_not_an_identity_stays() -> None:
    """Zeros shaped like a tensor of other channels may broadcast; a conv whose whole output is
    read elsewhere is not split; a mask read otherwise stays an input."""
    model = _gated(cond_channels=1, sliced_elsewhere=True, other_mask_use=True)
    x = np.random.default_rng(1).normal(0, 1, (1, 4, 9)).astype("f4")
    before = _outputs(model, x)
    assert simplify_flow(model, "x", "mask") == (3, 0)  # the masks' Muls and conv + zeros_like
    ops = collections.Counter(n.op_type for n in model.graph.node)
    assert ops["ConstantOfShape"] == 1 and ops["Slice"] == 2
    assert "mask" in [i.name for i in model.graph.input]
    for got, ref in zip(_outputs(model, x), before, strict=True):
        assert np.array_equal(got, ref)
