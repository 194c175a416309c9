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

Each row twice: ``rubber band`` (``Shifter``, what engines that cannot slow down get) and
``resample``, a Piper voice's own (``speakd.audio.pitch.resampled``: the voice's chunks made
``slower`` and read back faster), up to ``pitch.RESAMPLED`` semitones. ``F0``: the paragraph's
median F0 (YIN on voiced 40 ms frames) shifted against unshifted, in semitones; ``exact`` is the
unshifted audio resampled by the ratio (its F0 moves by exactly ``--semitones``): what this
estimator reads for a perfect shift.

Prints a Markdown table that starts with the machine line (``machine.py``).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import numpy as np

from speakd.audio import AudioChunk
from speakd.engines.base import SynthesisConfig

from ..harness.machine import describe
from ..harness.machine import line as machine_line
from ..harness.stats import loadavg, percentile

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


def _resample_all(chunks: list[AudioChunk], semitones: float) -> tuple[float, float]:
    """(ms for the first chunk, ms for all of them), resampled as the engine does."""
    from speakd.audio.pitch import ratio, resampled

    out = resampled(iter(chunks), ratio(semitones))
    t0 = time.perf_counter()
    next(out)
    first = time.perf_counter() - t0
    list(out)
    return first * 1000, (time.perf_counter() - t0) * 1000


def f0(samples: np.ndarray, rate: int) -> float:
    """Median F0 in Hz over voiced 40 ms frames (YIN's cumulative mean normalised difference,
    threshold 0.15, 60–400 Hz, parabolic interpolation)."""
    n, found = int(0.04 * rate), []
    lo, hi = rate // 400, rate // 60
    for i in range(0, samples.size - n - hi, n // 2):
        frame = samples[i : i + n + hi].astype(np.float64)
        if np.sqrt(np.mean(frame[:n] ** 2)) < 0.02:
            continue
        d = np.array([np.sum((frame[:n] - frame[k : k + n]) ** 2) for k in range(hi + 1)])
        cmnd = d[1:] * np.arange(1, hi + 1) / np.maximum(np.cumsum(d[1:]), 1e-12)
        below = np.flatnonzero(cmnd[lo - 1 :] < 0.15)
        if not below.size:
            continue
        k = lo - 1 + below[0]
        while k + 1 < cmnd.size and cmnd[k + 1] < cmnd[k]:
            k += 1
        a, b, c = cmnd[k - 1], cmnd[k], cmnd[min(k + 1, cmnd.size - 1)]
        shift = 0.5 * (a - c) / (a - 2 * b + c) if a - 2 * b + c else 0.0
        found.append(rate / (k + 1 + shift))
    return float(np.median(found)) if found else float("nan")


def measure(args: argparse.Namespace) -> dict[str, Any]:
    from speakd.audio import join_chunks
    from speakd.audio.pitch import RESAMPLED, ratio, slower
    from speakd.audio.resample import Resampler
    from speakd.engines.vits.engine import VitsEngine

    engine = VitsEngine.embedded(threads=args.threads)
    t0 = time.perf_counter()
    from speakd.audio.pitch import _pitch_shift

    _pitch_shift()
    import_s = time.perf_counter() - t0
    st = args.semitones
    methods = {"rubber band": _shift_all}
    if abs(st) <= RESAMPLED:
        methods["resample"] = _resample_all
    cases, chunks, slow = {}, [], []
    for name, text in TEXTS.items():
        t0 = time.perf_counter()
        chunks = list(engine.synthesize(text, SynthesisConfig(seed=1)))
        synth_ms = (time.perf_counter() - t0) * 1000
        slow = list(engine._sentences(text, SynthesisConfig(seed=1), None, slower(st)))
        audio_s = sum(c.duration for c in chunks)
        for method, shift in methods.items():
            made = chunks if method == "rubber band" else slow
            runs = [shift(made, st) for _ in range(args.repeat)]
            cases[f"{name}, {method}"] = {
                "audio_s": round(audio_s, 2),
                "chunks": len(made),
                "first_chunk_ms": round(percentile([r[0] for r in runs], 50), 2),
                "shift_ms_per_audio_s": round(percentile([r[1] for r in runs], 50) / audio_s, 2),
                "synth_ms_per_audio_s": round(synth_ms / audio_s, 1),
            }
    rate = chunks[0].sample_rate
    plain = f0(join_chunks(chunks).samples() / 32768.0, rate)

    whole = join_chunks(chunks).samples() / 32768.0
    exact = Resampler(ratio(st))  # the unshifted audio read faster: F0 × ratio, exactly
    heard = {
        "exact": np.concatenate([exact.feed(whole), exact.flush()]),
        "rubber band": join_chunks(shifted_by_rubber_band(chunks, st)).samples() / 32768.0,
    }
    if "resample" in methods:
        made = engine.synthesize(TEXTS["paragraph"], SynthesisConfig(seed=1, pitch=st))
        heard["resample"] = join_chunks(made).samples() / 32768.0
    return {
        "semitones": st,
        "repeat": args.repeat,
        "import_s": round(import_s, 2),
        "cases": cases,
        "f0_semitones": {
            m: round(12 * float(np.log2(f0(a, rate) / plain)), 2) for m, a in heard.items()
        },
        "f0_plain_hz": round(plain, 1),
        "seams": seams(chunks, st),  # the paragraph's, Rubber Band
        "loadavg": loadavg(),
        "machine": describe(not args.no_bandwidth),
    }


def shifted_by_rubber_band(chunks: list[AudioChunk], semitones: float) -> list[AudioChunk]:
    from speakd.audio.pitch import Shifter

    shifter = Shifter(semitones)
    return [shifter.shift(c) for c in chunks]


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
    f0s = ", ".join(f"{m} {v:+.2f}" for m, v in result["f0_semitones"].items())
    rows += [
        "",
        f"Paragraph shifted chunk by chunk vs in one call ({seam['seams']} seams), Rubber Band: "
        f"log-spectral distance {seam['near']} within 90 ms of a seam, {seam['elsewhere']} "
        "elsewhere; resampled, the stream is the one call's samples (distance 0).",
        f"Paragraph's median F0 {result['f0_plain_hz']} Hz; shifted by (semitones): {f0s}.",
    ]
    return "\n".join(rows)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--semitones", type=float, default=6.0, help="the shift (Orca's capitals: 6)")
    p.add_argument("--repeat", type=int, default=5, help="shifts of each text's chunks")
    p.add_argument("--threads", type=int, default=2, help="the voice's onnxruntime threads")
    p.add_argument("--no-bandwidth", action="store_true", help="skip the DRAM bandwidth probe")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
