"""A convolution feeding a residual sum becomes onnxruntime's ``FusedConv`` with that sum as its
fourth input: one node, the same output to the rounding of a float."""

from __future__ import annotations

import collections

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from speakd.engines.vits.residual import fuse_residual_adds


def _resblock(out_channels: int = 4, stride: int = 1, act: bool = True) -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(rng.normal(0, 0.3, (out_channels, 4, 5)).astype("f4"), "w"),
        numpy_helper.from_array(rng.normal(0, 0.3, out_channels).astype("f4"), "b"),
    ]
    n = helper.make_node
    conv_in = "a" if act else "x"
    nodes = [
        n("LeakyRelu", ["x"], ["a"], alpha=0.1),
        n("Conv", [conv_in, "w", "b"], ["c"], kernel_shape=[5], dilations=[3], pads=[6, 6],
          strides=[stride]),
        n("Add", ["c", "x"], ["y"]),
    ]  # fmt: skip
    graph = helper.make_graph(
        nodes, "rb", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, "t"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits,
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15)])


def _run(model: onnx.ModelProto, x: np.ndarray, name: str = "x") -> np.ndarray:
    s = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return s.run(None, {name: x})[0]


@pytest.mark.parametrize("act", [True, False], ids=["x + conv(act(x))", "x + conv(x)"])
def test_a_residual_sum_rides_on_its_convolution(act: bool) -> None:
    model = _resblock(act=act)
    x = np.random.default_rng(1).normal(0, 1, (1, 4, 40)).astype("f4")
    before = _run(model, x)
    assert fuse_residual_adds(model) == 1
    ops = [(n.domain, n.op_type) for n in model.graph.node]
    assert ("com.microsoft", "FusedConv") in ops and ("", "Add") not in ops
    np.testing.assert_allclose(_run(model, x), before, rtol=0, atol=1e-6)


def test_a_convolution_that_changes_the_shape_keeps_its_add() -> None:
    """More filters than channels would broadcast ``x`` into the sum: no fused sum for it."""
    model = _resblock(out_channels=8)
    assert fuse_residual_adds(model) == 0
    assert [n.op_type for n in model.graph.node] == ["LeakyRelu", "Conv", "Add"]


def test_the_embedded_decoder_carries_its_18_residual_sums() -> None:
    from speakd.engines.vits.engine import VitsVoice
    from speakd.engines.vits.graph import voice_graph
    from speakd.engines.vits.split import SplitVoice, session_decoder, split_voice

    parts = split_voice(voice_graph(VitsVoice.embedded()))
    decoder = session_decoder(parts.decoder)
    ops = collections.Counter(n.op_type for n in decoder.graph.node)
    assert ops["FusedConv"] == 18 and ops["Add"] == 6  # what is left: the resblocks' sums
    z = np.random.default_rng(2).normal(0, 0.8, (1, 192, 30)).astype("f4")
    ref, got = (_run(m, z, parts.joints.z).reshape(-1) for m in (parts.decoder, decoder))
    assert 0 < np.abs(got - ref).max() < 1e-6  # the split graph itself is left as it was
    voice = SplitVoice(parts, ort.SessionOptions())
    ran = voice._decoder.run(None, {parts.joints.z: z})[0].reshape(-1)
    assert np.array_equal(ran, got)  # the session runs the rewritten graph
