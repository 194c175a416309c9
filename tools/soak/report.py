"""The soak's table: one row per front-end, then the process, the cache checks, the faults and
the targets."""

from __future__ import annotations

from typing import Any

from ..bench.harness import loopstall

COLUMNS = ("sent", "terminal", "missing", "duplicate", "lost_to_kill", "abandoned")


def table(result: dict[str, Any]) -> str:
    head = ["front-end", *COLUMNS, "audio s (got/expected)", "audio wrong", "outcomes"]
    lines = [
        f"speakd soak: {result['minutes']:g} min, {result['engine']}, voices "
        f"{', '.join(result['voices'])}",
        result["machine"],
        f"load average at the end: {result['loadavg_end']}; wall time {result['wall_s']} s",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for name, row in result["frontends"].items():
        outcomes = ", ".join(f"{k} {v}" for k, v in row["outcomes"].items())
        audio = f"{row['audio_s']:.1f} / {row['expected_s']:.1f}"
        cells = [name, *(str(row[c]) for c in COLUMNS), audio, str(row["audio_wrong"]), outcomes]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    for inc in result["incarnations"]:
        growth = "n/a" if inc["rss_growth"] is None else f"{inc['rss_growth'] * 100:+.1f} %"
        idle = inc["idle_rss_mb"] or ["n/a", "n/a"]
        kept = "" if inc["idle_rss_growth"] is None else f" ({inc['idle_rss_growth'] * 100:+.1f} %)"
        lines.append(
            f"process {inc['epoch']}: RSS idle {idle[0]} → {idle[1]} MB{kept}; peak "
            f"{inc['warm_rss_mb']} MB in warm-up, {inc['peak_rss_mb']} MB after ({growth}); "
            "fds/threads idle "
            f"{inc['baseline_fds_threads']} → {inc['end_fds_threads']}"
            + (f" (more: {inc['fd_kinds_grown']})" if inc["fd_kinds_grown"] else "")
        )
        if inc.get("loop"):
            lines.append(f"process {inc['epoch']}, event loop: {loopstall.describe(inc['loop'])}")
    for check in result["cache_checks"]:
        lines.append(
            f"cache after {check['after']}: integrity {', '.join(check['integrity'][:3])}; "
            f"{len(check['pinned_missing'])} of {result['pinned_clips']} pinned clips missing"
        )
    faults: dict[str, list[bool]] = {}
    for f in result["faults"]:
        faults.setdefault(f["fault"], []).append(f["ok"])
    lines.append(
        "faults: " + ", ".join(f"{name} {sum(oks)}/{len(oks)}" for name, oks in faults.items())
    )
    mqtt = result["frontends"].get("mqtt", {})
    lines.append(
        f"MQTT lost: {mqtt.get('missing', 'n/a')}; twice: {mqtt.get('duplicate', 'n/a')}, "
        f"across a stop (the documented window): {mqtt.get('twice_by_kill', 'n/a')}; "
        f"broker redeliveries answered duplicate: {result['mqtt_redeliveries_dropped']}"
    )
    lines.append(f"tracebacks in the log: {len(result['tracebacks'])}")
    if result["tool_errors"]:
        lines.append(f"the tool's own errors: {len(result['tool_errors'])}")
    lines.append("")
    for name, ok in result["targets"].items():
        lines.append(f"[{' OK ' if ok else 'MISS'}] {name.replace('_', ' ')}")
    problems = [p for row in result["frontends"].values() for p in row["problems"]]
    problems += [f"fault {f['fault']}: {f['detail']}" for f in result["faults"] if not f["ok"]]
    problems += [t.splitlines()[-1] for t in result["tracebacks"]]
    problems += result["tool_errors"]
    if problems:
        lines += ["", "problems (first 30):", *(f"  {p}" for p in problems[:30])]
    return "\n".join(lines)
