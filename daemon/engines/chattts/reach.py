"""How far the Decoder and Vocos look along time: their receptive field, read from the graphs.

Both graphs are stacks of same-length 1-D convolutions (kernel k, dilation d, padding p on each
side) joined by per-frame ops (LayerNorm, the ConvNeXt Linears, GELU, residual adds). A chain of
such convolutions sees ``sum(p)`` input frames back and ``sum(d·(k − 1) − p)`` ahead; a residual
branch around one sees less, so the sum is the field. The Decoder turns each hidden state into
``frames_per_step`` mel frames before its first convolution, so its field is counted in mel
frames; the ISTFT adds ``n_fft / hop / 2`` frames each side (a sample is the sum of the frames
whose window covers it). Full-size ChatTTS: Decoder ±75, Vocos ±27, ISTFT ±2 = ±104 frames = ±52
steps; the tiny test checkpoint: ±15, ±9, ±2 = ±13 steps.

A chunk rendered with this many steps of context on each side equals the one-shot waveform up to
float rounding (``StreamSchedule.exact``), for float graphs. Dynamically quantized graphs (the
int4 bundle's int8 MatMuls) scale activations by the range of the whole window, so no context
makes them equal their one-shot pass (docs/chattts-engine.md, "Streaming schedule").
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import onnx

from speakd.engines.chattts.vocoder import HOP, N_FFT


@dataclass(frozen=True)
class Reach:
    """Receptive field in mel frames, each side, of the Decoder, the Vocos and the ISTFT."""

    decoder: int
    vocos: int
    istft: int = N_FFT // HOP // 2
    frames_per_step: int = 2

    @property
    def frames(self) -> int:
        return self.decoder + self.vocos + self.istft

    @property
    def steps(self) -> int:
        """Context, in GPT steps, that makes a streamed chunk equal the one-shot waveform."""
        return math.ceil(self.frames / self.frames_per_step)


def conv_reach(graph: onnx.GraphProto) -> int:
    """Frames each side that the graph's output sees of its input: the sum of its Conv nodes'
    reach. Raises ValueError on a convolution that is not same-length and symmetric (a stride,
    a transposed or one-sided convolution would need a real walk of the graph, vits/split.py)."""
    total = 0
    for node in graph.node:
        if node.op_type in ("ConvTranspose", "ConvInteger", "QLinearConv"):
            raise ValueError(f"node {node.name!r}: {node.op_type} is not supported")
        if node.op_type != "Conv":
            continue
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        (k,) = attrs["kernel_shape"]
        (d,) = attrs.get("dilations", [1])
        pad_l, pad_r = attrs.get("pads", [0, 0])
        if attrs.get("strides", [1]) != [1] or pad_l != pad_r or pad_l + pad_r != d * (k - 1):
            raise ValueError(f"node {node.name!r}: not a same-length symmetric convolution")
        total += pad_l
    return total


def bundle_reach(decoder: Path, vocos: Path, frames_per_step: int = 2) -> Reach:
    """The receptive field of a bundle's ``decoder.onnx`` and ``vocos.onnx`` (graphs only: the
    weights are not read)."""
    return Reach(
        decoder=conv_reach(onnx.load(str(decoder), load_external_data=False).graph),
        vocos=conv_reach(onnx.load(str(vocos), load_external_data=False).graph),
        frames_per_step=frames_per_step,
    )
