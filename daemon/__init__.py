"""speakd: an offline speech daemon for small boards (device runtime, import name ``speakd``).

The library API (docs/api.md): ``from speakd import load_engine, SynthesisConfig, AudioChunk``.
Its names load on first use, so ``import speakd`` (and the CLI) stays light.
"""

from __future__ import annotations

import os
from typing import Any

# onnxruntime's telemetry (Linux wheels since 1.2x) keeps a device id and an event database in
# ~/.cache/Microsoft/DeveloperTools/.onnxruntime/ from the moment it is imported: outside speakd's
# directories, in the home of whoever runs it, for an offline daemon with nothing to report. Off
# before any module of this package imports it; ORT_DISABLE_TELEMETRY=0 turns it back on.
os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")

__version__ = "0.1.0"
__all__ = ["AudioChunk", "LoadedEngine", "SynthesisConfig", "__version__", "load_engine"]


def __getattr__(name: str) -> Any:
    if name in ("AudioChunk", "LoadedEngine", "SynthesisConfig", "load_engine"):
        from speakd.library import api

        return getattr(api, name)
    raise AttributeError(f"module 'speakd' has no attribute {name!r}")
