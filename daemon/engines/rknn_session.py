"""A fixed-shape ``.rknn`` graph behind onnxruntime's ``session.run`` signature, so an engine can
hand it to the code that runs its vocoder on the CPU.

An RKNN graph has one input shape, fixed at conversion ([1, C, W] frames; the bundle's manifest
``rknn`` section records W and the context). ``RknnSession.run`` cuts each row of a [B, C, T]
input into overlapping windows (``plan``, ``windows``), runs them one by one and stitches the
centres back (``stitch``). ``speakd-tools rknn convert`` measures what this costs with the same
functions (tools/rknn/convert.py), so the report's sentence SNR is what the board plays.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from speakd.engines.bundle import BundleError, sha256_file

log = logging.getLogger(__name__)


def plan(frames: int, window: int, context: int) -> list[tuple[int, int, int]]:
    """Where a sentence of ``frames`` frames is cut: (start, keep_from, keep_to) per window, in
    frames. A window keeps its centre, ``context`` frames in from each edge, except at the
    sentence's own ends: the first window starts at frame 0 and the last one ends at the last
    frame, because the graph's convolutions pad a *sentence* edge with zeros at every layer
    (after biases), which zeros in the input cannot imitate. A sentence shorter than a window
    runs twice, once at the window's start and once at its end (zeros fill the rest), and keeps
    the half next to the real edge of each run."""
    if window <= 2 * context:
        raise ValueError(f"window {window} leaves no frame after 2 × {context} of context")
    if frames == window:
        return [(0, 0, frames)]
    if frames < window:
        half = (frames + 1) // 2
        return [(0, 0, half), (frames - window, half, frames)]
    out, start, keep = [], 0, 0
    while start + window < frames:
        end = start + window - context
        out.append((start, keep, end))
        keep, start = end, end - context
    out.append((frames - window, keep, frames))
    return out


def windows(x: np.ndarray, cuts: list[tuple[int, int, int]], window: int) -> np.ndarray:
    """[1, C, T] → [N, C, window], one per cut; zeros where a window reaches past the sentence
    (a short sentence's windows start before frame 0 or end after its last frame)."""
    out = np.zeros((len(cuts), x.shape[1], window), np.float32)
    frames = x.shape[-1]
    for k, (start, _, _) in enumerate(cuts):
        lo, hi = max(start, 0), min(start + window, frames)
        out[k, :, lo - start : hi - start] = x[0, :, lo:hi]
    return out


def stitch(outputs: np.ndarray, cuts: list[tuple[int, int, int]], window: int) -> np.ndarray:
    """The inverse of ``windows`` on a graph's outputs [N, ..., window·scale]: each window's kept
    frames, concatenated along the last axis."""
    scale = outputs.shape[-1] // window
    parts = [
        outputs[k][..., (lo - start) * scale : (hi - start) * scale]
        for k, (start, lo, hi) in enumerate(cuts)
    ]
    return np.concatenate(parts, axis=-1)


class Runtime(Protocol):
    """What ``RknnSession`` needs of rknn-toolkit-lite2's ``RKNNLite`` (or a stand-in)."""

    def inference(self, inputs: list[np.ndarray], data_format: str = ...) -> list[np.ndarray]: ...


class RknnSession:
    """``run(output_names, feeds)`` over a fixed-window graph; rows of a batch run one by one,
    so a row's output never depends on its companions (the vocoders' batch invariance)."""

    def __init__(self, runtime: Runtime, spec: dict[str, Any], name: str = "") -> None:
        self.runtime = runtime
        self.name = name
        self.input: str = spec["input"]
        self.outputs: list[str] = list(spec["outputs"])
        self.window = int(spec["shape"][-1])
        self.context = int(spec["context"])

    def run(self, output_names: Sequence[str] | None, feeds: dict[str, np.ndarray], *_: Any):
        """onnxruntime's ``run``; its run options, if passed, have nothing to act on here."""
        x = np.asarray(feeds[self.input], np.float32)
        rows = [self._row(x[b : b + 1]) for b in range(x.shape[0])]
        wanted = list(output_names or self.outputs)
        return [np.concatenate([r[self.outputs.index(o)] for r in rows]) for o in wanted]

    def _row(self, x: np.ndarray) -> list[np.ndarray]:
        cuts = plan(x.shape[-1], self.window, self.context)
        outs = [self.runtime.inference(inputs=[w[None]], data_format="nchw") for w in
                windows(x, cuts, self.window)]  # fmt: skip
        return [
            stitch(np.stack([np.asarray(o[k], np.float32) for o in outs]), cuts, self.window)
            for k in range(len(self.outputs))
        ]


def verify_rknn_files(bundle_path: Path, section: dict[str, Any]) -> None:
    """Every ``.rknn`` file and the report against the section's sha256, as ``load_bundle`` does
    for the bundle's own files."""
    for name, entry in sorted(section["files"].items()):
        path = bundle_path / name
        if not path.is_file():
            raise BundleError(f"{path}: listed in the manifest's rknn section but missing")
        if sha256_file(path) != entry["sha256"]:
            raise BundleError(f"{path}: sha256 does not match the manifest (corrupt or tampered)")


def open_sessions(
    bundle_path: Path, section: dict[str, Any], precision: str = "fp16"
) -> dict[str, RknnSession]:
    """Load each graph's ``precision`` file through rknn-toolkit-lite2 on the board's NPU."""
    from rknnlite.api import RKNNLite

    verify_rknn_files(bundle_path, section)
    sessions = {}
    for name, spec in section["graphs"].items():
        path = bundle_path / spec["files"][precision]
        runtime = RKNNLite(verbose=False)
        if runtime.load_rknn(str(path)) != 0:
            raise BundleError(f"{path}: rknn-toolkit-lite2 cannot load it")
        if runtime.init_runtime(core_mask=RKNNLite.NPU_CORE_AUTO) != 0:
            raise BundleError(f"{path}: the NPU runtime did not start (driver, permissions?)")
        sessions[name] = RknnSession(runtime, spec, name)
        log.info("npu: %s loaded from %s", name, path)
    return sessions
