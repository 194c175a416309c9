"""``speakd-tools``: host-side commands. A thin dispatcher: one function per subcommand, each
calling one library function and turning its errors into a message and an exit code."""

from __future__ import annotations

import argparse
import logging
import sys
import threading
from pathlib import Path
from typing import NoReturn

log = logging.getLogger("speakd_tools")


def cmd_checkpoint(args: argparse.Namespace) -> int:
    from .chattts.random_checkpoint import write_random_checkpoint

    out = write_random_checkpoint(Path(args.out), size=args.size, seed=args.seed)
    print(f"wrote a random-weight {args.size} ChatTTS checkpoint to {out}/asset")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from .chattts.export import ExportOptions, export_bundle

    result = export_bundle(
        ExportOptions(
            checkpoint=Path(args.checkpoint),
            out=Path(args.out),
            precision=args.precision,
            max_context=args.max_context,
            parity=not args.no_parity,
            parity_steps=args.parity_steps,
        )
    )
    if result.parity is not None:
        print(result.parity.format())
    src = result.manifest["source"]
    print(
        f"bundle {result.bundle} ({result.manifest['precision']}), "
        f"real_weights={src['real_weights']}"
    )
    if not result.ok:
        print("error: parity bounds broken (report above and in manifest.json)", file=sys.stderr)
        return 1
    return 0


def cmd_precompute(args: argparse.Namespace) -> int:
    from .precompute import run

    return run(args)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="speakd-tools", description=__doc__)
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = p.add_subparsers(dest="command", required=True)

    c = sub.add_parser(
        "checkpoint",
        help="write a random-weight ChatTTS checkpoint (ChatTTS 0.2.5's asset/ layout)",
    )
    c.add_argument(
        "--size",
        choices=["tiny", "full"],
        default="tiny",
        help="tiny: 2 GPT layers, runs in seconds; full: ChatTTS's real sizes",
    )
    c.add_argument("--out", required=True, help="folder to create; asset/ goes inside")
    c.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    c.set_defaults(func=cmd_checkpoint)

    e = sub.add_parser("export", help="ChatTTS checkpoint → speakd bundle, with parity check")
    e.add_argument("--checkpoint", required=True, help="folder that contains asset/")
    e.add_argument("--out", required=True, help="bundle folder, e.g. models/chattts")
    e.add_argument(
        "--precision",
        choices=["fp32", "fp16"],
        default="fp32",
        help="fp16 stores weights as float16 (Cast to float32 at load)",
    )
    e.add_argument(
        "--max-context",
        type=int,
        default=2048,
        help="KV capacity per row (prompt + generated steps), default 2048",
    )
    e.add_argument("--no-parity", action="store_true", help="skip the torch parity check")
    e.add_argument(
        "--parity-steps",
        type=int,
        default=200,
        help="greedy decode steps compared (default and minimum 200)",
    )
    e.set_defaults(func=cmd_export)

    from .precompute import add_arguments as precompute_arguments

    pc = sub.add_parser("precompute", help="fixed prompts → a prompt pack of pinned clips")
    precompute_arguments(pc)
    pc.set_defaults(func=cmd_precompute)

    from .calibrate.cli import add_parser as add_calibrate

    add_calibrate(sub)

    from .bench.cli import add_parser as add_bench

    add_bench(sub)

    from .fleet.cli import add_parser as add_fleet

    add_fleet(sub)

    from .rknn.cli import add_parser as add_rknn

    add_rknn(sub)

    from .soak.cli import add_parser as add_soak

    add_soak(sub)

    from .voice import add_parser as add_voice

    add_voice(sub)

    from .loudness import add_parser as add_loudness

    add_loudness(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(levelname)s %(name)s: %(message)s",
    )
    from .chattts.checkpoint import CheckpointError

    try:
        return args.func(args)
    except (CheckpointError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


def console() -> NoReturn:
    """The ``speakd-tools`` command. A synthesis given up on (a precompute prompt past its hang
    timeout) can still be inside onnxruntime when ``main`` returns, and interpreter teardown under
    it aborts the process ("terminate called without an active exception", exit 134) after the
    work is done and stored; then the tool leaves the way the daemon does."""
    code = main()
    if any(t.daemon and t.is_alive() for t in threading.enumerate()):
        from speakd.lifecycle.process import exit_now

        exit_now(code)
    sys.exit(code)


if __name__ == "__main__":
    console()
