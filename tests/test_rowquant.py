"""Per-row int8 MatMuls (``speakd_tools.calibrate.rowquant``): a row's result is the same bits
alone, beside other rows and at any width, and within int8 error of float. Real ONNX sessions."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from speakd_tools.calibrate.rowquant import rewrite


def _graph(opset: int) -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    w1 = rng.normal(0, 0.05, (64, 96)).astype(np.float32)
    w2 = rng.normal(0, 0.05, (96, 32)).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm1"),
            helper.make_node("Relu", ["h"], ["r"], name="relu"),
            helper.make_node("MatMul", ["r", "w2"], ["y"], name="mm2"),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "t", 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", "t", 32])],
        [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _session(model: onnx.ModelProto) -> ort.InferenceSession:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("opset", [17, 21])  # ReduceMax's axes: attribute before 18, input after
def test_rows_round_alone_as_stacked_and_stay_near_float(opset: int) -> None:
    model = _graph(opset)
    reference = _session(model)
    assert rewrite(model) == 2
    assert not {n.op_type for n in model.graph.node} & {"MatMul", "DynamicQuantizeMatMul"}
    quant = _session(model)
    rng = np.random.default_rng(1)
    x = rng.normal(0, 1, (8, 5, 64)).astype(np.float32)
    x[3] *= 40.0  # a loud row: under one shared scale it would crush the others
    stacked = quant.run(None, {"x": x})[0]
    for b in range(8):
        alone = quant.run(None, {"x": x[b : b + 1]})[0]
        assert np.array_equal(alone[0], stacked[b])  # the same bits, whatever shares the batch
        frame = quant.run(None, {"x": x[b : b + 1, 2:3]})[0]
        assert np.array_equal(frame[0, 0], stacked[b, 2])  # and whatever shares the window
    want = reference.run(None, {"x": x})[0]
    rel = np.linalg.norm(stacked - want) / np.linalg.norm(want)
    assert rel < 0.02, rel


def test_zero_rows_give_zeros_not_nan() -> None:
    model = _graph(21)
    rewrite(model)
    y = _session(model).run(None, {"x": np.zeros((2, 3, 64), np.float32)})[0]
    assert np.array_equal(y, np.zeros_like(y))
