"""``speakd-tools rknn convert BUNDLE --target rk3588``: arguments → ``convert.convert``."""

from __future__ import annotations

import argparse
from pathlib import Path

TARGETS = ("rk3588",)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("rknn", help="Rockchip NPU: convert a bundle's graphs to .rknn")
    rsub = p.add_subparsers(dest="rknn_command", required=True)
    c = rsub.add_parser(
        "convert",
        help="NPU-suited graphs → .rknn (fp16, int8) in the bundle, with a simulator report",
    )
    c.add_argument(
        "bundle", help="bundle folder (vits or chattts); for a Piper voice also 'embedded'"
    )
    c.add_argument("--target", choices=TARGETS, default="rk3588", help="the SoC (default rk3588)")
    c.add_argument("--out", help="write a new bundle here instead of into BUNDLE")
    c.add_argument("--calib", type=int, default=8, help="calibration sentences (default 8)")
    c.add_argument("--eval", type=int, default=4, help="evaluation sentences (default 4)")
    c.add_argument("--no-asr", action="store_true", help="skip the Whisper WER (Piper voices)")
    c.add_argument(
        "--algorithm",
        choices=["normal", "mmse", "kl_divergence"],
        default="normal",
        help="the toolkit's int8 quantization algorithm (default normal)",
    )
    c.add_argument("--threads", type=int, default=2, help="onnxruntime threads (default 2)")
    c.add_argument("--corpus", help="corpus folder (default calibration/corpus)")
    c.add_argument(
        "--rknn-python",
        help="the toolkit venv's python (default $SPEAKD_RKNN_PYTHON or .venv-rknn/bin/python)",
    )
    c.set_defaults(func=cmd_convert)


def cmd_convert(args: argparse.Namespace) -> int:
    from .convert import ConvertOptions, convert, format_report

    result = convert(
        ConvertOptions(
            bundle=args.bundle,
            out=Path(args.out) if args.out else None,
            target=args.target,
            calib_sentences=args.calib,
            eval_sentences=args.eval,
            asr=not args.no_asr,
            algorithm=args.algorithm,
            threads=args.threads,
            corpus=Path(args.corpus) if args.corpus else None,
            rknn_python=Path(args.rknn_python) if args.rknn_python else None,
        )
    )
    print(format_report(result.report))
    print(f"bundle {result.out}: {result.converted} .rknn graphs, report {result.out}/rknn/")
    return 0 if result.converted else 1
