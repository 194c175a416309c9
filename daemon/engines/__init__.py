"""Engine registry: turns ``[engine]`` config into a loaded engine.

Which bundle loads (``resolve_bundle``): with ``engine.precision = "int8"`` (the default) and
``engine.bundle = models/chattts``, a calibrated sibling ``models/chattts-int8`` (made by
``speakd-tools calibrate --out models/chattts-int8``) is loaded instead when its ``manifest.json``
exists; ``engine.precision = "exact"`` loads exactly ``engine.bundle``. One rule, one place:
the loader and ``speakd doctor`` both call it.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from speakd.config import EngineConfig
from speakd.engines.base import Engine, EngineError

log = logging.getLogger(__name__)

INT8_SUFFIX = "-int8"


def resolve_bundle(config: EngineConfig) -> Path | None:
    """The bundle folder to load; None = the embedded voice. Prefers ``<bundle>-int8``."""
    if not config.bundle:
        return None
    path = Path(config.bundle)
    if config.precision == "exact" or path.name.endswith(INT8_SUFFIX):
        return path
    sibling = path.with_name(path.name + INT8_SUFFIX)
    if (sibling / "manifest.json").is_file():
        log.info("engine.bundle %s: loading its calibrated sibling %s", path, sibling)
        return sibling
    return path


def load_engine(config: EngineConfig) -> Engine:
    """Load the configured model once; raises BundleError/EngineError with a clear message."""
    t0 = time.monotonic()
    engine: Engine
    bundle = resolve_bundle(config)
    if config.kind == "vits":
        from speakd.engines.vits import VitsEngine

        if bundle is not None:
            engine = VitsEngine.from_bundle(bundle, threads=config.threads)
        else:
            engine = VitsEngine.embedded(threads=config.threads)
    elif config.kind == "chattts":
        from speakd.engines.chattts.engine import ChatTTSEngine

        engine = ChatTTSEngine.load(
            bundle, threads=config.threads, batch_size=config.batch_size, paced=config.paced
        )
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
