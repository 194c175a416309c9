"""Reliability bench (issue 11): the fuzz, overload, crash and broker-restart tests, bench-sized.

    .venv/bin/python -m speakd_tools.bench_reliability [--fuzz 10000] [--only burst,broker_restart]

Each section is one of the repo's own tests run as a pytest subprocess with a bench budget set
through the environment (the same knobs CI leaves at a modest default); the tests append what they
measured to ``$SPEAKD_BENCH_REPORT``. Prints one JSON object: per section whether it passed, its
wall time and its measurements. A failed section (a crash, a hang, a lost clip…) exits 1.
Run it from a source checkout (it needs tests/). Timings on a shared machine are noisy.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def sections(fuzz: int) -> dict[str, tuple[list[str], dict[str, str]]]:
    """name → (pytest arguments, environment). JSON and MQTT examples carry ~4 inputs each on
    average (lines, payloads); the report counts the inputs actually sent."""
    return {
        "fuzz_json": (
            ["tests/test_fuzz_json.py", "-k", "json_socket_fuzz"],
            {"SPEAKD_JSON_FUZZ_EXAMPLES": str(max(1, fuzz * 35 // 100))},
        ),
        "fuzz_mqtt": (
            ["tests/test_fuzz_json.py", "-k", "mqtt_say_payload_fuzz"],
            {"SPEAKD_MQTT_FUZZ_EXAMPLES": str(max(1, fuzz * 35 // 100))},
        ),
        "fuzz_ssip": (
            ["tests/test_ssip_fuzz.py", "-k", "fuzz_never_crashes"],
            {"SPEAKD_SSIP_FUZZ_EXAMPLES": str(fuzz)},
        ),
        "burst": (["tests/test_overload.py"], {"SPEAKD_BURST_ROUNDS": "5"}),
        "cache_sigkill": (
            ["tests/test_cache_store.py", "-k", "sigkill"],
            {"SPEAKD_CRASH_ROUNDS": "50"},
        ),
        "broker_restart": (
            ["tests/test_faults.py", "-k", "broker_restart"],
            {"SPEAKD_BROKER_ROUNDS": "5"},
        ),
    }


def run_section(name: str, args: list[str], env: dict[str, str]) -> dict[str, Any]:
    with tempfile.NamedTemporaryFile("r", suffix=".jsonl") as report:
        full_env = {**os.environ, **env, "SPEAKD_BENCH_REPORT": report.name}
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--timeout=0"]
        t0 = time.monotonic()
        r = subprocess.run(
            [*cmd, *args], cwd=ROOT, env=full_env, capture_output=True, text=True, check=False
        )
        wall = time.monotonic() - t0
        measured = [json.loads(line) for line in report.read().splitlines()]
    summary = r.stdout.strip().splitlines()[-1] if r.stdout.strip() else ""
    result = {
        "passed": r.returncode == 0,
        "pytest": summary,
        "wall_s": round(wall, 1),
        "env": env,
        "measured": measured,
    }
    print(f"{name}: {'ok' if result['passed'] else 'FAILED'} in {wall:.0f} s", file=sys.stderr)
    if r.returncode != 0:
        result["output_tail"] = (r.stdout + r.stderr)[-4000:]
        print(result["output_tail"], file=sys.stderr)  # at once: the JSON comes at the end
    return result


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--fuzz", type=int, default=10_000, help="inputs per front-end (10000)")
    p.add_argument("--only", default="", help="comma-separated sections (default: all)")
    args = p.parse_args(argv)
    if not (ROOT / "tests").is_dir():
        sys.exit(f"{ROOT}/tests not found: run this from a source checkout")
    chosen = sections(args.fuzz)
    if args.only:
        unknown = set(args.only.split(",")) - set(chosen)
        if unknown:
            sys.exit(f"unknown sections {sorted(unknown)} (known: {', '.join(chosen)})")
        chosen = {k: v for k, v in chosen.items() if k in args.only.split(",")}
    results = {name: run_section(name, *spec) for name, spec in chosen.items()}
    print(json.dumps(results, indent=2))
    sys.exit(0 if all(r["passed"] for r in results.values()) else 1)


if __name__ == "__main__":
    main()
