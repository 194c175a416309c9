"""The quality report: ``report.json`` (also embedded in the manifest), ``report.md`` and PNG plots
in ``<out>/report/``. Engines hand over a plain dict and the arrays to plot; this module only
renders."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np


def finite(x: Any) -> Any:
    """JSON-safe copy: numpy scalars to Python, non-finite floats to None (and flagged)."""
    if isinstance(x, dict):
        return {str(k): finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [finite(v) for v in x]
    if isinstance(x, (np.floating, float)):
        return float(x) if math.isfinite(float(x)) else None
    if isinstance(x, np.integer):
        return int(x)
    if isinstance(x, np.bool_):
        return bool(x)
    return x


def write_report(out: Path, report: dict[str, Any], plots: dict[str, Any]) -> dict[str, Any]:
    """Write JSON + Markdown + PNGs; return the JSON-safe report (with the plot file names)."""
    out.mkdir(parents=True, exist_ok=True)
    names = _plots(out, plots)
    report = finite({**report, "plots": names})
    (out / "report.json").write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n")
    (out / "report.md").write_text(markdown(report), encoding="utf-8")
    return report


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, (dict, list)):
        return json.dumps(v, ensure_ascii=False)
    return str(v)


def markdown(report: dict[str, Any]) -> str:
    lines = [f"# Calibration report: {report['engine']} → {report.get('winner')}", ""]
    if not report.get("real_weights", True):
        lines += [
            "> **Random weights**: these quality figures show plumbing and the size of the",
            "> quantization error on random networks, not the quality of a real voice.",
            "",
        ]
    lines += [
        f"- recipe: `{report['recipe']['path']}` (sha256 {report['recipe']['sha256'][:12]}…)",
        f"- corpus: {report['corpus']['calibration_sentences']} calibration + "
        f"{report['corpus']['eval_sentences']} evaluation sentences, sha256 "
        f"{report['corpus']['sha256'][:12]}…",
        f"- method: {report.get('method')}",
        f"- bounds: {_fmt(report.get('bounds', {}))}",
        "",
        "## Winner",
        "",
        str(report.get("why", "")),
        "",
        "## Candidates",
        "",
    ]
    cands = report.get("candidates", {})
    keys = ["precision", "bytes_ratio", "speed_ratio", *report.get("headline", [])]
    lines += [
        "| mode | " + " | ".join(keys) + " | within bounds |",
        "|---|" + "---:|" * len(keys) + "---|",
    ]
    for name, c in cands.items():
        row = [_fmt(c.get(k, c.get("quality", {}).get(k, ""))) for k in keys]
        ok = "yes" if c.get("within_bounds") else "no: " + "; ".join(c.get("failed", []))
        lines.append(f"| {name} | " + " | ".join(row) + f" | {ok} |")
    for name, c in cands.items():
        lines += ["", f"### {name}", ""]
        for g, info in c.get("graphs", {}).items():
            lines.append(
                f"- **{g}**: {info.get('how')}, {info.get('nodes_quantized')} nodes"
                + (f" — {info['why']}" if info.get("why") else "")
                + (f" ({info['note']})" if info.get("note") else "")
            )
        for section in ("quality", "per_graph", "speed", "bytes"):
            if section in c:
                lines += ["", f"{section}:", "", "| key | value |", "|---|---:|"]
                lines += [f"| {k} | {_fmt(v)} |" for k, v in _flat(c[section]).items()]
    if report.get("kv_scales"):
        lines += ["", "## int8 KV cache scales (absmax/127 per layer, measured on the corpus)", ""]
        lines.append(_fmt(report["kv_scales"]))
    if report.get("plots"):
        lines += ["", "## Plots", ""] + [f"![{p}]({p})" for p in report["plots"]]
    return "\n".join(lines) + "\n"


def _flat(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _plots(out: Path, plots: dict[str, Any]) -> list[str]:
    """``plots``: file stem → ("bars", {label: value}, ylabel) | ("lines", {label: seq}, ylabel)
    | ("image", {title: 2-D array}, colorbar label)."""
    if not plots:
        return []
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = []
    for stem, (kind, data, label) in plots.items():
        if kind == "image":
            fig, axes = plt.subplots(len(data), 1, figsize=(9, 2.4 * len(data)), squeeze=False)
            for ax, (title, arr) in zip(axes[:, 0], data.items(), strict=True):
                im = ax.imshow(np.asarray(arr), aspect="auto", origin="lower")
                ax.set_title(title, fontsize=9)
                fig.colorbar(im, ax=ax, label=label)
        else:
            fig, ax = plt.subplots(figsize=(7, 3.5))
            if kind == "bars":
                ax.bar(list(data), [float(v) for v in data.values()])
            else:
                for lbl, seq in data.items():
                    ax.plot(np.asarray(seq, float), label=lbl)
                ax.legend(fontsize=8)
            ax.set_ylabel(label)
            ax.set_title(stem.replace("_", " "), fontsize=10)
        fig.tight_layout()
        fig.savefig(out / f"{stem}.png", dpi=90)
        plt.close(fig)
        names.append(f"{stem}.png")
    return names
