"""``calibrate()``: float bundle + recipe + mode → quantized bundle with its quality report.

With ``mode="auto"`` every mode of the recipe is built and measured, and the fastest one within
the recipe's quality bounds is written to ``out`` (the report lists all candidates and says why
the winner won). On a random-weight checkpoint the bounds cannot be judged (random networks show
the size of the quantization error, not a voice's quality), so auto keeps the fastest and the
report flags it. A single mode writes that mode even when it misses a bound; the report and the
CLI say so.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from speakd.engines.bundle import MANIFEST, load_bundle

from ..loudness import record_loudness
from .base import CalibrateOptions
from .bundle_out import REPORT_DIR, prepare_out
from .corpus import Corpus
from .errors import CalibrationError
from .recipe import default_recipe_path, load_recipe
from .report import write_report

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CalibrateResult:
    bundle: Path
    manifest: dict[str, Any]
    report: dict[str, Any]

    @property
    def within_bounds(self) -> bool:
        return bool(self.report.get("within_bounds"))


def detect_engine(bundle: str) -> str:
    if bundle == "embedded" or bundle.endswith(".onnx"):
        return "vits"
    path = Path(bundle)
    if not (path / MANIFEST).is_file():
        raise CalibrationError(
            f"{bundle}: not a bundle folder (no {MANIFEST}), a Piper .onnx, or 'embedded'"
        )
    return load_bundle(path, verify=False).engine


def calibrate(opts: CalibrateOptions) -> CalibrateResult:
    engine = detect_engine(opts.bundle)
    recipe = load_recipe(opts.recipe or default_recipe_path(engine))
    if recipe.engine != engine:
        raise CalibrationError(
            f"{recipe.path}: a recipe for {recipe.engine!r}, but {opts.bundle} is a {engine} bundle"
        )
    method = opts.method or recipe.method
    modes = list(recipe.modes.values()) if opts.mode == "auto" else [recipe.mode(opts.mode)]
    corpus = Corpus.load(opts.corpus)
    src_dir = None if engine == "vits" and not Path(opts.bundle).is_dir() else Path(opts.bundle)
    prepare_out(opts.out, src_dir)
    if engine == "vits":
        from .vits import VitsRun as Run
    else:
        from .chattts import ChatTTSRun as Run
    run = Run(opts, recipe, corpus, method)
    candidates: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix=".calib-", dir=opts.out.parent) as tmp:
        for mode in modes:
            where = opts.out if len(modes) == 1 else Path(tmp) / mode.name
            candidates[mode.name] = run.candidate(mode, where)
        header = run.header()
        judged = bool(header.get("real_weights", True))
        winner = select_winner(candidates, judged)
        if len(modes) > 1:
            _replace_files(Path(tmp) / winner, opts.out)
    report = {
        **header,
        "engine": engine,
        "method": method,
        "recipe": {"path": str(recipe.path), "sha256": recipe.sha256},
        "bounds": recipe.bounds,
        "candidates": {
            k: {kk: vv for kk, vv in v.items() if not kk.startswith("_")}
            for k, v in candidates.items()
        },
        "winner": winner,
        "within_bounds": candidates[winner]["within_bounds"],
        "why": explain(winner, candidates, judged),
    }
    report = write_report(opts.out / REPORT_DIR, report, run.plots(candidates, winner))
    run.finish(opts.out, recipe.modes[winner], report)
    manifest = record_loudness(opts.out, opts.threads)
    load_bundle(opts.out)  # every hash verifies before we say it worked
    return CalibrateResult(opts.out, manifest, report)


def select_winner(candidates: dict[str, dict[str, Any]], judged: bool = True) -> str:
    """The fastest candidate within bounds; if none is, the best in quality (``score``, flagged):
    a fast bundle that breaks the quality bounds is the wrong default. ``judged`` False (random
    weights: the bounds say nothing about the real model): the fastest."""
    ok = [k for k, c in candidates.items() if c["within_bounds"] or not judged]
    if ok:
        return max(ok, key=lambda k: candidates[k]["speed_ratio"])
    return max(candidates, key=lambda k: candidates[k]["score"])


def explain(winner: str, candidates: dict[str, dict[str, Any]], judged: bool = True) -> str:
    w = candidates[winner]
    head = (
        f"`{winner}` runs at {w['speed_ratio']:.2f}× the fp32 speed with "
        f"{w['bytes_ratio']:.2f}× its bytes"
    )
    if not judged:
        head += (
            "; random weights: the quality bounds cannot be judged, so the fastest candidate is "
            "kept (calibrate the real checkpoint to let the bounds decide)"
        )
        if not w["within_bounds"]:
            head += f"; measured here it misses {'; '.join(w['failed'])}"
    elif not w["within_bounds"]:
        head += f", but misses a quality bound ({'; '.join(w['failed'])})"
        if len(candidates) > 1:
            head += "; no candidate met every bound, so the best in quality is kept and flagged"
    elif len(candidates) > 1:
        head += "; it is the fastest candidate within every quality bound"
    others = [
        f"`{k}` {c['speed_ratio']:.2f}× speed, {c['bytes_ratio']:.2f}× bytes"
        + ("" if c["within_bounds"] else f" (out of bounds: {'; '.join(c['failed'])})")
        for k, c in candidates.items()
        if k != winner
    ]
    return head + (". Others: " + ", ".join(others) + "." if others else ".")


def _replace_files(src: Path, out: Path) -> None:
    for f in src.iterdir():
        if f.is_file():
            shutil.copyfile(f, out / f.name)
