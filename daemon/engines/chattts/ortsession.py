"""The one place ChatTTS's onnxruntime sessions are configured, so every session runs alike.

The GPT, Decoder and Vocos sessions run one after another on the same cores. A pool that keeps
spinning after its run takes cycles from the next session's threads, so only the GPT, which runs
hundreds of times per utterance, spins; the Decoder and Vocos pools sleep as soon as their chunk
is done (measured in docs/benchmarks.md, run 5). A process-wide ORT pool would do the same, but
ORT then refuses every session with its own pool in the process (the VITS fallback voice, tools).
"""

from __future__ import annotations

from pathlib import Path

import onnxruntime as ort


def session_options(threads: int, spinning: bool = True) -> ort.SessionOptions:
    """``threads`` intra-op (= physical cores is best, docs/chattts.md), inter-op 1, sequential
    execution, all graph optimisations; ``spinning`` (off costs the GPT 20–30 %)."""
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.add_session_config_entry("session.intra_op.allow_spinning", "1" if spinning else "0")
    opts.log_severity_level = 3
    return opts


def make_session(path: Path, threads: int, spinning: bool = True) -> ort.InferenceSession:
    """A CPU session with :func:`session_options`."""
    return ort.InferenceSession(
        str(path),
        sess_options=session_options(threads, spinning),
        providers=["CPUExecutionProvider"],
    )
