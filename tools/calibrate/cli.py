"""The ``calibrate`` subcommand of ``speakd-tools`` (registered by ``speakd_tools.cli``)."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path


def add_parser(sub: argparse._SubParsersAction) -> None:
    c = sub.add_parser(
        "calibrate",
        help="quantize a bundle (ChatTTS or Piper VITS) with a recipe and the corpus; "
        "writes a bundle + quality report",
    )
    c.add_argument(
        "--bundle",
        required=True,
        help="float bundle folder, a Piper voice .onnx, or 'embedded' (the joe voice)",
    )
    c.add_argument("--out", required=True, help="output bundle folder, e.g. models/chattts-int8")
    c.add_argument("--recipe", help="recipe TOML (default: calibration/recipes/<engine>.toml)")
    c.add_argument(
        "--mode",
        help="a mode of the recipe (chattts: static|dynamic|int4|rows; vits: static|static_all|"
        "dynamic|weight_only|weight_only_tail), or 'auto' = build all, keep the fastest "
        "within bounds (default: the recipe's default_mode)",
    )
    c.add_argument(
        "--method",
        choices=["minmax", "entropy", "percentile"],
        help="static calibration ranges (default: the recipe's)",
    )
    c.add_argument("--limit", type=int, help="calibration sentences (default: the recipe's)")
    c.add_argument(
        "--eval",
        type=int,
        dest="eval_sentences",
        help="evaluation sentences for the report (default: the recipe's)",
    )
    c.add_argument(
        "--asr",
        type=int,
        dest="asr_sentences",
        help="VITS: sentences for the Whisper round trip; 0 = off (default: recipe's)",
    )
    c.add_argument("--corpus", help="folder with <lang>.txt (default: calibration/corpus)")
    c.add_argument("--threads", type=int, default=2, help="onnxruntime threads (default 2)")
    c.set_defaults(func=run)


def _quiet_ort(record: logging.LogRecord) -> bool:
    """onnxruntime.quantization logs per-tensor chatter at INFO on the root logger."""
    return record.name != "root" or record.levelno >= logging.WARNING


def run(args: argparse.Namespace) -> int:
    from . import CalibrationError
    from .base import CalibrateOptions
    from .pipeline import calibrate

    for handler in logging.getLogger().handlers:
        handler.addFilter(_quiet_ort)

    opts = CalibrateOptions(
        bundle=args.bundle,
        out=Path(args.out),
        recipe=Path(args.recipe) if args.recipe else None,
        mode=args.mode,
        method=args.method,
        limit=args.limit,
        eval_sentences=args.eval_sentences,
        asr_sentences=args.asr_sentences,
        corpus=Path(args.corpus) if args.corpus else None,
        threads=args.threads,
    )
    try:
        result = calibrate(opts)
    except CalibrationError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    r = result.report
    print(
        f"bundle {result.bundle} ({result.manifest['precision']}, mode {r['winner']}); "
        f"report {result.bundle / 'report' / 'report.md'}"
    )
    print(r["why"])
    if not result.within_bounds:
        print("warning: the bundle misses a quality bound (see the report)", file=sys.stderr)
    return 0
