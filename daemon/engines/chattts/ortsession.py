"""The one place ChatTTS's onnxruntime sessions are configured (STYLE.md habit 3).

The GPT, Decoder and Vocos sessions run one after another on the same cores, so they share one
process-wide intra-op pool instead of three: with a pool each, the pool that just ran keeps
spinning for a while and takes cycles from the next session's threads (measured in
docs/benchmarks.md, "Where the time goes").
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import onnxruntime as ort
from onnxruntime.capi import _pybind_state

log = logging.getLogger(__name__)

_pool_lock = threading.Lock()
_pool_threads: int | None = None  # size of the shared pool once created


def _shared_pool(threads: int) -> bool:
    """Create the shared pool on first use; False if it exists with another size."""
    global _pool_threads
    with _pool_lock:
        if _pool_threads is None:
            _pybind_state.set_global_thread_pool_sizes(threads, 1)
            _pool_threads = threads
        return _pool_threads == threads


def make_session(path: Path, threads: int) -> ort.InferenceSession:
    """CPU session: ``threads`` intra-op (= physical cores is best, GPT-RUNTIME.md) from the
    shared pool, sequential execution, all graph optimisations, spinning left on (off costs
    20–30 %). A second engine asking for another thread count gets a pool of its own."""
    opts = ort.SessionOptions()
    if _shared_pool(threads):
        opts.use_per_session_threads = False
    else:
        log.info("%s: %d threads differs from the shared pool's %d: own pool", path.name,
                 threads, _pool_threads)  # fmt: skip
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.log_severity_level = 3
    return ort.InferenceSession(str(path), sess_options=opts, providers=["CPUExecutionProvider"])
