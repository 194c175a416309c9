"""Turns ``[engine]`` config into a voice and a loaded engine, through the kinds in
``speakd.engines.registry``.

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
from typing import TYPE_CHECKING, Any

from speakd.engines.base import Engine, EngineError, VoiceModel
from speakd.engines.bundle import INT8_SUFFIX, BundleError, load_bundle
from speakd.engines.registry import kind_of
from speakd.machine.memory import trim_heap
from speakd.machine.priority import run_lowered

if TYPE_CHECKING:
    from speakd.config import EngineConfig

log = logging.getLogger(__name__)


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


def describe_engine(config: EngineConfig) -> VoiceModel:
    """The ``[engine]`` voice, read without loading its model (``resolve_bundle`` picks it)."""
    kind = kind_of(config.kind)
    bundle = resolve_bundle(config)
    if bundle is not None:
        return accelerate(kind.describe(bundle), config)
    if kind.embedded is None:
        raise EngineError(f"engine.bundle: kind {kind.name!r} needs a bundle path")
    return accelerate(kind.embedded(), config)


def _manifest(bundle: Path | None) -> dict[str, Any] | None:
    if bundle is None or not (bundle / "manifest.json").is_file():
        return None  # a bare Piper voice or the embedded one: no bundle, no .rknn graphs
    try:
        return load_bundle(bundle, verify=False).manifest
    except BundleError:
        return None  # the voice's own loader names the problem


def accelerate(voice: VoiceModel, config: EngineConfig) -> VoiceModel:
    """``engine.accelerator`` (speakd.machine.npu): a voice whose bundle has ``.rknn`` graphs that
    this board's NPU can run gets an NPU plan, and its own bundle id and precision, since NPU audio
    is another precision; otherwise one log line says why the CPU runs it."""
    from speakd.machine.npu import plan_for

    bundle = getattr(voice, "bundle_dir", None)
    plan = plan_for(config.accelerator, bundle, _manifest(bundle))
    if plan is not None:
        voice.npu = plan  # type: ignore[attr-defined]  (VitsVoice, ChatTTSVoice)
        voice.bundle_id = f"{voice.bundle_id}+{plan.tag}"
        voice.precision = f"{voice.precision}+npu-{plan.precision}"
    return voice


def load_model(voice: VoiceModel, config: EngineConfig) -> Engine:
    """A voice's model in memory; raises BundleError/EngineError with a clear message."""
    t0 = time.monotonic()
    engine = run_lowered(lambda: _build(voice, config), config.nice)  # its pools start lowered
    trim_heap()  # the load's transient copies of the graph
    log.info(
        "engine %s loaded in %.2f s: bundle %s, precision %s, %d Hz",
        engine.kind,
        time.monotonic() - t0,
        engine.bundle_id,
        engine.precision,
        engine.sample_rate,
    )
    return engine


def _build(voice: VoiceModel, config: EngineConfig) -> Engine:
    engine = kind_of(voice.kind).load(voice, config)
    plan = getattr(voice, "npu", None)
    if plan is not None:
        from speakd.engines.rknn_session import open_sessions

        sessions = open_sessions(plan.bundle, plan.section, plan.precision)
        engine.use_npu(sessions, voice)  # type: ignore[attr-defined]  (VitsEngine, ChatTTSEngine)
    return engine


def load_engine(config: EngineConfig) -> Engine:
    """Load the ``[engine]`` model once; raises BundleError/EngineError with a clear message."""
    return load_model(describe_engine(config), config)
