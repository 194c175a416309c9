"""speakd: an offline speech daemon for small boards (device runtime, import name ``speakd``).

The library API (docs/api.md): ``from speakd import load_engine, SynthesisConfig, AudioChunk``.
Its names load on first use, so ``import speakd`` (and the CLI) stays light.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"
__all__ = ["AudioChunk", "LoadedEngine", "SynthesisConfig", "__version__", "load_engine"]


def __getattr__(name: str) -> Any:
    if name in ("AudioChunk", "LoadedEngine", "SynthesisConfig", "load_engine"):
        from speakd.library import api

        return getattr(api, name)
    raise AttributeError(f"module 'speakd' has no attribute {name!r}")
