"""PNG plots of a ``speakd-tools bench chattts`` result: GPT ms/step vs context, RTF."""

from __future__ import annotations

from pathlib import Path
from typing import Any

COLOURS = {"torch": "#7f7f7f", "fp32": "#1f77b4", "int8": "#2ca02c", "int4": "#d62728"}


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_steps(result: dict[str, Any], path: Path) -> Path | None:
    steps = result.get("steps")
    if not steps:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for name in result["contenders"]:
        cells = steps.get(name)
        if not cells:
            continue
        ctx = sorted(int(c) for c in cells)
        ax.plot(
            ctx,
            [cells[str(c)]["median_ms"] for c in ctx],
            marker="o",
            label=name,
            color=COLOURS.get(name),
        )
    ax.axhline(21.33, ls="--", lw=0.8, color="k")
    ax.text(ax.get_xlim()[0], 21.33, " real time (21.3 ms/step)", va="bottom", fontsize=8)
    ax.axhline(4.0, ls=":", lw=0.8, color="#d62728")
    ax.text(ax.get_xlim()[0], 4.0, " target 4 ms", va="bottom", fontsize=8)
    ax.set_yscale("log")
    ax.set_xlabel("context (keys attended)")
    ax.set_ylabel("GPT decode step, ms (median, log scale)")
    ax.set_title(f"GPT step vs context (load {steps['loadavg_before'][0]})")
    ax.legend()
    ax.grid(alpha=0.3, which="both")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_rtf(result: dict[str, Any], path: Path) -> Path | None:
    e2e = result.get("e2e")
    if not e2e:
        return None
    names = [n for n in result["contenders"] if (e2e.get(n) or {}).get("rtf") is not None]
    if not names:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    values = [e2e[n]["rtf"] for n in names]
    bars = ax.bar(names, values, color=[COLOURS.get(n) for n in names])
    for bar, v in zip(bars, values, strict=True):
        ax.text(bar.get_x() + bar.get_width() / 2, v, f"{v:.2f}", ha="center", va="bottom")
    ax.axhline(1.0, ls="--", lw=0.8, color="k", label="real time")
    ax.axhline(0.3, ls=":", lw=0.8, color="#d62728", label="target 0.3")
    ax.set_yscale("log")
    ax.set_ylabel("RTF (compute s / audio s, log scale)")
    loads = ", ".join(f"{n} {e2e[n]['loadavg_before'][0]}" for n in names)
    ax.set_title(f"End-to-end RTF (load: {loads})", fontsize=9)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_all(result: dict[str, Any], out: Path) -> list[Path]:
    made = [
        plot_steps(result, out / "gpt_ms_per_step.png"),
        plot_rtf(result, out / "rtf.png"),
    ]
    return [p for p in made if p is not None]
