"""Load time and real-time factor of the VITS engine (the embedded Piper voice by default).

    speakd-tools bench vits [--threads 2] [--runs 5] [--bundle PATH]

Prints one JSON object. RTF = synthesis time / audio duration (below 1 is faster than real time);
timings are wall-clock and noisy on a shared machine, so it reports the median and the min.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

SENTENCE = "Please remember to close the kitchen window before you leave."  # 10 words
PARAGRAPH = (
    "Good morning. The weather today is mild with light wind from the west. "
    "Your first meeting starts at nine. Remember to take an umbrella."
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--bundle", type=Path, default=None, help="a vits bundle (default: embedded)")


def run(args: argparse.Namespace) -> int:

    t0 = time.perf_counter()
    from speakd.audio import join_chunks
    from speakd.engines.base import SynthesisConfig
    from speakd.engines.vits import VitsEngine

    t_import = time.perf_counter() - t0
    t0 = time.perf_counter()
    if args.bundle:
        engine = VitsEngine.from_bundle(args.bundle, threads=args.threads)
    else:
        engine = VitsEngine.embedded(threads=args.threads)
    t_load = time.perf_counter() - t0

    def timed(text: str, seed: int) -> tuple[float, float, float]:
        """(total seconds, seconds to the first chunk, audio seconds)."""
        start = time.perf_counter()
        first = None
        chunks = []
        for chunk in engine.synthesize(text, SynthesisConfig(seed=seed)):
            first = first if first is not None else time.perf_counter() - start
            chunks.append(chunk)
        return time.perf_counter() - start, first or 0.0, join_chunks(chunks).duration

    t_first_request = timed(SENTENCE, 0)[0]  # includes espeak-ng's one-time start-up
    runs = [timed(SENTENCE, seed) for seed in range(1, args.runs + 1)]
    rtfs = [total / audio for total, _, audio in runs]
    para = [timed(PARAGRAPH, seed) for seed in range(1, 3)]
    print(
        json.dumps(
            {
                "bundle_id": engine.bundle_id,
                "threads": args.threads,
                "import_s": round(t_import, 3),
                "load_s": round(t_load, 3),
                "first_request_s": round(t_first_request, 3),
                "sentence": SENTENCE,
                "sentence_audio_s": round(runs[0][2], 3),
                "sentence_synth_s_median": round(statistics.median(r[0] for r in runs), 3),
                "rtf_median": round(statistics.median(rtfs), 3),
                "rtf_min": round(min(rtfs), 3),
                "paragraph_audio_s": round(para[0][2], 3),
                "paragraph_first_chunk_s": round(min(r[1] for r in para), 3),
                "paragraph_rtf": round(min(r[0] / r[2] for r in para), 3),
            },
            indent=1,
        )
    )
    return 0
