"""``speakd-tools soak``: hours of mixed traffic and faults against a real daemon, with every
request counted (docs/reliability.md, "Soak")."""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "soak",
        help="mixed traffic on every front-end with faults on a schedule; exit 1 on a missed "
        "target",
        description=__doc__,
    )
    p.add_argument("--minutes", type=float, default=30.0, help="how long traffic runs (30)")
    p.add_argument(
        "--chattts", type=Path, help="a ChatTTS bundle as the [engine] voice (default: embedded)"
    )
    p.add_argument("--work", type=Path, help="keep the run's files here (default: a temp dir)")
    p.add_argument("--json-out", type=Path, help="write the whole result as JSON here")
    p.add_argument(
        "--think", type=float, default=0.5, help="mean pause between a client's requests (s)"
    )
    p.add_argument(
        "--fault-every", type=float, default=30.0, help="seconds between faults (at most)"
    )
    p.add_argument("--warmup", type=float, help="seconds of traffic before the baseline")
    p.add_argument("--seed", type=int, default=0, help="the clients' random choices")
    p.set_defaults(func=cmd_soak)


def cmd_soak(args: argparse.Namespace) -> int:
    from .report import table
    from .run import Options, run

    opts = Options(
        minutes=args.minutes,
        chattts=args.chattts,
        work=args.work,
        think_s=args.think,
        fault_every_s=args.fault_every,
        warmup_s=args.warmup,
        seed=args.seed,
    )
    result = run(opts)
    if args.json_out:
        args.json_out.write_text(json.dumps(result, indent=1))
    print(table(result))
    return 0 if result["ok"] else 1
