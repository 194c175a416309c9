"""Word timings bench: how close the Piper voice's word timings are to where a recogniser hears
the words.

    speakd-tools bench words [--threads 2] [--seed 1] [--no-bandwidth] [--json]

Each test sentence is synthesised by the embedded voice (``VitsEngine.synthesize``: the audio and
its ``AudioChunk.words``), then Whisper ``tiny.en`` under faster-whisper (the ASR of
``speakd-tools calibrate``, ``tools/calibrate/asr.py``) transcribes the same audio with
``word_timestamps=True``. Both word lists are normalised (lower case, numbers spelled out) and
aligned (``difflib``); for each word both name the same way, |speakd's start − Whisper's start|.
Prints the median, p90 and the mean signed difference (speakd later is positive), over all
sentences, and each sentence's, after the machine line (``machine.py``). Whisper's timestamps
are themselves estimates (20 ms steps, from its cross-attention), so this bounds the error from
above rather than measuring it exactly.
"""

from __future__ import annotations

import argparse
import difflib
import statistics
import time
from typing import Any

import numpy as np

from speakd.audio import join_chunks
from speakd.engines.base import SynthesisConfig
from speakd.engines.vits.engine import VitsEngine
from speakd_tools.calibrate.asr import Transcriber, normalize_words

from ..harness.machine import describe
from ..harness.machine import line as machine_line
from ..harness.stats import loadavg

SENTENCES = (
    "Turn the kitchen lights off before you leave the house.",
    "The front door has been open for ten minutes.",
    "Your package from the post office arrived this morning.",
    "The washing machine has finished its cycle.",
    "It will rain in the afternoon, so take an umbrella with you.",
    "The meeting with Doctor Smith starts at 5:30 tomorrow.",
    "Battery low: the smoke detector in the hallway needs a new one.",
    "Set the thermostat to 21 degrees and close the garage.",
    "Good morning! Today is Thursday, and the sky is clear.",
    "Please remember to water the plants on the balcony.",
    "The dishwasher will start in 45 minutes, when the power is cheaper.",
    "Somebody is ringing at the gate; the camera shows a delivery van.",
)


def starts(words: list[tuple[str, float]]) -> tuple[list[str], list[float | None]]:
    """Normalised tokens, each with its word's start on the word's first token (else None)."""
    tokens: list[str] = []
    times: list[float | None] = []
    for text, start in words:
        for i, token in enumerate(normalize_words(text)):
            tokens.append(token)
            times.append(start if i == 0 else None)
    return tokens, times


def differences(ours: list[tuple[str, float]], theirs: list[tuple[str, float]]) -> list[float]:
    """speakd's start − Whisper's, in seconds, for each word both lists begin with one token."""
    a, a_times = starts(ours)
    b, b_times = starts(theirs)
    out = []
    for i, j, size in difflib.SequenceMatcher(None, a, b, autojunk=False).get_matching_blocks():
        for k in range(size):
            x, y = a_times[i + k], b_times[j + k]
            if x is not None and y is not None:
                out.append(x - y)
    return out


def measure(args: argparse.Namespace) -> dict[str, Any]:
    engine = VitsEngine.embedded(threads=args.threads)
    asr = Transcriber.load(threads=args.threads)
    rows, every = [], []
    t0 = time.monotonic()
    for text in SENTENCES:
        audio = join_chunks(engine.synthesize(text, SynthesisConfig(seed=args.seed)))
        assert audio is not None
        rate = audio.sample_rate
        ours = [(w.text, w.start / rate) for w in audio.words]
        heard = asr.words(audio.samples().astype(np.float32) / 32768.0, rate)
        diff = differences(ours, [(word, start) for word, start, _ in heard])
        every += diff
        rows.append(
            {
                "text": text,
                "words": len(ours),
                "matched": len(diff),
                "median_ms": _ms(statistics.median(map(abs, diff))) if diff else None,
                "bias_ms": _ms(statistics.mean(diff)) if diff else None,
            }
        )
    absolute = [abs(d) for d in every]
    return {
        "sentences": rows,
        "words": sum(r["words"] for r in rows),
        "matched": len(every),
        "median_ms": _ms(statistics.median(absolute)),
        "p90_ms": _ms(float(np.percentile(absolute, 90))),
        "bias_ms": _ms(statistics.mean(every)),
        "within_100ms": round(sum(d <= 0.1 for d in absolute) / len(absolute), 3),
        "seconds": round(time.monotonic() - t0, 1),
        "loadavg": loadavg(),
        "machine": describe(not args.no_bandwidth, args.threads),
    }


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 1)


def table(result: dict[str, Any]) -> str:
    rows = [
        machine_line(result["machine"]),
        f"Load average {result['loadavg']}; {len(result['sentences'])} sentences, "
        f"{result['matched']} of {result['words']} words matched, {result['seconds']} s.",
        "",
        f"All matched words: median |Δ start| **{result['median_ms']} ms**, p90 "
        f"{result['p90_ms']} ms, mean Δ (speakd − Whisper) {result['bias_ms']} ms, "
        f"{100 * result['within_100ms']:.0f} % within 100 ms.",
        "",
        "| sentence | words | matched | median abs ms | mean ms |",
        "|---|---:|---:|---:|---:|",
    ]
    for r in result["sentences"]:
        rows.append(
            f"| {r['text']} | {r['words']} | {r['matched']} | {r['median_ms']} | {r['bias_ms']} |"
        )
    return "\n".join(rows)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--threads", type=int, default=2, help="onnxruntime and Whisper threads")
    p.add_argument("--seed", type=int, default=1, help="the synthesis seed")
    p.add_argument("--no-bandwidth", action="store_true", help="skip the DRAM bandwidth probe")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
