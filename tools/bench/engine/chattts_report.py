"""The Markdown table of ``speakd-tools bench chattts``: figures, then ratios to torch and fp32."""

from __future__ import annotations

from typing import Any

from ..harness.machine import line as machine_line

# (key, header, unit scale); every metric is "lower is better". The interleaved GPT-step columns
# ("step<ctx>") are added per measured context in front of these.
COLUMNS = [
    ("loop100", "in-loop ms/step ctx100", 1.0),
    ("loop500", "in-loop ms/step ctx500", 1.0),
    ("rtf", "RTF", 1.0),
    ("ttfa", "first audio ms", 1.0),
    ("gapless", "gapless first audio ms", 1.0),
    ("daemon_ttfa", "daemon first audio ms", 1.0),
    ("rss", "peak RSS MB", 1.0),
    ("ready", "start→READY s", 1.0),
    ("bytes", "model MB", 1e-6),
]


def _get(d: Any, *path: Any) -> Any:
    for p in path:
        if not isinstance(d, dict) or p not in d:
            return None
        d = d[p]
    return d


def columns(result: dict[str, Any]) -> list[tuple[str, str, float]]:
    ctx = result["options"]["contexts"] if "steps" in result else []
    return [(f"step{c}", f"GPT ms/step ctx{c}", 1.0) for c in ctx] + COLUMNS


def metrics(result: dict[str, Any], name: str) -> dict[str, float | None]:
    """One contender's headline numbers (None = not measured)."""
    e2e = _get(result, "e2e", name) or {}
    first, gapless = e2e.get("first_audio_s"), e2e.get("gapless_first_audio_s")
    steps = {
        f"step{c}": _get(result, "steps", name, str(c), "median_ms")
        for c in result["options"]["contexts"]
    }
    return {
        **steps,
        "loop100": e2e.get("ms_per_step_ctx100"),
        "loop500": e2e.get("ms_per_step_ctx500"),
        "rtf": e2e.get("rtf"),
        "ttfa": first * 1e3 if first is not None else None,
        "gapless": gapless * 1e3 if gapless is not None else None,
        "daemon_ttfa": _get(result, "startup", name, "daemon_first_audio_ms"),
        "rss": e2e.get("peak_rss_mb"),
        "ready": _get(result, "startup", name, "ready_s_warm"),
        "bytes": _get(result, "bytes", name, "total"),
    }


def _fmt(v: float | None, scale: float = 1.0) -> str:
    if v is None:
        return "–"
    v *= scale
    return f"{v:.0f}" if abs(v) >= 100 else f"{v:.2f}" if abs(v) >= 1 else f"{v:.3f}"


def table(result: dict[str, Any]) -> str:
    names = list(result["contenders"])
    m = {n: metrics(result, n) for n in names}
    cols = columns(result)
    head = "| contender | " + " | ".join(h for _, h, _ in cols) + " |"
    sep = "|---|" + "---:|" * len(cols)
    lines = [machine_line(result["machine"]), "", head, sep]
    for n in names:
        c = result["contenders"][n]
        if c["missing"]:
            lines.append(f"| {n} | missing: {c['missing']} |" + " |" * (len(cols) - 1))
            continue
        cells = [_fmt(m[n][k], s) for k, _, s in cols]
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    lines += _floor_lines(result)
    for ref in ("torch", "fp32"):
        if ref not in m or result["contenders"][ref]["missing"]:
            continue
        lines += ["", f"Ratio to {ref} (value ÷ {ref}'s; below 1 = better):", "", head, sep]
        for n in names:
            if n == ref or result["contenders"][n]["missing"]:
                continue
            cells = []
            for k, _, _ in cols:
                a, b = m[n][k], m[ref][k]
                cells.append(f"{a / b:.3f}" if a is not None and b else "–")
            lines.append(f"| {n} | " + " | ".join(cells) + " |")
    if "torch" in m and not result["contenders"]["torch"]["missing"]:
        speed = []
        for n in names:
            t, x = m["torch"], m[n]
            if n == "torch" or result["contenders"][n]["missing"]:
                continue
            parts = [
                f"{label} {t[k] / x[k]:.1f}×"
                for k, label, _ in cols
                if (k.startswith("step") or k == "rtf") and t[k] and x[k]
            ]
            if parts:
                speed.append(f"{n}: " + ", ".join(parts))
        if speed:
            lines += ["", "Speed-up vs torch: " + "; ".join(speed) + "."]
    if result.get("projection"):
        lines += ["", *projection_table(result["projection"])]
    lines += _throttle_lines(result)
    lines += ["", _loads(result)]
    cache = result.get("cache")
    if cache:
        lines += ["", _cache_line(cache)]
    return "\n".join(lines)


def _floor_lines(result: dict[str, Any]) -> list[str]:
    """GPT step ÷ its bandwidth floor per contender and context (``chattts_step.floors``)."""
    machine = result["machine"]
    rows = {n: c for n, c in result["contenders"].items() if c.get("floor_ms") and c.get("step_ms")}
    if not rows:
        return []
    ctxs = list(next(iter(rows.values()))["floor_ms"])
    lines = [
        "",
        f"GPT step ÷ bandwidth floor (bytes one step reads ÷ {machine['read_gbps']} GB/s read "
        f"with {machine.get('read_threads', '?')} threads; 1 = at the floor):",
        "",
        "| contender | "
        + " | ".join(f"ctx{c}: step / floor ms | ctx{c} ratio" for c in ctxs)
        + " |",
        "|---|" + "---:|---:|" * len(ctxs),
    ]
    for n, c in rows.items():
        cells = []
        for ctx in ctxs:
            step, floor = c["step_ms"].get(ctx), c["floor_ms"][ctx]
            cells.append(f"{_fmt(step)} / {_fmt(floor)} | {step / floor:.2f}×" if step else "– | –")
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    return lines


def _throttle_lines(result: dict[str, Any]) -> list[str]:
    """The throttled end-to-end run next to the same contender's unthrottled one."""
    out = []
    for n, r in (result.get("throttled") or {}).items():
        base = _get(result, "e2e", n) or {}
        parts = []
        for label, run in ((r["throttle"], r), ("unthrottled", base)):
            if "stall_s" not in run:
                continue
            parts.append(
                f"{label}: playback stall {run['stall_s']:.2f} s, first audio "
                f"{run['first_audio_s'] * 1e3:.0f} ms, gapless first audio "
                f"{run['gapless_first_audio_s'] * 1e3:.0f} ms, RTF {run['rtf']:.3f}"
            )
        out += ["", f"Throttled {n}: " + "; ".join(parts) + "."]
    return out


def _loads(result: dict[str, Any]) -> str:
    parts = [f"start {result['machine']['loadavg_start']}"]
    if "steps" in result:
        parts.append(f"GPT-step phase {result['steps']['loadavg_before']}")
    for n, r in (result.get("e2e") or {}).items():
        if "loadavg_before" in r:
            parts.append(f"e2e {n} {r['loadavg_before']}")
    for n, r in (result.get("throttled") or {}).items():
        parts.append(f"throttled {n} {r.get('loadavg_before')}")
    for n, r in (result.get("startup") or {}).items():
        parts.append(f"startup {n} {r['loadavg']}")
    parts.append(f"end {result['machine'].get('loadavg_end')}")
    return "Load average (1/5/15 min): " + "; ".join(parts) + "."


def _cache_line(cache: dict[str, Any]) -> str:
    s = _get(cache, "socket", "server_ms") or {}
    c = _get(cache, "socket", "client_ms") or {}
    q = _get(cache, "mqtt", "say_to_first_sample_ms") or {}
    text = (
        f"Cache hit → first sample (embedded VITS clip, real daemon): socket server p50 "
        f"{s.get('p50')} / p99 {s.get('p99')} ms, client p50 {c.get('p50')} / p99 {c.get('p99')} ms"
    )
    if q:
        text += f"; MQTT (mosquitto, QoS 1) p50 {q.get('p50')} / p99 {q.get('p99')} ms"
    elif _get(cache, "mqtt", "missing"):
        text += f"; MQTT missing: {cache['mqtt']['missing']}"
    return text + f" (load {cache.get('loadavg_before')})."


def projection_table(proj: dict[str, Any]) -> list[str]:
    """PROJECTION (bandwidth floor, GPT only): bytes per step ÷ the board's DRAM bandwidth."""
    boards = list(next(iter(next(iter(proj.values())).values())))[1:]
    head = "| precision | ctx | MB read/step | " + " | ".join(
        f"{b} ms/step | {b} GPT RTF" for b in boards
    )
    lines = [
        "Board projection (a PROJECTION, not a measurement: bandwidth floor of the GPT step):",
        "",
        head + " |",
        "|---|---:|---:|" + "---:|---:|" * len(boards),
    ]
    for name, rows in proj.items():
        for ctx, row in rows.items():
            cells = []
            for b in boards:
                ms, rtf = row[b]["ms_per_step"], row[b]["gpt_rtf"]
                cells.append(_span(ms) + " | " + _span(rtf))
            lines.append(f"| {name} | {ctx} | {row['mb_per_step']} | " + " | ".join(cells) + " |")
    return lines


def _span(pair: list[float]) -> str:
    return f"{pair[0]}" if pair[0] == pair[1] else f"{pair[0]}–{pair[1]}"
