"""The calibration corpus: ``calibration/corpus/<lang>.txt``, one sentence per line.

Lines that are empty or start with ``#`` are skipped. The corpus hash (sha256 of the sentences
actually used, in order) goes into the output manifest, so a bundle says what calibrated it.
Calibration and evaluation take *disjoint* sentences (interleaved by language), so the quality
report is measured on text the ranges were not fitted to.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from .errors import CalibrationError

REPO_CORPUS = Path(__file__).resolve().parents[2] / "calibration" / "corpus"


@dataclass(frozen=True)
class Sentence:
    lang: str
    text: str


@dataclass(frozen=True)
class Corpus:
    sentences: tuple[Sentence, ...]
    files: tuple[str, ...]

    @classmethod
    def load(cls, directory: Path | None = None, langs: tuple[str, ...] = ("en", "zh")) -> Corpus:
        """Read ``<directory>/<lang>.txt`` for each language; refuse an empty corpus."""
        directory = Path(directory) if directory else REPO_CORPUS
        per_lang: list[list[Sentence]] = []
        files = []
        for lang in langs:
            path = directory / f"{lang}.txt"
            if not path.is_file():
                raise CalibrationError(f"{path}: corpus file missing (one sentence per line)")
            lines = [ln.strip() for ln in path.read_text(encoding="utf-8").splitlines()]
            sentences = [Sentence(lang, ln) for ln in lines if ln and not ln.startswith("#")]
            if not sentences:
                raise CalibrationError(f"{path}: the corpus file holds no sentence")
            per_lang.append(sentences)
            files.append(str(path))
        mixed: list[Sentence] = []
        for i in range(max(len(s) for s in per_lang)):
            mixed.extend(s[i] for s in per_lang if i < len(s))
        return cls(tuple(mixed), tuple(files))

    def split(self, calib: int, evaluate: int) -> tuple[list[Sentence], list[Sentence]]:
        """``calib`` sentences for the ranges and the next ``evaluate`` for the report.

        Evaluation takes every other sentence, calibration the rest, so both see every kind of
        line (short prompts, numbers, long announcements) in both languages.
        """
        if calib < 1:
            raise CalibrationError(f"calibration needs at least 1 sentence, got {calib}")
        evens, odds = list(self.sentences[0::2]), list(self.sentences[1::2])
        cal, ev = evens[:calib], odds[:evaluate]
        if len(cal) < calib:
            cal += odds[evaluate : evaluate + calib - len(cal)]
        return cal, ev

    def sha256(self, sentences: list[Sentence] | None = None) -> str:
        items = [[s.lang, s.text] for s in (self.sentences if sentences is None else sentences)]
        return hashlib.sha256(json.dumps(items, ensure_ascii=False).encode()).hexdigest()

    def only(self, lang: str) -> Corpus:
        kept = tuple(s for s in self.sentences if s.lang == lang)
        if not kept:
            raise CalibrationError(f"corpus {', '.join(self.files)}: no {lang!r} sentence")
        return Corpus(kept, self.files)
