"""A bundle's loudness, measured once on the host and recorded in its manifest (``loudness``),
so a board plays the voice at ``audio.loudness_lufs`` without first spending a synthesis of the
calibration text on it (seconds for ChatTTS on a Pi-class board). Export and calibration call it;
``speakd-tools loudness BUNDLE`` records a bundle made elsewhere. The record names the bundle id
and the calibration text's version, so a stale one is ignored rather than trusted
(``speakd.request.loudness.recorded``)."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any

from speakd.config import EngineConfig
from speakd.engines import load_model
from speakd.engines.base import EngineError
from speakd.engines.bundle import MANIFEST, BundleError, load_bundle
from speakd.engines.registry import kind_of
from speakd.request.loudness import VOICES, record

log = logging.getLogger(__name__)


def record_loudness(bundle_dir: Path, threads: int = 2) -> dict[str, Any]:
    """Measure the bundle's voice over the calibration text and write the record into its
    manifest (the files and so the bundle id are unchanged); the updated manifest."""
    bundle = load_bundle(bundle_dir, verify=False)
    config = EngineConfig(
        kind=bundle.engine, bundle=str(bundle_dir), precision="exact", threads=threads
    )
    engine = load_model(kind_of(bundle.engine).describe(bundle_dir), config)
    entry = record(engine, VOICES.measure(engine))
    manifest = {**bundle.manifest, "loudness": entry}
    (bundle_dir / MANIFEST).write_text(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n")
    log.info("%s: %s LUFS over the calibration text, recorded", bundle_dir, entry["lufs"])
    return manifest


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "loudness",
        help="measure a bundle's voice over the calibration text and record it in its manifest",
    )
    p.add_argument(
        "bundles", nargs="+", metavar="BUNDLE", help="bundle folders, or 'embedded' (printed only)"
    )
    p.add_argument("--threads", type=int, default=2, help="onnxruntime threads (default 2)")
    p.set_defaults(func=cmd_loudness)


def cmd_loudness(args: argparse.Namespace) -> int:
    for name in args.bundles:
        try:
            if name == "embedded":
                engine = load_model(kind_of("vits").embedded(), EngineConfig(threads=args.threads))
                entry = record(engine, VOICES.measure(engine))
            else:
                entry = record_loudness(Path(name), args.threads)["loudness"]
        except (BundleError, EngineError, OSError) as e:
            print(f"loudness: {name}: {e}", file=sys.stderr)
            return 1
        print(f"{name}: {json.dumps(entry)}")
    return 0
