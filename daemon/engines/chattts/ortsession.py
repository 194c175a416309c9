"""The one place ChatTTS's onnxruntime sessions are configured (STYLE.md habit 3)."""

from __future__ import annotations

from pathlib import Path

import onnxruntime as ort


def make_session(path: Path, threads: int) -> ort.InferenceSession:
    """CPU session: ``threads`` intra-op (= physical cores is best, GPT-RUNTIME.md), inter-op 1,
    sequential execution, all graph optimisations, spinning left on (off costs 20–30 %)."""
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.log_severity_level = 3
    return ort.InferenceSession(str(path), sess_options=opts, providers=["CPUExecutionProvider"])
