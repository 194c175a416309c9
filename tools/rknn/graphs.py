"""Which graphs of a bundle go to the RK3588's NPU, at which fixed window, and which stay on the
CPU and why; and the windowing that runs a sentence of any length through a fixed-shape graph.

An RKNN graph has one input shape, fixed at conversion, and no data-dependent sizes. So only the
convolutional vocoders convert: they map a [1, C, W] window of frames to W·scale output frames,
and a sentence is cut into overlapping windows whose centres are stitched back: the daemon's own
``plan``, ``windows`` and ``stitch`` (daemon/engines/rknn_session.py), which the board runs too.
Each window carries ``context`` frames of its neighbours on both sides.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import onnx
from onnx import utils as onnx_utils

VITS_DECODER_PREFIX = "/dec/"  # Piper's export names the HiFi-GAN decoder's nodes /dec/...

CPU_ONLY = {
    "vits": {
        "text encoder, duration predictor, flow": (
            "their lengths follow the predicted durations (NonZero, CumSum, Range build the "
            "alignment at run time) and speakd's seeded noise is uint64 arithmetic; an RKNN "
            "graph has fixed shapes and no uint64"
        ),
    },
    "chattts": {
        "gpt.onnx": (
            "the decode loop: one step per 21 ms of audio with a KV cache that grows every step "
            "(GroupQueryAttention over a dynamic past) and sampling between steps; an RKNN graph "
            "has fixed shapes, and the step is bound by memory bandwidth, not by compute"
        ),
    },
}


@dataclass(frozen=True)
class NpuGraph:
    """One graph converted for the NPU: ``onnx`` is what both onnxruntime and the toolkit run."""

    name: str
    onnx: Path
    input: str
    outputs: tuple[str, ...]
    channels: int
    window: int  # input frames per NPU call: the fixed shape
    context: int  # frames of neighbour context on each side when a sentence is stitched
    source: dict = field(default_factory=dict)  # where it comes from in the bundle

    @property
    def shape(self) -> list[int]:
        return [1, self.channels, self.window]


def cut_vits_decoder(model_path: Path, out: Path) -> tuple[str, str]:
    """Write Piper's HiFi-GAN decoder (the ``/dec/`` nodes and the voice's final ``Unsqueeze``)
    as a graph of its own; return its input (the flow's output times the mask, ``z``,
    [1, 192, frames]) and output (the voice's own output, so the graph can stand in for the
    decoder part of daemon/engines/vits/split.py). Refuses a decoder with more than one outside
    input (a multi-speaker voice's speaker conditioning), which would need a second fixed input."""
    model = onnx.load(str(model_path))
    nodes = [n for n in model.graph.node if n.name.startswith(VITS_DECODER_PREFIX)]
    if not nodes:
        raise ValueError(f"{model_path}: no {VITS_DECODER_PREFIX} nodes (not a Piper VITS graph?)")
    produced = {o for n in nodes for o in n.output}
    known = produced | {i.name for i in model.graph.initializer}
    outside = sorted({i for n in nodes for i in n.input if i and i not in known})
    (output,) = [o.name for o in model.graph.output]
    if len(outside) != 1:
        raise ValueError(
            f"{model_path}: the decoder takes {outside}; only a single-speaker decoder (one "
            "input, z) is converted"
        )
    decoder = onnx_utils.Extractor(model).extract_model(outside, [output])
    if [i.name for i in decoder.graph.input] != outside:
        raise ValueError(f"{model_path}: {output} needs more than the decoder's input {outside}")
    onnx.save(decoder, str(out))
    return outside[0], output
