"""Pitch bench: what shifting a request's pitch (``speakd.audio.pitch``) adds to the embedded voice.

    speakd-tools bench pitch [--semitones 6] [--repeat 5] [--threads 2] [--json]

For a letter (an Orca key echo), a sentence and a paragraph, the embedded Piper voice's chunks
are made once, then shifted ``--repeat`` times the way the daemon's synthesis thread shifts
them (one ``Shifter`` per segment, chunk by chunk):

- ``first chunk ms``: the shift of the first chunk alone, what the first audio waits for on top
  of the engine (p50 of the repeats);
- ``ms per audio s``: all chunks' shifting over the seconds of audio (p50), next to the
  engine's own synthesis time per audio second;
- the first use in a process also imports pedalboard, once (``import s``);
- ``seams``: the paragraph shifted chunk by chunk against the same audio shifted in one call, as
  the mean log-spectral distance of 512-sample frames within 90 ms of a chunk seam and elsewhere
  (a phase vocoder's output differs from run to run in phase, so not a waveform SNR).

Prints a Markdown table that starts with the machine line (``machine.py``).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import numpy as np

from speakd.audio import AudioChunk
from speakd.engines.base import SynthesisConfig

from .machine import describe
from .machine import line as machine_line
from .stats import loadavg, percentile

TEXTS = {
    "letter": "T",
    "sentence": "The washing machine has finished, and the dryer is next.",
    "paragraph": (
        "Attention please. The train to the airport leaves from platform four in ten minutes. "
        "Passengers for the city centre should change at the next stop. We apologise for the "
        "delay this morning, which was caused by a signal fault near the river bridge."
    ),
}


def _shift_all(chunks: list[AudioChunk], semitones: float) -> tuple[float, float]:
    """(ms for the first chunk, ms for all of them), as one segment."""
    from speakd.audio.pitch import Shifter

    shifter = Shifter(semitones)
    t0 = time.perf_counter()
    shifter.shift(chunks[0])
    first = time.perf_counter() - t0
    for chunk in chunks[1:]:
        shifter.shift(chunk)
    return first * 1000, (time.perf_counter() - t0) * 1000


def _log_spectrum(x: np.ndarray, n: int = 512, hop: int = 128) -> np.ndarray:
    frames = np.lib.stride_tricks.sliding_window_view(x, n)[::hop] * np.hanning(n)
    return np.log10(np.abs(np.fft.rfft(frames)) + 1e-4)


def seams(chunks: list[AudioChunk], semitones: float) -> dict[str, float]:
    """Log-spectral distance of the chunk-by-chunk shift to a one-call shift, near seams and not."""
    from speakd.audio.pitch import Shifter, _pitch_shift

    rate, hop = chunks[0].sample_rate, 128
    whole = np.concatenate([c.samples() for c in chunks]).astype(np.float32) / 32768.0
    once = _pitch_shift()(semitones=semitones).process(whole, rate)
    shifter = Shifter(semitones)
    chunked = np.concatenate([shifter.shift(c).samples() for c in chunks]) / 32768.0
    distance = np.sqrt(np.mean((_log_spectrum(chunked) - _log_spectrum(once)) ** 2, axis=1))
    near = np.zeros(distance.size, bool)
    reach = round(0.09 * rate)
    for seam in np.cumsum([c.frames for c in chunks])[:-1]:
        near[max(0, (seam - reach) // hop) : (seam + reach) // hop] = True
    return {
        "seams": len(chunks) - 1,
        "near": round(float(distance[near].mean()), 3),
        "elsewhere": round(float(distance[~near].mean()), 3),
    }


def measure(args: argparse.Namespace) -> dict[str, Any]:
    from speakd.engines.vits import VitsEngine

    engine = VitsEngine.embedded(threads=args.threads)
    t0 = time.perf_counter()
    from speakd.audio.pitch import _pitch_shift

    _pitch_shift()
    import_s = time.perf_counter() - t0
    cases, chunks = {}, []
    for name, text in TEXTS.items():
        t0 = time.perf_counter()
        chunks = list(engine.synthesize(text, SynthesisConfig(seed=1)))
        synth_ms = (time.perf_counter() - t0) * 1000
        audio_s = sum(c.duration for c in chunks)
        runs = [_shift_all(chunks, args.semitones) for _ in range(args.repeat)]
        cases[name] = {
            "audio_s": round(audio_s, 2),
            "chunks": len(chunks),
            "first_chunk_ms": round(percentile([r[0] for r in runs], 50), 1),
            "shift_ms_per_audio_s": round(percentile([r[1] for r in runs], 50) / audio_s, 1),
            "synth_ms_per_audio_s": round(synth_ms / audio_s, 1),
        }
    return {
        "semitones": args.semitones,
        "repeat": args.repeat,
        "import_s": round(import_s, 2),
        "cases": cases,
        "seams": seams(chunks, args.semitones),  # the paragraph's
        "loadavg": loadavg(),
        "machine": describe(not args.no_bandwidth),
    }


def table(result: dict[str, Any]) -> str:
    rows = [
        machine_line(result["machine"]),
        f"Load average {result['loadavg']}; {result['semitones']:+g} semitones, "
        f"{result['repeat']} shifts per case; pedalboard's import: {result['import_s']} s, once.",
        "",
        "| text | audio s | chunks | first chunk ms | shift ms per audio s "
        "| synthesis ms per audio s |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, case in result["cases"].items():
        rows.append(
            f"| {name} | {case['audio_s']} | {case['chunks']} | {case['first_chunk_ms']} "
            f"| {case['shift_ms_per_audio_s']} | {case['synth_ms_per_audio_s']} |"
        )
    seam = result["seams"]
    rows += [
        "",
        f"Paragraph shifted chunk by chunk vs in one call ({seam['seams']} seams): log-spectral "
        f"distance {seam['near']} within 90 ms of a seam, {seam['elsewhere']} elsewhere.",
    ]
    return "\n".join(rows)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--semitones", type=float, default=6.0, help="the shift (Orca's capitals: 6)")
    p.add_argument("--repeat", type=int, default=5, help="shifts of each text's chunks")
    p.add_argument("--threads", type=int, default=2, help="the voice's onnxruntime threads")
    p.add_argument("--no-bandwidth", action="store_true", help="skip the DRAM bandwidth probe")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
