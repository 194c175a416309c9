"""Transposed convolutions become a ``Conv`` whose phases interleave, with the same output to
the rounding of a float; the embedded voice's decoder keeps its samples to ±1 LSB."""

from __future__ import annotations

import collections

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from speakd.engines.vits.upsample import polyphase_upsamplers


def _run(model: onnx.ModelProto, x: np.ndarray, name: str = "x") -> np.ndarray:
    s = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return s.run(None, {name: x})[0]


def _upsampler(
    k: int, stride: int, pads: tuple[int, int], bias: bool = True, **attrs
) -> onnx.ModelProto:
    rng = np.random.default_rng(k * 100 + stride)
    c_in, c_out = 6, 5
    inits = [numpy_helper.from_array(rng.normal(0, 0.3, (c_in, c_out, k)).astype("f4"), "w")]
    if bias:
        inits.append(numpy_helper.from_array(rng.normal(0, 0.3, c_out).astype("f4"), "b"))
    node = helper.make_node(
        "ConvTranspose",
        ["x", *(i.name for i in inits)],
        ["y"],
        kernel_shape=[k],
        strides=[stride],
        pads=list(pads),
        **attrs,
    )
    graph = helper.make_graph(
        [node], "up", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c_in, "t"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits,
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15)])


@pytest.mark.parametrize(
    ("k", "stride", "pads", "bias"),
    [
        (16, 8, (4, 4), True),  # HiFi-GAN's ×8 (Piper medium's first two)
        (8, 4, (2, 2), True),  # its ×4
        (4, 2, (1, 1), False),
        (5, 3, (1, 1), True),  # a kernel that is not a multiple of the stride
        (12, 4, (4, 4), True),  # a pad of a whole stride
        (3, 3, (0, 0), True),
    ],
)
def test_a_transposed_convolution_becomes_a_polyphase_convolution(k, stride, pads, bias) -> None:
    model = _upsampler(k, stride, pads, bias)
    x = np.random.default_rng(1).normal(0, 1, (1, 6, 13)).astype("f4")
    before = _run(model, x)
    assert polyphase_upsamplers(model) == 1
    ops = [n.op_type for n in model.graph.node]
    assert ops == ["Conv", "Reshape", "Transpose", "Reshape", "Slice"]
    after = _run(model, x)
    assert after.shape == before.shape == (1, 5, 13 * stride)
    np.testing.assert_allclose(after, before, rtol=0, atol=2e-6)
    assert "w" not in {i.name for i in model.graph.initializer}  # one copy of the weights


@pytest.mark.parametrize(
    "attrs", [{"output_padding": [1]}, {"group": 2}, {"dilations": [2]}], ids=str
)
def test_other_transposed_convolutions_are_left_alone(attrs) -> None:
    k, stride, pads = (16, 8, (4, 4))
    if "output_padding" in attrs:
        pads = (4, 3)  # with the output padding: still stride outputs per frame
    model = _upsampler(k, stride, pads, **attrs)
    assert polyphase_upsamplers(model) == 0
    assert [n.op_type for n in model.graph.node] == ["ConvTranspose"]


def test_the_embedded_decoder_has_no_transposed_convolution_and_keeps_its_samples() -> None:
    """Piper medium's HiFi-GAN: ×8, ×8, ×4; its audio to ±1 LSB of the 16-bit samples."""
    from speakd.engines.vits.engine import VitsVoice
    from speakd.engines.vits.graph import voice_graph
    from speakd.engines.vits.split import SplitVoice, session_decoder, split_voice

    parts = split_voice(voice_graph(VitsVoice.embedded()))
    decoder = session_decoder(parts.decoder)
    ops = collections.Counter(n.op_type for n in decoder.graph.node)
    assert ops["ConvTranspose"] == 0 and ops["Transpose"] == 3
    z = np.random.default_rng(2).normal(0, 0.8, (1, 192, 40)).astype("f4")
    ref, got = (_run(m, z, parts.joints.z).reshape(-1) for m in (parts.decoder, decoder))
    assert 0 < np.abs(got - ref).max() < 1e-6  # the split graph itself is left as it was
    pcm = [np.clip(np.round(a * 32767), -32768, 32767).astype(np.int32) for a in (ref, got)]
    assert np.abs(pcm[0] - pcm[1]).max() <= 1
    voice = SplitVoice(parts, ort.SessionOptions())
    ran = voice._decoder.run(None, {parts.joints.z: z})[0].reshape(-1)
    assert np.array_equal(ran, got)  # the session runs the rewritten graph
