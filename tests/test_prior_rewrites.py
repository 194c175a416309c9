"""The embedded voice's prior rewritten at load in fewer nodes: its relative-position attention
(attention.py) and its duration predictor's splines (spline.py). Each takes hundreds of nodes
out of the graph, and the prior's outputs stay the same floats (the attention's to a rounding
near 128 ids)."""

from __future__ import annotations

import collections

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from speakd.engines.base import SynthesisConfig
from speakd.engines.ortsession import session_options
from speakd.engines.vits import graph
from speakd.engines.vits.attention import fuse_relative_attention
from speakd.engines.vits.engine import VitsEngine, VitsVoice
from speakd.engines.vits.spline import fuse_splines
from speakd.engines.vits.split import split_voice
from speakd.engines.vits.text import phonemize

# a menu item, a line, a one-letter key echo and a sentence longer than the window many times
TEXTS = ("Save as", "The door is open.", "a", "Close the window, then open the one behind it.")
REWRITES = ("fuse_relative_attention", "fuse_splines")


def _prior(monkeypatch: pytest.MonkeyPatch, *without: str) -> onnx.ModelProto:
    """The embedded voice's prior as the engine loads it, less the rewrites named."""
    with monkeypatch.context() as m:
        for name in without:
            m.setattr(graph, name, lambda model: 0)
        return split_voice(graph.voice_graph(VitsVoice.embedded())).prior


def ops_of(model: onnx.ModelProto) -> collections.Counter[str]:
    return collections.Counter(n.op_type for n in model.graph.node)


def _session(model: onnx.ModelProto) -> ort.InferenceSession:
    return ort.InferenceSession(
        model.SerializeToString(), session_options(2), ["CPUExecutionProvider"]
    )


def _same_outputs(before: onnx.ModelProto, after: onnx.ModelProto) -> None:
    """z_p and the frames per id, to the bit, over lines, seeds and duration noise (noise_w 2
    pushes some of the splines' inputs past their bound, into the linear tails)."""
    engine = VitsEngine.embedded()
    sessions = [_session(g) for g in (before, after)]
    for noise_w, seed in ((0.8, 1), (2.0, 2)):
        params = engine._resolve(SynthesisConfig(extra={"noise_w": noise_w}))
        for text in TEXTS:
            (phonemes,) = phonemize(engine.config.espeak_voice, text, engine.config.vowel_clusters)
            feeds = engine._feeds(phonemes, params, seed)
            want, got = (s.run(None, feeds) for s in sessions)
            for w, g in zip(want, got, strict=True):
                np.testing.assert_array_equal(g, w)


def test_the_attention_takes_fewer_nodes_to_the_same_floats(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    before, after = _prior(monkeypatch, *REWRITES), _prior(monkeypatch, "fuse_splines")
    ops, was = ops_of(after), ops_of(before)
    assert ops["GatherElements"] - was["GatherElements"] == 12  # 2 in each of the 6 layers
    assert ops["Pad"] == was["Pad"] - 6 * 6 + 6 * 2
    assert len(after.graph.node) <= len(before.graph.node) - 450
    _same_outputs(before, after)
    # near 2t - 1 = 256 relative positions the old product's sum was split in blocks: a rounding
    ids = np.random.default_rng(0).integers(1, 100, (1, 128))
    feeds = {
        "input": ids,
        "input_lengths": np.array([128]),
        "scales": np.array([0.667, 1.0, 0.8], np.float32),
        "seed": np.array(1),
    }
    (z_want, w_want), (z_got, w_got) = (_session(g).run(None, feeds) for g in (before, after))
    np.testing.assert_allclose(z_got, z_want, rtol=0, atol=1e-5)
    np.testing.assert_array_equal(w_got, w_want)


def test_the_splines_take_fewer_nodes_to_the_same_floats(monkeypatch: pytest.MonkeyPatch) -> None:
    before, after = _prior(monkeypatch, *REWRITES), _prior(monkeypatch, "fuse_relative_attention")
    ops = ops_of(after)
    assert ops["ScatterND"] == ops["NonZero"] == ops["GatherND"] == 0
    assert len(after.graph.node) <= len(before.graph.node) - 700
    _same_outputs(before, after)


def test_the_prior_as_loaded_has_both(monkeypatch: pytest.MonkeyPatch) -> None:
    prior = _prior(monkeypatch)
    assert len(prior.graph.node) <= 1100  # 2 330 as exported, LayerNorms fused
    assert fuse_relative_attention(prior) == fuse_splines(prior) == 0  # nothing left to do


def test_a_layer_that_is_not_piper_attention_is_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    prior = _prior(monkeypatch, *REWRITES)
    softmax = next(n for n in prior.graph.node if n.op_type == "Softmax")
    assert "/attn_layers.0/" in softmax.name
    softmax.op_type = "LogSoftmax"  # no longer Piper's attention: its layer must stay as it is
    assert fuse_relative_attention(prior) == 5
    producers = {o: n.name for n in prior.graph.node for o in n.output}
    inputs = {
        n.name.split("/")[3]: producers[n.input[0]]
        for n in prior.graph.node
        if n.name.endswith("/conv_o/Conv")
    }
    assert inputs["attn_layers.0"].startswith("/enc_p/encoder/attn_layers.0/")
    assert inputs["attn_layers.1"].startswith("/speakd_relpos/layer")
    assert any(n.op_type == "LogSoftmax" for n in prior.graph.node)


def test_a_spline_with_another_bound_is_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """Another tail bound is another spline than the one the rewrite writes."""
    prior = _prior(monkeypatch, *REWRITES)
    low = next(n for n in prior.graph.node if n.op_type == "LessOrEqual")
    prior.graph.initializer.append(onnx.numpy_helper.from_array(np.array(4.0, np.float32), "b4"))
    low.input[1] = "b4"  # one flow's x <= B
    assert fuse_splines(prior) == 2
    assert ops_of(prior)["ScatterND"] == 10
