"""LayerNorms written out op by op become one ``LayerNormalization`` node each, with the same
outputs, and nothing else is touched."""

from __future__ import annotations

import collections

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from speakd.engines.vits.layernorm import fuse_layer_norms


def _vits_layer_norm(extra_reader: bool = False) -> onnx.ModelProto:
    """VITS's LayerNorm as torch exports it at opset 15: transpose, nine nodes, transpose back;
    ``extra_reader``: the centred values also leave the graph (then it is no LayerNorm)."""
    c = 8
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(np.array(2.0, np.float32), "two"),
        numpy_helper.from_array(np.array(1e-5, np.float32), "eps"),
        numpy_helper.from_array(rng.normal(1, 0.1, c).astype(np.float32), "gamma"),
        numpy_helper.from_array(rng.normal(0, 0.1, c).astype(np.float32), "beta"),
    ]
    n = helper.make_node
    nodes = [
        n("Transpose", ["x"], ["xt"], perm=[0, 2, 1]),
        n("ReduceMean", ["xt"], ["mean"], axes=[-1]),
        n("Sub", ["xt", "mean"], ["centred"]),
        n("Pow", ["centred", "two"], ["squared"]),
        n("ReduceMean", ["squared"], ["var"], axes=[-1]),
        n("Add", ["var", "eps"], ["var_eps"]),
        n("Sqrt", ["var_eps"], ["std"]),
        n("Div", ["centred", "std"], ["normed"]),
        n("Mul", ["normed", "gamma"], ["scaled"]),
        n("Add", ["scaled", "beta"], ["yt"]),
        n("Transpose", ["yt"], ["y"], perm=[0, 2, 1]),
    ]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    if extra_reader:
        outputs.append(helper.make_tensor_value_info("centred", TensorProto.FLOAT, None))
    graph = helper.make_graph(
        nodes, "ln", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, "t"])],
        outputs, inits,
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15)])


def _run(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    s = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return s.run(["y"], {"x": x})[0]


def test_a_layer_norm_over_channels_becomes_one_node_with_the_same_output() -> None:
    model = _vits_layer_norm()
    x = np.random.default_rng(1).normal(0, 3, (1, 8, 21)).astype(np.float32)
    before = _run(model, x)
    assert fuse_layer_norms(model) == 1
    assert [n.op_type for n in model.graph.node] == ["Transpose", "LayerNormalization", "Transpose"]
    (ln,) = [n for n in model.graph.node if n.op_type == "LayerNormalization"]
    assert list(ln.input) == ["xt", "gamma", "beta"]
    attrs = {a.name: helper.get_attribute_value(a) for a in ln.attribute}
    assert attrs["axis"] == -1 and abs(attrs["epsilon"] - 1e-5) < 1e-12
    np.testing.assert_allclose(_run(model, x), before, rtol=0, atol=2e-6)


def test_a_chain_whose_intermediate_is_read_elsewhere_is_left_alone() -> None:
    model = _vits_layer_norm(extra_reader=True)
    ops = [n.op_type for n in model.graph.node]
    assert fuse_layer_norms(model) == 0
    assert [n.op_type for n in model.graph.node] == ops


def test_every_layer_norm_of_the_embedded_voice_is_one_node() -> None:
    """Piper's prior: the text encoder's 12 LayerNorms and the duration predictor's 24."""
    from speakd.engines.vits.engine import VitsVoice
    from speakd.engines.vits.graph import voice_graph

    ops = collections.Counter(n.op_type for n in voice_graph(VitsVoice.embedded()).graph.node)
    assert ops["LayerNormalization"] == 36
    assert ops["ReduceMean"] == 0
