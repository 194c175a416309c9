"""The embedded voice's relative-position attention rewritten at load (attention.py): some twenty
nodes a layer instead of about a hundred, and the prior's outputs the same floats."""

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
from speakd.engines.vits.split import split_voice
from speakd.engines.vits.text import phonemize

# a menu item, a line, a one-letter key echo and a sentence longer than the window many times
TEXTS = ("Save as", "The door is open.", "a", "Close the window, then open the one behind it.")


def _prior(monkeypatch: pytest.MonkeyPatch, rewritten: bool) -> onnx.ModelProto:
    with monkeypatch.context() as m:
        if not rewritten:
            m.setattr(graph, "fuse_relative_attention", lambda model: 0)
        return split_voice(graph.voice_graph(VitsVoice.embedded())).prior


def test_the_embedded_voice_attends_in_fewer_nodes_to_the_same_floats(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    before, after = _prior(monkeypatch, False), _prior(monkeypatch, True)
    ops = ops_of(after)
    was = ops_of(before)
    assert ops["GatherElements"] - was["GatherElements"] == 12  # 2 in each of the 6 layers
    assert ops["Pad"] == was["Pad"] - 6 * 6 + 6 * 2
    assert len(after.graph.node) <= len(before.graph.node) - 450
    engine = VitsEngine.embedded()
    params = engine._resolve(SynthesisConfig())
    sessions = [
        ort.InferenceSession(g.SerializeToString(), session_options(2), ["CPUExecutionProvider"])
        for g in (before, after)
    ]
    for text in TEXTS:
        (phonemes,) = phonemize(engine.config.espeak_voice, text, engine.config.vowel_clusters)
        feeds = engine._feeds(phonemes, params, 1)
        want, got = (s.run(None, feeds) for s in sessions)
        for w, g in zip(want, got, strict=True):
            np.testing.assert_array_equal(g, w)  # z_p and the frames per id, to the bit


def ops_of(model: onnx.ModelProto) -> collections.Counter[str]:
    return collections.Counter(n.op_type for n in model.graph.node)


def test_a_layer_that_is_not_piper_attention_is_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    prior = _prior(monkeypatch, False)
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
