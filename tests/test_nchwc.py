"""The flow's 1-d convolutions as 2-d ones: onnxruntime then runs them in its NCHWc layout, and
the latent frames stay those of the 1-d graph to the rounding of a float."""

from __future__ import annotations

import collections

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from speakd.engines.ortsession import session_options
from speakd.engines.vits.nchwc import conv1d_as_2d


def test_the_embedded_flow_runs_in_the_blocked_layout_with_the_same_frames(tmp_path) -> None:
    from speakd.engines.vits.engine import VitsVoice
    from speakd.engines.vits.graph import voice_graph
    from speakd.engines.vits.split import split_voice

    parts = split_voice(voice_graph(VitsVoice.embedded()))
    z_p = parts.joints.z_p
    flat = onnx.ModelProto()
    flat.CopyFrom(parts.flow)
    assert conv1d_as_2d(parts.flow, z_p)
    convs = [n for n in parts.flow.graph.node if n.op_type == "Conv"]
    assert len(convs) == 68 and all(
        len(helper.get_attribute_value(a)) == 2
        for n in convs
        for a in n.attribute
        if a.name == "kernel_shape"
    )
    opts = session_options(2)
    opts.optimized_model_filepath = str(tmp_path / "flow.onnx")
    tall = ort.InferenceSession(parts.flow.SerializeToString(), opts, ["CPUExecutionProvider"])
    domains = collections.Counter(n.domain for n in onnx.load(tmp_path / "flow.onnx").graph.node)
    assert domains["com.microsoft.nchwc"] >= 68  # every convolution, and the reorders
    ref = ort.InferenceSession(
        flat.SerializeToString(), session_options(2), ["CPUExecutionProvider"]
    )
    for frames in (57, 200):
        x = np.random.default_rng(frames).normal(0, 1, (1, 192, frames)).astype("f4")
        want, got = ref.run(None, {z_p: x})[0], tall.run(None, {z_p: x})[0]
        assert got.shape == want.shape == (1, 192, frames)
        np.testing.assert_allclose(got, want, rtol=0, atol=5e-5)


def _graph(*nodes: onnx.NodeProto, speaker: bool = False) -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(rng.normal(0, 0.5, (4, 4, 3)).astype("f4"), "w"),
        numpy_helper.from_array(np.array([2], np.int64), "two"),
        numpy_helper.from_array(np.array([0], np.int64), "zero"),
        numpy_helper.from_array(np.array([4], np.int64), "four"),
    ]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, "t"])]
    if speaker:
        inputs.append(helper.make_tensor_value_info("g", TensorProto.FLOAT, [1, 4, 1]))
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["c"], kernel_shape=[3], pads=[1, 1]), *nodes],
        "flow", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits,
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15)])


def _run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> np.ndarray:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, feeds
    )[0]


def test_a_small_flow_becomes_2d_around_its_input_and_output() -> None:
    model = _graph(
        helper.make_node("Tanh", ["c"], ["t"]), helper.make_node("Mul", ["t", "c"], ["y"])
    )
    x = np.random.default_rng(1).normal(0, 1, (1, 4, 11)).astype("f4")
    before = _run(model, {"x": x})
    assert conv1d_as_2d(model, "x")
    ops = [n.op_type for n in model.graph.node]
    assert ops == ["Unsqueeze", "Conv", "Tanh", "Mul", "Squeeze"]
    np.testing.assert_allclose(_run(model, {"x": x}), before, rtol=0, atol=1e-5)


@pytest.mark.parametrize(
    ("node", "speaker"),
    [
        (helper.make_node("Add", ["c", "g"], ["y"]), True),  # [1, C, 1] would broadcast wrongly
        (helper.make_node("Slice", ["c", "zero", "four", "two"], ["y"]), False),  # along time
        (helper.make_node("Softmax", ["c"], ["y"], axis=2), False),
    ],
    ids=["speaker", "slice along time", "softmax"],
)
def test_a_graph_whose_rank_matters_is_left_alone(node: onnx.NodeProto, speaker: bool) -> None:
    model = _graph(node, speaker=speaker)
    before = model.SerializeToString()
    assert not conv1d_as_2d(model, "x")
    assert model.SerializeToString() == before


def test_the_split_voice_runs_its_flow_in_2d() -> None:
    from speakd.engines.vits.engine import VitsVoice
    from speakd.engines.vits.graph import voice_graph
    from speakd.engines.vits.split import SplitVoice, split_voice

    parts = split_voice(voice_graph(VitsVoice.embedded()))
    SplitVoice(parts, session_options(1))  # reads the reaches, then rewrites its parts
    nodes = parts.flow.graph.node
    assert (nodes[0].op_type, nodes[-1].op_type) == ("Unsqueeze", "Squeeze")
    weights = {n.input[1] for n in nodes if n.op_type == "Conv"}
    dims = {len(i.dims) for i in parts.flow.graph.initializer if i.name in weights}
    assert dims == {4}
