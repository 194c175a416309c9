"""Batched ChatTTS decoding: throughput at B rows, long text batched vs sequential.

    speakd-tools bench batch --bundle BUNDLE [--rows 1,2,4,8] [--steps 96]
        [--sentences 8] [--prefill-chunk 0] [--threads 2] [--exact]

One engine with ``batch_size = max(rows)``; a decode step runs over the busy slots only, so n
concurrent rows cost what an engine with B = n costs. Lengths are forced (``min_new_token =
max_new_token``; random weights would stop anywhere), the audio is streamed with the engine's
schedule exactly as ``synthesize`` does (vocoder included), timings are wall clock:

* throughput: n one-sentence requests of ``--steps`` steps at once → audio seconds / wall second
  and RTF (wall / audio), for each n in ``--rows``; ``step only``: the audio seconds per second
  if the batched GPT step were the only cost (the bound its kernels set); ``identical``: the
  first request (the same text and seed at every n) gave the same PCM bytes as at the first n;
* long text: ``--sentences`` sentences (lengths 0.6–1.4 × ``--steps``) as one request, batched
  with pacing (the daemon's default: the sentence being played steps alone when its listener
  would catch up), batched without pacing (every row steps every time), and one sentence after
  the other (= B 1): time to the last sample, time to first audio, time to sentence 1's last
  sample, and what a real-time listener from the first sample hears: the total gap waiting for
  audio (stall) and the earliest start that plays without any gap (``engine.playback``).

Random weights show speed and plumbing, not voice quality. Prints a table and one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
from pathlib import Path
from typing import Any

from ..harness.machine import describe, line

LENGTH_FACTORS = (0.6, 1.4, 1.0, 0.8, 1.2, 1.0, 0.9, 1.1)
TEXT = (
    "The kitchen lights are on and the front door is locked.",
    "Tomorrow will be sunny with a light wind from the west in the afternoon.",
    "Your parcel arrived at ten.",
    "The washing machine has finished its cycle.",
    "Remember to take the umbrella, because rain is expected later this evening.",
    "The garage door is still open.",
    "Dinner is ready in five minutes.",
    "Good night, the alarm is set for seven.",
)
SAMPLES_PER_STEP, HOP, RATE = 512, 256, 24000


def _audio_s(steps: int) -> float:
    return (2 * steps - 1) * HOP / RATE


class _Run:
    """Times of one request's stream: first audio, each sentence's end, last sample."""

    def __init__(self, t0: float) -> None:
        self.t0 = t0
        self.first_audio: float | None = None
        self.sentence_end: dict[int, float] = {}
        self.samples = 0
        self.arrivals: list[tuple[float, float]] = []  # (s after t0, audio s) in playing order
        self.audio: list[Any] = []

    def consume(self, stream: Any) -> _Run:
        for index, audio in stream:
            now = time.perf_counter() - self.t0
            if self.first_audio is None:
                self.first_audio = now
            self.sentence_end[index] = now
            self.samples += len(audio)
            self.audio.append(audio)
            self.arrivals.append((now, len(audio) / RATE))
        return self

    @property
    def last(self) -> float:
        return max(self.sentence_end.values())


def _sentences(engine: Any, lengths: list[int], seed: int) -> list[Any]:
    from speakd.engines.base import SynthesisConfig
    from speakd.engines.chattts.batch import sentence_sampler
    from speakd.engines.chattts.batch_scheduler import Sentence

    out = []
    for i, n in enumerate(lengths):
        params = engine.audio_params(SynthesisConfig(extra={"max_new_token": n}))
        sampling = engine._sampling(SynthesisConfig(extra={"max_new_token": n, "min_new_token": n}))
        embeds = engine.prompt_embeds(TEXT[i % len(TEXT)], params)
        out.append(Sentence(embeds, sentence_sampler(sampling, engine.spec.eos_token, seed, i)))
    return out


def throughput(engine: Any, rows: int, steps: int) -> tuple[dict[str, float], bytes]:
    """``rows`` one-sentence requests at once, each ``steps`` long; and the first request's PCM
    (the same request at every width: its audio must not depend on what shares its steps)."""
    jobs = [_sentences(engine, [steps], seed=100 + r) for r in range(rows)]
    before = dict(engine.batch.counters)
    t0 = time.perf_counter()
    runs = [_Run(t0) for _ in range(rows)]
    threads = [
        threading.Thread(target=run.consume, args=(engine.batch.stream(job),))
        for run, job in zip(runs, jobs, strict=True)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    audio = sum(r.samples for r in runs) / RATE
    c = {k: v - before[k] for k, v in engine.batch.counters.items()}
    first = b"".join(a.tobytes() for a in runs[0].audio)
    steps = max(c["steps"], 1)
    parts = {k: c[f"{k}_ms"] / steps for k in ("step", "sample", "render", "prompt")}
    return {
        "ms_per_step": parts["step"],
        # what the rows would give if the GPT step were the only cost (renders, sampling and
        # prompts free): the bound the step's kernels set on this machine
        "step_only_audio_s_per_s": rows * SAMPLES_PER_STEP / RATE / (parts["step"] / 1e3),
        # the wall time of one iteration (one batched step), by part; "other": the Python
        # around them (pacing, slots, queues, threads) and the callers' threads
        "iteration_ms": {"wall": wall * 1e3 / steps, **parts}
        | {"other": wall * 1e3 / steps - sum(parts.values())},
        "ms_per_prompt_pass": c["prompt_ms"] / max(c["prompt_passes"], 1),
        "rows": rows,
        "wall_s": wall,
        "audio_s": audio,
        "audio_s_per_s": audio / wall,
        "rtf": wall / audio,
        "first_audio_s": min(r.first_audio or wall for r in runs),
        "prompt_passes": c["prompt_passes"],
        "renders": c["renders"],
        "render_runs": c["render_runs"],
    }, first


LONG_TEXT_RUNS = ("batched", "unpaced", "sequential")


def long_text(engine: Any, n_sentences: int, steps: int) -> dict[str, Any]:
    from .engine import playback

    lengths = [max(8, round(steps * LENGTH_FACTORS[i % 8])) for i in range(n_sentences)]
    runs = {}
    for name in ("batched", "unpaced"):
        engine.batch.paced = name == "batched"
        t0 = time.perf_counter()
        runs[name] = _Run(t0).consume(engine.batch.stream(_sentences(engine, lengths, seed=7)))
    engine.batch.paced = True
    t0 = time.perf_counter()
    seq = runs["sequential"] = _Run(t0)
    for i, s in enumerate(_sentences(engine, lengths, seed=7)):  # one by one: each alone (B = 1)
        seq.consume((i, audio) for _, audio in engine.batch.stream([s]))
    assert len({r.samples for r in runs.values()}) == 1, "the runs' audio lengths differ"
    out: dict[str, Any] = {
        "sentences": n_sentences,
        "steps": lengths,
        "audio_s": seq.samples / RATE,
        "speedup": seq.last / runs["batched"].last,
    }
    for name, run in runs.items():
        heard = playback(run.arrivals)
        out |= {
            f"{name}_last_sample_s": run.last,
            f"{name}_first_audio_s": run.first_audio,
            f"{name}_sentence1_end_s": run.sentence_end[0],
            f"{name}_stall_s": heard["stall_s"],
            f"{name}_gapless_first_audio_s": heard["gapless_first_audio_s"],
        }
    return out


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--bundle", type=Path, required=True)
    p.add_argument("--rows", default="1,2,4,8", help="concurrent rows to measure (default 1,2,4,8)")
    p.add_argument("--steps", type=int, default=96, help="decode steps per sentence (default 96)")
    p.add_argument("--sentences", type=int, default=8, help="long-text sentences (0 = skip)")
    p.add_argument("--prefill-chunk", type=int, default=0, help="prompt chunk (0 = whole)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument(
        "--exact",
        action="store_true",
        help="batch only what is batch-invariant, as the daemon does (default: batch everything, "
        "so graphs that are not invariant are measured too; their invariance is reported)",
    )


def run(args: argparse.Namespace) -> int:
    from speakd.engines.chattts.engine import ChatTTSEngine

    rows = [int(r) for r in args.rows.split(",")]
    batch = max([*rows, args.sentences])
    t = time.perf_counter()
    engine = ChatTTSEngine.load(
        args.bundle,
        threads=args.threads,
        batch_size=batch,
        prefill_chunk=args.prefill_chunk,
        batch_exact=args.exact,
    )
    load_s = time.perf_counter() - t
    _sentences_warm = _sentences(engine, [4], seed=0)
    list(engine.batch.stream(_sentences_warm))  # first-run allocations out of the numbers
    result: dict[str, Any] = {
        "bundle": str(args.bundle),
        "precision": engine.precision,
        "kv_dtype": engine.spec.kv_dtype,
        "batch_size": batch,
        "batch_invariant": engine.batch_invariant,
        "exact": args.exact,
        "prompts_batched": engine.batch.decoder.prompts_batched,
        "vocoder_batched": engine.vocoder.batched,
        "vocoder_batch_invariant": engine.vocoder.batch_invariant(engine.spec.hidden_size),
        "prefill_chunk": args.prefill_chunk,
        "threads": args.threads,
        "steps": args.steps,
        "load_s": load_s,
        "loadavg_start": os.getloadavg()[0],
        "min_rows": engine.batch.decoder.min_rows,
        "machine": describe(threads=args.threads),
    }
    cells = [throughput(engine, r, args.steps) for r in rows]
    for cell, pcm in cells:
        cell["identical"] = pcm == cells[0][1]  # the first request's PCM, against the first width
    result["throughput"] = [cell for cell, _ in cells]
    if args.sentences:
        result["long_text"] = long_text(engine, args.sentences, args.steps)
    result["loadavg_end"] = os.getloadavg()[0]

    print(
        f"bundle {args.bundle} ({engine.precision}), batch_size {batch}, threads {args.threads},"
        f" batch-invariant GPT: {engine.batch_invariant}, Decoder/Vocos:"
        f" {result['vocoder_batch_invariant']}; batched prompt passes: {result['prompts_batched']},"
        f" batched renders: {result['vocoder_batched']}"
    )
    print(line(result["machine"]))
    print(f"load average {result['loadavg_start']:.1f} → {result['loadavg_end']:.1f}")
    base = result["throughput"][0]
    print(
        f"{'rows':>4} {'wall s':>8} {'audio s':>8} {'audio s/s':>9} {'RTF':>6} {'× rows=1':>8}"
        f" {'ms/step':>8} {'step only':>9} {'ms/prompt':>9} {'renders/run':>11} {'identical':>9}"
    )
    for r in result["throughput"]:
        gain = r["audio_s_per_s"] / base["audio_s_per_s"]
        print(
            f"{r['rows']:>4} {r['wall_s']:>8.2f} {r['audio_s']:>8.2f} "
            f"{r['audio_s_per_s']:>9.3f} {r['rtf']:>6.3f} {gain:>8.2f}"
            f" {r['ms_per_step']:>8.1f} {r['step_only_audio_s_per_s']:>9.3f}"
            f" {r['ms_per_prompt_pass']:>9.1f}"
            f" {r['renders'] / max(r['render_runs'], 1):>11.2f} {r['identical']!s:>9}"
        )
    print("ms per iteration (one batched step):")
    for r in result["throughput"]:
        parts = ", ".join(f"{k} {v:.2f}" for k, v in r["iteration_ms"].items())
        print(f"  {r['rows']} rows: {parts}")
    if args.sentences:
        lt = result["long_text"]
        print(f"{lt['sentences']}-sentence text, {lt['audio_s']:.1f} s audio, steps {lt['steps']}:")
        print(f"  {'':<20}" + "".join(f"{name:>12}" for name in LONG_TEXT_RUNS))
        for what in ("last_sample", "first_audio", "sentence1_end", "stall", "gapless_first_audio"):
            cells = "".join(f"{lt[f'{name}_{what}_s']:>10.2f} s" for name in LONG_TEXT_RUNS)
            print(f"  {what:<20}{cells}")
        print(f"  batched last sample {lt['speedup']:.2f}× sooner than sequential")
    print(json.dumps(result))
    return 0
