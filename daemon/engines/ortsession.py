"""The one place speakd's onnxruntime sessions are configured, so every session runs alike.

ChatTTS's GPT, Decoder and Vocos, and a Piper voice's prior, flow and decoder, each run one
session after another on the same cores. Each pool spins while its run lasts (a sleeping pool pays
a wake-up at each of its hundreds of nodes) and stops spinning when the run ends
(``session.force_spinning_stop``), so it never takes cycles from the next session's threads or
the Python between runs (sampling, overlap-add, the next window). Measured in
docs/benchmarks-archive.md ("Batched decoding, 2026-12-04 and 05"): against the GPT spinning on
and the Decoder/Vocos not at all, 1.18× the audio per second at one row and 1.02–1.10× at eight;
against no VITS pool spinning, a new line's first chunk 11 % sooner for the same CPU time
(docs/vits-engine.md, "Threads and memory"). A
process-wide ORT pool would share one pool, but ORT then refuses every session with its own pool
in the process (tools, a second engine).
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable
from pathlib import Path

import onnxruntime as ort


def session_options(threads: int, spinning: bool = True) -> ort.SessionOptions:
    """``threads`` intra-op (= physical cores is best, docs/chattts.md), inter-op 1, sequential
    execution, all graph optimisations; ``spinning`` within a run (off costs the GPT 20–30 %),
    never after it."""
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.add_session_config_entry("session.intra_op.allow_spinning", "1" if spinning else "0")
    opts.add_session_config_entry("session.force_spinning_stop", "1")
    opts.log_severity_level = 3
    return opts


def make_session(path: Path, threads: int, spinning: bool = True) -> ort.InferenceSession:
    """A CPU session with :func:`session_options`."""
    return ort.InferenceSession(
        str(path),
        sess_options=session_options(threads, spinning),
        providers=["CPUExecutionProvider"],
    )


def release_freed_heap() -> None:
    """Give back to the system the heap that building sessions freed. Loading copies weights and
    frees the originals (onnxruntime's own layout transforms, speakd's graph rewrites, the graph
    read and dropped), and glibc keeps what is freed in the heap, resident, unless it is trimmed:
    after the embedded Piper voice's load, 185–228 MB resident without, 89 MB after
    (docs/vits-engine.md, "Threads and memory"). A no-op where the C library has no
    ``malloc_trim`` (musl)."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    try:
        return ctypes.CDLL(None).malloc_trim  # the process's own C library
    except (OSError, AttributeError):
        return None
