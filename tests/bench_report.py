"""Bench mode for the reliability tests: measurements appended to ``$SPEAKD_BENCH_REPORT``.

The reliability bench is the fuzz, overload, crash and fault tests themselves, run with
bench-sized budgets (docs/reliability.md, "Bench"): with ``$SPEAKD_BENCH_REPORT`` set, each test
appends what it measured there (one JSON object per line); a normal test run writes nothing.
"""

from __future__ import annotations

import json
import os
from typing import Any

REPORT_ENV = "SPEAKD_BENCH_REPORT"


def report(name: str, **values: Any) -> None:
    path = os.environ.get(REPORT_ENV)
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps({"name": name, **values}) + "\n")


def rss_kb(pid: int) -> int:
    """VmRSS of a live process, in kB (from /proc/<pid>/status)."""
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")
