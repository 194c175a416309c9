"""Engine registry: turns ``[engine]`` config into a loaded engine."""

from __future__ import annotations

import logging
import time
from pathlib import Path

from speakd.config import EngineConfig
from speakd.engines.base import Engine, EngineError

log = logging.getLogger(__name__)


def load_engine(config: EngineConfig) -> Engine:
    """Load the configured model once; raises BundleError/EngineError with a clear message."""
    t0 = time.monotonic()
    engine: Engine
    if config.kind == "vits":
        from speakd.engines.vits import VitsEngine

        if config.bundle:
            engine = VitsEngine.from_bundle(Path(config.bundle), threads=config.threads)
        else:
            engine = VitsEngine.embedded(threads=config.threads)
    elif config.kind == "chattts":
        from speakd.engines.chattts.engine import ChatTTSEngine

        engine = ChatTTSEngine.load(Path(config.bundle), threads=config.threads)
    else:
        raise EngineError(f"engine.kind: unknown engine {config.kind!r}")
    log.info(
        "engine %s loaded in %.2f s: bundle %s, precision %s, %d Hz",
        engine.kind,
        time.monotonic() - t0,
        engine.bundle_id,
        engine.precision,
        engine.sample_rate,
    )
    return engine
