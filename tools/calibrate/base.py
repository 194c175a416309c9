"""What ``pipeline`` and the two engine runs (``chattts``, ``vits``) share: the options of one
calibration and ``RunBase``, the part of a run that does not depend on the engine.

It sits below all three so that ``pipeline`` can pick an engine's run without the engine modules
importing ``pipeline`` back.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .bundle_out import REPORT_DIR
from .corpus import Corpus
from .errors import CalibrationError
from .recipe import Mode, Recipe


@dataclass(frozen=True)
class CalibrateOptions:
    bundle: str  # a bundle folder, a Piper .onnx, or "embedded"
    out: Path
    recipe: Path | None = None
    mode: str | None = None  # None = the recipe's default_mode; "auto" = try every mode
    method: str | None = None  # minmax | entropy | percentile (static); None = recipe's
    limit: int | None = None  # calibration sentences; None = recipe's
    eval_sentences: int | None = None
    asr_sentences: int | None = None  # VITS ASR round trip; 0 = off; None = recipe's
    corpus: Path | None = None
    threads: int = 2


class RunBase:
    """What the two engines share: options, recipe, corpus split, sentence counts."""

    def __init__(self, opts: CalibrateOptions, recipe: Recipe, corpus: Corpus, method: str):
        self.opts, self.recipe, self.method = opts, recipe, method
        self.corpus = corpus
        n_cal = opts.limit if opts.limit is not None else recipe.calibration_sentences
        n_eval = opts.eval_sentences if opts.eval_sentences is not None else recipe.eval_sentences
        self.cal, self.eval = corpus.split(n_cal, n_eval)
        if not self.eval:
            raise CalibrationError("the corpus leaves no sentence for evaluation")

    def corpus_info(self) -> dict[str, Any]:
        return {
            "files": list(self.corpus.files),
            "sha256": self.corpus.sha256(),
            "calibration_sha256": self.corpus.sha256(self.cal),
            "calibration_sentences": len(self.cal),
            "eval_sentences": len(self.eval),
        }

    def calibration_section(self, mode: Mode, report: dict[str, Any]) -> dict[str, Any]:
        return {
            "mode": mode.name,
            "precision": mode.precision,
            "why": mode.why,
            "method": self.method,
            "recipe": {
                "path": str(self.recipe.path),
                "sha256": self.recipe.sha256,
                "mode": {g: vars(s) for g, s in mode.graphs.items()},
                "kv_int8": mode.kv_int8,
            },
            "corpus": self.corpus_info(),
            "report": report,
            "report_files": [f"{REPORT_DIR}/report.md", f"{REPORT_DIR}/report.json"],
        }
