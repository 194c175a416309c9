"""Load time, real-time factor and first audio of the VITS engine (the embedded Piper voice by
default), streamed by decoder window and one-shot.

    speakd-tools bench vits [--threads 2] [--runs 5] [--bundle PATH] [--no-bandwidth]

Prints one JSON object. RTF = synthesis time / audio duration (below 1 is faster than real time).
``first_audio`` times a 4-word and a 60-word single sentence through ``synthesize`` both ways:
``streamed`` is the engine as the daemon runs it (the flow and the decoder over growing windows,
``speakd.engines.vits.split``), ``one_shot`` one window over the whole sentence, which is the
unsplit graph's computation. Runs alternate between the two, and the median is reported (the
machine is shared: the load average is recorded), with the process's CPU time and its peak RSS
after the first run of each (streamed runs first, so a streamed peak is its own). ``snr_db``
compares the streamed audio with the one-shot audio (200 = identical). ``target_met``: the
60-word sentence's streamed first audio is at most 0.25 × its one-shot synthesis time. Last, the
machine line (``machine.py``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SENTENCE = "Please remember to close the kitchen window before you leave."  # 10 words
PARAGRAPH = (
    "Good morning. The weather today is mild with light wind from the west. "
    "Your first meeting starts at nine. Remember to take an umbrella."
)
SHORT_SENTENCE = "Turn the lights off."  # 4 words
LONG_SENTENCE = (  # 60 words, one sentence
    "When the evening train finally pulled into the small mountain station, the travellers "
    "gathered their bags, thanked the conductor for his patience during the long delay, and "
    "walked out into the cold clear air where their friends were waiting with lanterns, warm "
    "coats and a basket of fresh bread from the village bakery down the hill behind the old "
    "church."
)
FIRST_AUDIO_TARGET = 0.25  # streamed first audio / one-shot synthesis time, 60-word sentence


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--bundle", type=Path, default=None, help="a vits bundle (default: embedded)")
    p.add_argument(
        "--no-bandwidth",
        dest="bandwidth",
        action="store_false",
        help="skip the DRAM read bandwidth of the machine line (it reads 1 GiB a few times)",
    )


def run(args: argparse.Namespace) -> int:
    from ..harness.machine import describe, line
    from ..harness.stats import loadavg

    load_start = loadavg()
    t0 = time.perf_counter()
    from speakd.engines.vits.engine import VitsEngine

    t_import = time.perf_counter() - t0
    t0 = time.perf_counter()
    if args.bundle:
        engine = VitsEngine.from_bundle(args.bundle, threads=args.threads)
    else:
        engine = VitsEngine.embedded(threads=args.threads)
    t_load = time.perf_counter() - t0

    t_first_request = _timed(engine, SENTENCE, 0).total  # includes espeak-ng's start-up
    runs = [_timed(engine, SENTENCE, seed) for seed in range(1, args.runs + 1)]
    rtfs = [r.total / r.audio_s for r in runs]
    para = [_timed(engine, PARAGRAPH, seed) for seed in range(1, 3)]
    result: dict[str, Any] = {
        "bundle_id": engine.bundle_id,
        "threads": args.threads,
        "import_s": round(t_import, 3),
        "load_s": round(t_load, 3),
        "first_request_s": round(t_first_request, 3),
        "sentence": SENTENCE,
        "sentence_audio_s": round(runs[0].audio_s, 3),
        "sentence_synth_s_median": round(statistics.median(r.total for r in runs), 3),
        "rtf_median": round(statistics.median(rtfs), 3),
        "rtf_min": round(min(rtfs), 3),
        "paragraph_audio_s": round(para[0].audio_s, 3),
        "paragraph_first_chunk_s": round(min(r.first for r in para), 3),
        "paragraph_rtf": round(min(r.total / r.audio_s for r in para), 3),
        "first_audio": first_audio(engine, args.runs),
    }
    result["machine"] = {
        **describe(bandwidth=args.bandwidth, threads=args.threads),
        "loadavg_start": load_start,
        "loadavg_end": loadavg(),
    }
    result["machine_line"] = line(result["machine"])
    print(json.dumps(result, indent=1))
    return 0


def first_audio(engine: Any, runs: int) -> dict[str, Any]:
    """First chunk and whole synthesis, streamed and one-shot, for the 4- and 60-word sentences;
    the streamed/one-shot SNR; and whether the 60-word target is met."""
    import numpy as np

    from speakd.audio import join_chunks
    from speakd.engines.vits.split import SplitVoice, WindowPlan
    from speakd_tools.calibrate.metrics import snr_db

    from ..harness.stats import peak_rss_mb

    graphs = engine.graphs
    if not isinstance(graphs, SplitVoice):
        return {"streamed": False, "why": "the voice graph cannot be split (see the load log)"}
    streamed_plan = graphs.plan
    out: dict[str, Any] = {
        "plan": {
            "first_frames": streamed_plan.first,
            "growth": streamed_plan.growth,
            "largest_frames": streamed_plan.largest,
            "flow_reach": [graphs.flow_reach.left, graphs.flow_reach.right],
            "decoder_reach": [graphs.decoder_reach.left, graphs.decoder_reach.right],
            "hop": graphs.decoder_reach.hop,
        }
    }
    for name, text in (("words_4", SHORT_SENTENCE), ("words_60", LONG_SENTENCE)):
        times: dict[str, list[Timing]] = {"streamed": [], "one_shot": []}
        peak_mb: dict[str, float] = {}
        for _ in range(runs):
            for mode, plan in (("streamed", streamed_plan), ("one_shot", WindowPlan.one_shot())):
                graphs.plan = plan
                try:
                    times[mode].append(_timed(engine, text, seed=1))
                finally:
                    graphs.plan = streamed_plan
                # the process's peak so far: streamed runs first, so its value is theirs
                peak_mb.setdefault(mode, peak_rss_mb())
        row: dict[str, Any] = {
            "words": len(text.split()),
            "audio_s": round(times["streamed"][0].audio_s, 3),
        }
        audio = {}
        for mode, ts in times.items():
            row[mode] = {
                "first_audio_ms": round(1000 * statistics.median(t.first for t in ts), 1),
                "synth_ms": round(1000 * statistics.median(t.total for t in ts), 1),
                "cpu_ms": round(1000 * statistics.median(t.cpu for t in ts), 1),
                "chunks": len(ts[0].chunks),
                "peak_rss_mb": peak_mb[mode],
            }
            audio[mode] = join_chunks(ts[0].chunks).pcm
        ref, got = (np.frombuffer(audio[m], "<i2") for m in ("one_shot", "streamed"))
        row["snr_db"] = round(snr_db(ref, got), 1)
        row["max_diff_lsb"] = int(np.abs(ref.astype(np.int32) - got).max())
        row["first_audio_over_one_shot_synth"] = round(
            row["streamed"]["first_audio_ms"] / row["one_shot"]["synth_ms"], 3
        )
        out[name] = row
    ratio = out["words_60"]["first_audio_over_one_shot_synth"]
    out["target"] = f"words_60 streamed first audio <= {FIRST_AUDIO_TARGET} x one-shot synthesis"
    out["target_met"] = ratio <= FIRST_AUDIO_TARGET
    return out


@dataclass
class Timing:
    total: float  # seconds for the whole text
    first: float  # seconds to the first chunk
    cpu: float  # CPU seconds of the process (all threads: spinning pools count)
    audio_s: float
    chunks: list


def _timed(engine: Any, text: str, seed: int) -> Timing:
    from speakd.engines.base import SynthesisConfig

    start, cpu = time.perf_counter(), time.process_time()
    first = None
    chunks = []
    for chunk in engine.synthesize(text, SynthesisConfig(seed=seed)):
        first = first if first is not None else time.perf_counter() - start
        chunks.append(chunk)
    total, cpu = time.perf_counter() - start, time.process_time() - cpu
    return Timing(total, first or 0.0, cpu, sum(c.duration for c in chunks), chunks)
