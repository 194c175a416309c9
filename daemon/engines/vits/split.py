"""A Piper voice's graph in three parts, so its audio streams as the decoder makes it.

Piper's VITS graph turns phoneme ids into the whole sentence's samples in one run. Split once at
load, it becomes:

* **prior**: text encoder, duration predictor, alignment and the prior noise. The attention sees
  the whole sentence, so it runs once per sentence. Outputs the latent frames ``z_p`` and the
  frames per phoneme id (``durations``, Piper's ``w_ceil``), which word timings build on.
* **flow**: the reverse normalising flow, ``z_p`` → ``z``; convolutions along time only.
* **decoder**: HiFi-GAN, ``z`` → ``hop`` samples per frame; convolutions along time only.

The flow and the decoder run over overlapping windows of frames (``WindowPlan``). Each window is
widened by its graph's receptive field (``reach``, read from the convolutions in the graph), so
every kept sample sees exactly the frames the one-shot run gives it, and the windows join into the
one-shot audio. What remains is rounding: onnxruntime's SGEMM blocks its sums by matrix size, so a
short window can differ from the one-shot run in the last bits of a float (docs/vits-engine.md).
"""

from __future__ import annotations

import logging
import math
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
from onnx import numpy_helper
from onnx.utils import Extractor

from speakd.engines.base import EngineError
from speakd.engines.ortsession import release_freed_heap
from speakd.engines.spans import span
from speakd.engines.vits.coupling import simplify_flow
from speakd.engines.vits.nchwc import conv1d_as_2d
from speakd.engines.vits.upsample import polyphase_upsamplers

log = logging.getLogger(__name__)

SPEAKER_INPUT = "sid"  # multi-speaker voices: the flow and the decoder are conditioned on it too
# Ops that act on each time step alone (per element, or across channels at one step).
_LOCAL_OPS = {
    "Add",
    "Sub",
    "Mul",
    "Div",
    "Neg",
    "Exp",
    "Sqrt",
    "Pow",
    "Tanh",
    "Sigmoid",
    "Relu",
    "LeakyRelu",
    "Erf",
    "Cast",
    "Identity",
    "QuantizeLinear",  # static quantization: constant scales
    "DequantizeLinear",
}
_CHANNEL_OPS = {"Split", "Slice", "Concat"}  # allowed when they cut or join along channels (axis 1)
_SHAPE_OPS = {"Shape", "ConstantOfShape"}  # their outputs carry no samples


@dataclass(frozen=True)
class Reach:
    """How many input frames an output sample looks back (``left``) and ahead (``right``), and
    how many output samples each input frame becomes (``hop``)."""

    left: int
    right: int
    hop: int


def reach(graph: onnx.GraphProto, source: str) -> Reach:
    """The receptive field of ``graph``'s output in frames of its input ``source`` ([1, C, T]).

    Walks the nodes in order, carrying for each tensor that depends on ``source`` how far it
    reaches back and ahead (in source frames) and its time resolution: convolutions add their
    reach, transposed convolutions multiply the resolution, per-step ops take the widest of their
    inputs. Raises ValueError on any op that could mix time steps in another way (attention,
    pooling, a slice along time, dynamic quantization's whole-tensor scale): such a graph cannot be
    windowed exactly.
    """
    constants = {i.name: numpy_helper.to_array(i) for i in graph.initializer}
    span: dict[str, tuple[Fraction, Fraction, int]] = {source: (Fraction(0), Fraction(0), 1)}
    outputs = {o.name for o in graph.output}
    for node in graph.node:
        ins = [span[i] for i in node.input if i in span]
        if not ins or node.op_type in _SHAPE_OPS:
            continue
        rates = {rate for _, _, rate in ins}
        if len(rates) != 1:
            raise ValueError(f"node {node.name!r} joins tensors of different time resolutions")
        left, right, rate = max(s[0] for s in ins), max(s[1] for s in ins), rates.pop()
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        if node.op_type == "Conv":
            k, d, (pad_l, pad_r) = _conv_shape(node, attrs)
            if attrs.get("strides", [1]) != [1] or pad_l + pad_r != d * (k - 1):
                raise ValueError(f"node {node.name!r}: a Conv that changes the length")
            left += Fraction(pad_l, rate)
            right += Fraction(d * (k - 1) - pad_l, rate)
        elif node.op_type == "ConvTranspose":
            k, d, (pad_l, pad_r) = _conv_shape(node, attrs)
            (stride,) = attrs.get("strides", [1])
            if d != 1 or k - pad_l - pad_r != stride or any(attrs.get("output_padding", [])):
                raise ValueError(f"node {node.name!r}: a ConvTranspose that is not an upsampler")
            rate *= stride
            left += Fraction(k - 1 - pad_l, rate)
            right += Fraction(pad_l, rate)
        elif node.op_type in _CHANNEL_OPS:
            if _axes(node, attrs, constants) != [1]:
                raise ValueError(f"node {node.name!r}: {node.op_type} along time")
        elif node.op_type == "Unsqueeze" and set(node.output) <= outputs:
            pass  # the output's extra axis: the graph ends here
        elif node.op_type not in _LOCAL_OPS:
            raise ValueError(f"node {node.name!r}: {node.op_type} may mix time steps")
        for out in node.output:
            span[out] = (left, right, rate)
    (out,) = outputs
    if out not in span:
        raise ValueError(f"output {out!r} does not depend on {source!r}")
    left, right, rate = span[out]
    return Reach(math.ceil(left), math.ceil(right), rate)


def _conv_shape(node: onnx.NodeProto, attrs: dict) -> tuple[int, int, list[int]]:
    if attrs.get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET"):
        raise ValueError(f"node {node.name!r}: auto_pad is not supported")
    (k,) = attrs["kernel_shape"]
    (d,) = attrs.get("dilations", [1])
    return k, d, list(attrs.get("pads", [0, 0]))


def _axes(node: onnx.NodeProto, attrs: dict, constants: dict[str, np.ndarray]) -> list[int]:
    if node.op_type != "Slice":
        return [int(attrs.get("axis", 0))]
    if len(node.input) < 4 or node.input[3] not in constants:
        return []  # default or computed axes: not provably channels
    return [int(a) for a in constants[node.input[3]].reshape(-1)]


@dataclass(frozen=True)
class WindowPlan:
    """Output windows in frames: a small first one (first audio soon), then each ``growth``
    times the last, up to ``largest``. Larger windows recompute less overlap but grow the
    decoder's arena further (docs/vits-engine.md has the figures)."""

    first: int = 12  # 139 ms of audio: its decoder run is a third of 32 frames' (issue 45)
    growth: int = 2
    largest: int = 256

    @classmethod
    def one_shot(cls) -> WindowPlan:
        """One window over the whole sentence: the unsplit graph's computation."""
        return cls(first=sys.maxsize, growth=1, largest=sys.maxsize)

    def windows(self, frames: int, start: int = 0) -> Iterator[tuple[int, int]]:
        """[start, end) per window from frame ``start``; a remainder shorter than ``first``
        joins the window before it (each window costs the decoder's overlap again, and a
        sentence under ``2·first`` frames is one window)."""
        size = self.first
        while start < frames:
            end = min(frames, start + size)
            if frames - end < self.first:
                end = frames
            yield start, end
            start, size = end, min(self.largest, size * self.growth)


@dataclass(frozen=True)
class Latents:
    """One sentence after the prior: what the flow and decoder turn into audio."""

    z_p: np.ndarray  # (1, channels, frames)
    durations: np.ndarray  # frames per phoneme id (Piper's w_ceil), for word timings


@dataclass(frozen=True)
class Window:
    """A window of a sentence's audio, and the samples of each of the sentence's phoneme ids
    (None when the graph runs whole: it does not say); ``skipped``: the sentence's samples
    before the first window (its leading silence when trimmed: ``lead_frames``, ``onset``)."""

    audio: np.ndarray
    id_samples: np.ndarray | None
    skipped: int = 0


def lead_frames(durations: np.ndarray) -> int:
    """The frames a sentence may start later: all of Piper's start-of-sentence id ``^`` (its
    first id) but the last frame, where the first sound begins to rise (the decoder spreads a
    frame's sound into the one before). Before it Piper's voice is at its floor, near −85 dBFS:
    40–80 ms of silence ahead of every line, and the skipped frames are never decoded."""
    return max(0, int(durations[0]) - 1) if durations.size else 0


# A sentence's first sound: its first sample at ONSET_LEVEL (−60 dBFS; Piper's voice floor is near
# −85) within the first ONSET_SEARCH samples after the skipped frames, less ONSET_MARGIN samples.
# The search stays inside the shortest first window (``WindowPlan.first`` frames), so streamed and
# one-shot runs cut at the same sample.
ONSET_LEVEL = 0.001
ONSET_SEARCH = 2048
ONSET_MARGIN = 48


def onset(audio: np.ndarray) -> int:
    """Samples of near-silence ahead of the first sound (0 when none is found in the search):
    the rest of the leading silence ``lead_frames`` leaves, 0–50 ms of a line (issue 45)."""
    loud = np.flatnonzero(np.abs(audio[:ONSET_SEARCH]) >= ONSET_LEVEL)
    return max(0, int(loud[0]) - ONSET_MARGIN) if loud.size else 0


@dataclass(frozen=True)
class Joints:
    """The tensors where the three graphs meet."""

    z_p: str  # the prior's output, the flow's input
    durations: str  # the prior's other output
    mask: str  # the flow's y_mask input: ones for one unpadded sentence
    z: str  # the decoder's input (the flow's output · y_mask)


@dataclass(frozen=True)
class VoiceParts:
    prior: onnx.ModelProto
    flow: onnx.ModelProto
    decoder: onnx.ModelProto
    joints: Joints


def split_voice(model: onnx.ModelProto) -> VoiceParts:
    """Cut Piper's graph where VITS's ``infer`` hands tensors between its modules.

    Found by the module scopes torch's exporter writes into node names (``/flow/…``, ``/dec/…``)
    and Piper's ``infer``: the flow's first node reads ``z_p``; its last node's output is
    multiplied by ``y_mask`` and fed to the decoder; ``w_ceil`` is the one top-level ``Ceil``.
    Raises ValueError when the graph does not look like that.
    """
    nodes = list(model.graph.node)
    flow = [n for n in nodes if n.name.startswith("/flow/")]
    ceil = [n for n in nodes if n.op_type == "Ceil" and n.name.count("/") == 1]
    if not flow or len(ceil) != 1:
        raise ValueError("not Piper's VITS export (no /flow/ nodes or no single top-level Ceil)")
    z_p, flow_out = flow[0].input[0], flow[-1].output[0]
    masking = [n for n in nodes if n.op_type == "Mul" and flow_out in n.input]
    if len(masking) != 1:
        raise ValueError(f"no single y_mask product of the flow's output {flow_out!r}")
    (mask,) = [i for i in masking[0].input if i != flow_out]
    joints = Joints(z_p=z_p, durations=ceil[0].output[0], mask=mask, z=masking[0].output[0])
    _declare(model, [joints.z_p, joints.durations, joints.mask, joints.z, flow_out])
    inputs = [i.name for i in model.graph.input]
    speaker = [SPEAKER_INPUT] if SPEAKER_INPUT in inputs else []
    extractor = Extractor(model)
    flow = extractor.extract_model([z_p, mask, *speaker], [flow_out])
    simplify_flow(flow, z_p, mask)  # the mask: ones, as SplitVoice._run_flow feeds it
    return VoiceParts(
        prior=extractor.extract_model(inputs, [z_p, joints.durations]),
        flow=flow,
        decoder=extractor.extract_model([joints.z, *speaker], [o.name for o in model.graph.output]),
        joints=joints,
    )


def _declare(model: onnx.ModelProto, names: list[str]) -> None:
    """Give the cut tensors the value_info the extracted graphs need for their inputs and
    outputs (torch's export writes it; a graph without it gets it from shape inference)."""
    known = {v.name for v in model.graph.value_info}
    missing = [n for n in names if n not in known]
    if missing:
        inferred = onnx.shape_inference.infer_shapes(model).graph.value_info
        model.graph.value_info.extend(v for v in inferred if v.name in missing)


def voice_sessions(
    load: Callable[[], onnx.ModelProto], options: ort.SessionOptions
) -> SplitVoice | WholeVoice:
    """The voice split for streaming, or whole when its graph cannot be split or windowed (or
    onnxruntime refuses a part: a voice that loads whole never fails for its split). ``load``
    gives the graph: the whole graph is dropped once split, before its parts' sessions are
    built (the load's peak memory), and read again only for the fallback."""
    try:
        voice = SplitVoice(split_voice(load()), options)
        release_freed_heap()  # the graph and its parts, dropped now
        return voice
    except EngineError:  # the graph itself (unreadable, wrong inputs): no fallback helps
        raise
    except Exception as e:  # ValueError from split_voice/reach, onnxruntime's own on a part
        log.warning("vits graph runs whole, one run per sentence: %s", e)
        return WholeVoice(_session(load(), options))


class WholeVoice:
    """The unsplit graph, one run per sentence: a voice whose graph ``split_voice`` or ``reach``
    refuses (not Piper's export, or ops that mix time steps)."""

    def __init__(self, session: ort.InferenceSession) -> None:
        self.entry = session  # the session fed with the voice's own inputs
        self._output = session.get_outputs()[0].name

    def render(
        self, feeds: dict[str, np.ndarray], run: ort.RunOptions, trim: bool = False
    ) -> Iterator[Window]:
        """The sentence in one run; ``trim`` is ignored (the whole graph gives no durations)."""
        with span("whole graph"):
            audio = self.entry.run([self._output], feeds, run)[0].reshape(-1)
        yield Window(audio, None)


class SplitVoice:
    """Prior, flow and decoder sessions; ``render`` yields a sentence's audio window by window."""

    def __init__(
        self, parts: VoiceParts, options: ort.SessionOptions, plan: WindowPlan | None = None
    ) -> None:
        self.joints = parts.joints
        self.flow_reach = reach(parts.flow.graph, self.joints.z_p)
        self.decoder_reach = reach(parts.decoder.graph, self.joints.z)
        if self.flow_reach.hop != 1:
            raise ValueError(f"the flow changes the frame rate ({self.flow_reach.hop})")
        self.plan = plan or WindowPlan()
        conv1d_as_2d(parts.flow, self.joints.z_p)  # after the reaches, which read 1-d convs
        self._decoder = _session(session_decoder(parts.decoder), options)
        self._flow = _session(parts.flow, options)
        self.entry = _session(parts.prior, options)  # the session fed with the voice's own inputs
        self._flow_out = self._flow.get_outputs()[0].name
        self._flow_mask = any(i.name == self.joints.mask for i in self._flow.get_inputs())
        self._decoder_out = self._decoder.get_outputs()[0].name

    def use_decoder(self, session: Any) -> None:
        """Another runner of the decoder graph with onnxruntime's ``run`` (the NPU's
        ``speakd.engines.rknn_session.RknnSession``): same input ``z``, same output."""
        self._decoder = session

    def render(
        self, feeds: dict[str, np.ndarray], run: ort.RunOptions, trim: bool = False
    ) -> Iterator[Window]:
        """The sentence window by window; ``trim``: without its leading silence (``lead_frames``,
        then ``onset``), which ``skipped`` counts."""
        latents = self.prior(feeds, run)
        speaker = {k: v for k, v in feeds.items() if k == SPEAKER_INPUT}
        id_samples = latents.durations.astype(np.int64) * self.decoder_reach.hop
        skip = lead_frames(latents.durations) if trim else 0
        skipped = skip * self.decoder_reach.hop
        for audio in self.audio(latents, speaker, run, skip):
            if trim:  # the first window: from its first sound on
                quiet, trim = onset(audio), False
                audio, skipped = audio[quiet:], skipped + quiet
            yield Window(audio, id_samples, skipped)

    def prior(self, feeds: dict[str, np.ndarray], run: ort.RunOptions) -> Latents:
        with span("prior"):  # text encoder, duration predictor, alignment, prior noise
            z_p, durations = self.entry.run([self.joints.z_p, self.joints.durations], feeds, run)
        return Latents(z_p, durations.reshape(-1))

    def audio(
        self,
        latents: Latents,
        speaker: dict[str, np.ndarray],
        run: ort.RunOptions,
        skip: int = 0,
    ) -> Iterator[np.ndarray]:
        """The samples of each window of ``plan`` from frame ``skip`` on; z is made by the flow
        just ahead of need and kept, so no frame goes through the flow twice except in its
        overlap."""
        z_p = latents.z_p
        frames = z_p.shape[2]
        z = np.empty_like(z_p)
        dec, hop = self.decoder_reach, self.decoder_reach.hop
        made = max(0, skip - dec.left)  # z is final on frames [first needed, made)
        for start, end in self.plan.windows(frames, min(skip, frames)):
            lo, hi = max(0, start - dec.left), min(frames, end + dec.right)
            if made < hi:
                z[:, :, made:hi] = self._run_flow(z_p, made, hi, speaker, run)
                made = hi
            feeds = {self.joints.z: np.ascontiguousarray(z[:, :, lo:hi]), **speaker}
            with span("decoder"):
                audio = self._decoder.run([self._decoder_out], feeds, run)[0].reshape(-1)
            if audio.size != (hi - lo) * hop:
                raise ValueError(f"the decoder made {audio.size} samples for {hi - lo} frames")
            yield audio[(start - lo) * hop : (end - lo) * hop]

    def _run_flow(
        self,
        z_p: np.ndarray,
        start: int,
        end: int,
        speaker: dict[str, np.ndarray],
        run: ort.RunOptions,
    ) -> np.ndarray:
        """z on frames [start, end), from z_p widened by the flow's reach."""
        flow = self.flow_reach
        lo, hi = max(0, start - flow.left), min(z_p.shape[2], end + flow.right)
        feeds = {self.joints.z_p: np.ascontiguousarray(z_p[:, :, lo:hi]), **speaker}
        if self._flow_mask:  # simplify_flow drops it when it only multiplied
            feeds[self.joints.mask] = np.ones((1, 1, hi - lo), np.float32)
        with span("flow"):
            out = self._flow.run([self._flow_out], feeds, run)[0]
        return out[:, :, start - lo : end - lo]


def session_decoder(decoder: onnx.ModelProto) -> onnx.ModelProto:
    """The decoder as its session runs it, upsamplers as polyphase convolutions: a copy (6 MB for
    Piper's medium voices), so the split graph stays the one ``reach`` reads."""
    graph = onnx.ModelProto()
    graph.CopyFrom(decoder)
    polyphase_upsamplers(graph)  # reshapes and slices along time
    return graph


def _session(model: onnx.ModelProto, options: ort.SessionOptions) -> ort.InferenceSession:
    """A session read from a file: given bytes, onnxruntime's Python session keeps them for as
    long as it lives (``_model_bytes``), a second copy of the weights in every process
    (docs/vits-engine.md, "Threads and memory")."""
    with tempfile.TemporaryDirectory(prefix="speakd-vits-") as tmp:
        path = Path(tmp) / "part.onnx"
        path.write_bytes(model.SerializeToString())
        session = ort.InferenceSession(
            str(path), sess_options=options, providers=["CPUExecutionProvider"]
        )
    release_freed_heap()  # what the session's build copied and freed, before the next one's
    return session
