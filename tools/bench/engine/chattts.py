"""``speakd-tools bench chattts``: ChatTTS's torch pipeline vs speakd fp32 / INT8 / 4-bit, one run.

Every contender gets the same text and the same number of decode steps (``min_new_token =
max_new_token = steps``, EOS never ends a run early). Phases, each contender in its own process so
that peak RSS is its own:

1. **GPT step, interleaved** (one process holding every contender's GPT): the decode step at a
   fixed context (the new token is written at slot ``ctx`` and attends to ``ctx + 1`` keys), in
   ``rounds`` rounds whose contender order rotates; the cell is the median of all timed steps,
   "best" is the lowest round median. speakd's step is ``GptRunner.step`` (the engine's decode
   step: code embedding on the host + one ``run_with_iobinding``); torch's is what
   ``GPT.generate`` does per step (``emb_code`` sum, LlamaModel with a DynamicCache and attention
   mask, the four ``head_code`` with weight norm cached).
2. **End to end** (one process per contender): ``engine.run_speakd`` (the engine's streamed
   ``synthesize``) and ``engine.run_torch`` (ChatTTS's modules driven like
   ``Chat.infer(skip_refine_text=True)``): RTF, time to first audio, in-loop ms/step, peak RSS.
3. **Start-up to READY**: a real ``speakd serve`` per bundle, timed from spawn to ``READY=1`` on a
   NOTIFY_SOCKET we own, page cache warmed first; then one uncached ``say`` over the socket gives
   the daemon's own time to first audio.
4. **Cache hits** (socket and MQTT): ``cache.measure`` and ``mqtt.measure`` (embedded VITS;
   a cache hit does not touch the engine).
5. **Throttled** (``--throttle NAME``, default int4): phase 2 again for that contender on a slow
   board made of this one: one intra-op thread pinned to CPU 0 and a busy loop pinned to CPU 1.
   Its playback stall is reported next to the unthrottled run's.

Last, with every contender's process gone, the machine: CPU, ISA flags and DRAM read bandwidth
with the bench's thread count (``machine.py``); each contender's bandwidth floor per context is
the bytes one decode step reads (``step_bytes``) ÷ that bandwidth, and the table prints the
measured GPT step ÷ floor (``floors``). torch reads the fp32 bundle's bytes (the same weights in
float32, an fp32 KV cache).

A contender whose bundle or checkpoint is missing is reported as missing. Random weights show
speed and plumbing, not voice quality. The load average is recorded with every phase.

This module holds the contenders, phases 2 and 5, the run of every phase and the outputs; phase 1
and the bandwidth floor are ``chattts_step``, phases 3 and 4 ``chattts_serve``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..harness.machine import describe
from ..harness.stats import in_child, loadavg
from .chattts_serve import cache_hits, startup
from .chattts_step import floors, projection, run_steps, step_bytes

log = logging.getLogger(__name__)

TEXT = "Please remember to close the kitchen window before you leave."  # 10 words
CONTENDERS = ("torch", "fp32", "int8", "int4")
ORT = ("fp32", "int8", "int4")
DEFAULT_BUNDLES = {
    "fp32": "models/chattts",
    "int8": "models/chattts-int8",
    "int4": "models/chattts-int4",
}


@dataclass
class Contender:
    name: str
    path: str  # bundle folder (ORT) or checkpoint folder (torch)
    missing: str = ""  # why it is not measured ("" = present)

    @property
    def present(self) -> bool:
        return not self.missing


def find_contenders(checkpoint: Path | None, bundles: dict[str, str]) -> list[Contender]:
    out = []
    if checkpoint is None:
        out.append(Contender("torch", "", "no --checkpoint given"))
    elif not (checkpoint / "asset" / "gpt" / "model.safetensors").is_file():
        out.append(Contender("torch", str(checkpoint), f"{checkpoint}/asset/gpt: no checkpoint"))
    else:
        out.append(Contender("torch", str(checkpoint)))
    for name in ORT:
        path = Path(bundles.get(name, DEFAULT_BUNDLES[name]))
        if not (path / "manifest.json").is_file():
            out.append(Contender(name, str(path), f"{path}: no bundle (manifest.json missing)"))
            continue
        manifest = json.loads((path / "manifest.json").read_text())
        out.append(Contender(name, str(path)))
        log.info("%s: %s (precision %s)", name, path, manifest.get("precision"))
    return out


def model_bytes(c: Contender) -> dict[str, int]:
    """Bytes on disk: a bundle's manifest files, or the checkpoint's asset/ tree."""
    if c.name == "torch":
        files = [p for p in Path(c.path, "asset").rglob("*") if p.is_file()]
        gpt = Path(c.path, "asset", "gpt", "model.safetensors").stat().st_size
        return {"total": sum(p.stat().st_size for p in files), "gpt": gpt}
    manifest = json.loads(Path(c.path, "manifest.json").read_text())
    files = manifest["files"]
    return {
        "total": sum(int(e["bytes"]) for e in files.values()),
        "gpt": sum(int(e["bytes"]) for f, e in files.items() if f.startswith("gpt.onnx")),
    }


# --- phase 2: end to end (engine.py's functions, one process per contender) ---------------------


def run_e2e(spec: dict[str, Any]) -> dict[str, Any]:
    from . import engine

    if spec.get("cpus"):
        os.sched_setaffinity(0, spec["cpus"])
    la0 = loadavg()
    if spec["name"] == "torch":
        r = engine.run_torch(
            Path(spec["path"]), Path(spec["voice_bundle"]), spec["steps"], spec["threads"],
            text=spec["text"],
        )  # fmt: skip
    else:
        r = engine.run_speakd(Path(spec["path"]), spec["steps"], spec["threads"], spec["text"])
    return {**r, "loadavg_before": la0, "loadavg_after": loadavg()}


def throttled(spec: dict[str, Any], timeout: float) -> dict[str, Any]:
    """Phase 2 for one contender with one thread pinned to CPU 0 while a busy loop spins on
    CPU 1: a slower board made of this one, to see whether its stream still plays through."""
    cpus = os.cpu_count() or 1
    hog_cpu = 1 if cpus > 1 else 0
    hog = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import os\nos.sched_setaffinity(0, {{{hog_cpu}}})\nwhile True: pass",
        ]
    )
    try:
        r = _child("e2e", {**spec, "threads": 1, "cpus": [0]}, timeout)
    finally:
        hog.kill()
        hog.wait()
    return {**r, "throttle": f"1 thread on CPU 0, busy loop on CPU {hog_cpu}"}


# --- orchestration --------------------------------------------------------------------------------


def _child(mode: str, spec: dict[str, Any], timeout: float) -> dict[str, Any]:
    """Run a phase in a fresh interpreter (own peak memory, no torch in ORT processes)."""
    return in_child(["chattts", "--child", mode, json.dumps(spec)], timeout)


@dataclass
class BenchOptions:
    checkpoint: Path | None
    bundles: dict[str, str]
    text: str = TEXT
    steps: int = 520
    contexts: tuple[int, ...] = (100, 500)
    rounds: int = 10
    steps_per_round: int = 10
    warmup: int = 3
    threads: int = 2
    starts: int = 3
    says: int = 200
    phases: tuple[str, ...] = ("steps", "e2e", "startup", "cache", "throttle")
    out: Path = Path("bench-out")
    timeout: float = 7200.0
    seed: int = 1
    bandwidth: bool = True  # measure DRAM read bandwidth for the machine line
    throttle: str = "int4"  # contender run again on one pinned thread beside a busy loop


def _save_partial(result: dict[str, Any], out: Path) -> None:
    """A long run keeps what it measured so far if a later phase fails."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench.partial.json").write_text(json.dumps(result, indent=1))


def run_bench(opts: BenchOptions) -> dict[str, Any]:
    contenders = find_contenders(opts.checkpoint, opts.bundles)
    present = [c for c in contenders if c.present]
    result: dict[str, Any] = {
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {"cpus": os.cpu_count(), "loadavg_start": loadavg(), "uname": os.uname()[4]},
        "options": {k: str(v) if isinstance(v, Path) else v for k, v in asdict(opts).items()},
        "contenders": {c.name: asdict(c) for c in contenders},
        "bytes": {c.name: model_bytes(c) for c in present},
    }
    if "steps" in opts.phases and present:
        log.info("phase 1: interleaved GPT steps at contexts %s", opts.contexts)
        spec = {
            "contenders": [asdict(c) for c in present],
            "contexts": list(opts.contexts),
            "rounds": opts.rounds,
            "steps_per_round": opts.steps_per_round,
            "warmup": opts.warmup,
            "threads": opts.threads,
            "seed": opts.seed,
        }
        result["steps"] = _child("steps", spec, opts.timeout)
        _save_partial(result, opts.out)
    voice = next((c.path for c in present if c.name in ORT), "")
    if "e2e" in opts.phases:
        result["e2e"] = {}
        for c in present:
            if c.name == "torch" and not voice:
                result["e2e"]["torch"] = {"missing": "needs a bundle for the voice's spk_emb"}
                continue
            log.info("phase 2: end to end, %s (%d steps)", c.name, opts.steps)
            spec = {
                "name": c.name, "path": c.path, "steps": opts.steps, "threads": opts.threads,
                "text": opts.text, "voice_bundle": voice,
            }  # fmt: skip
            result["e2e"][c.name] = _child("e2e", spec, opts.timeout)
            _save_partial(result, opts.out)
    named = {c.name: c for c in present}
    if "throttle" in opts.phases and opts.throttle in named and voice:
        c = named[opts.throttle]
        log.info("phase 5: end to end, %s, throttled", c.name)
        spec = {"name": c.name, "path": c.path, "steps": opts.steps, "text": opts.text}
        result["throttled"] = {c.name: throttled(spec, opts.timeout)}
        _save_partial(result, opts.out)
    if "startup" in opts.phases:
        result["startup"] = {}
        for c in present:
            if c.name in ORT:
                log.info("phase 3: speakd serve → READY, %s", c.name)
                result["startup"][c.name] = startup(
                    Path(c.path), opts.threads, opts.text, opts.starts, opts.timeout
                )
    if "cache" in opts.phases:
        log.info("phase 4: cache hits (socket, MQTT)")
        result["cache"] = cache_hits(opts.says, opts.threads)
    result["machine"]["loadavg_end"] = loadavg()
    # last, with every contender's process gone: the 1 GiB buffer would compete with them
    result["machine"].update(describe(bandwidth=opts.bandwidth, threads=opts.threads))
    per_step = {c.name: step_bytes(Path(c.path), opts.contexts) for c in present if c.name in ORT}
    result["bytes_per_step"] = per_step
    result["projection"] = projection(per_step)
    for name, cells in floors(result).items():
        result["contenders"][name].update(cells)
    return result


def write_outputs(result: dict[str, Any], out: Path) -> list[Path]:
    from .chattts_plots import plot_all
    from .chattts_report import table

    out.mkdir(parents=True, exist_ok=True)
    (out / "bench.json").write_text(json.dumps(result, indent=1))
    (out / "table.md").write_text(table(result) + "\n")
    return [out / "bench.json", out / "table.md", *plot_all(result, out)]


def _parse_bundles(items: list[str]) -> dict[str, str]:
    out = {}
    for item in items:
        name, sep, path = item.partition("=")
        if not sep or name not in ORT:
            raise ValueError(f"--bundles {item!r}: expected NAME=DIR with NAME in {', '.join(ORT)}")
        out[name] = path
    return out


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--checkpoint", type=Path, help="ChatTTS checkpoint (folder with asset/)")
    p.add_argument(
        "--bundles",
        nargs="*",
        default=[],
        metavar="NAME=DIR",
        help="fp32=DIR int8=DIR int4=DIR (default models/chattts, models/chattts-int8, "
        "models/chattts-int4); a missing one is reported as missing",
    )
    p.add_argument("--text", default=TEXT, help="the sentence every contender speaks")
    p.add_argument(
        "--steps", type=int, default=520, help="decode steps per contender (≥ 510 reaches ctx 500)"
    )
    p.add_argument(
        "--contexts",
        default="100,500",
        help="contexts for the interleaved GPT-step phase (default 100,500)",
    )
    p.add_argument("--rounds", type=int, default=10, help="interleaved rounds (default 10)")
    p.add_argument("--round-steps", type=int, default=10, help="timed steps per round and cell")
    p.add_argument("--threads", type=int, default=2, help="intra-op threads (torch and ORT)")
    p.add_argument("--starts", type=int, default=3, help="speakd serve starts per bundle")
    p.add_argument("--says", type=int, default=200, help="cache-hit requests (socket and MQTT)")
    p.add_argument(
        "--phases",
        default="steps,e2e,startup,cache,throttle",
        help="comma list of steps,e2e,startup,cache,throttle (default all)",
    )
    p.add_argument(
        "--throttle",
        default="int4",
        help="contender run again on one pinned thread beside a busy loop (default int4)",
    )
    p.add_argument("--out", type=Path, default=Path("bench-out"), help="JSON, table and PNGs")
    p.add_argument(
        "--render",
        type=Path,
        metavar="JSON",
        help="measure nothing: redraw the table and plots of a saved bench.json into --out",
    )
    # a phase in a fresh interpreter (stats.in_child): MODE (steps | e2e) and its JSON spec
    p.add_argument("--child", nargs=2, metavar=("MODE", "SPEC"), help=argparse.SUPPRESS)


def run(args: argparse.Namespace) -> int:
    if args.child:
        mode, spec = args.child[0], json.loads(args.child[1])
        print(json.dumps(run_steps(spec) if mode == "steps" else run_e2e(spec)))
        return 0
    if args.render:
        return render(args.render, args.out)
    phases = tuple(x for x in args.phases.split(",") if x)
    unknown = set(phases) - {"steps", "e2e", "startup", "cache", "throttle"}
    if unknown:
        raise ValueError(f"--phases: unknown {', '.join(sorted(unknown))}")
    opts = BenchOptions(
        checkpoint=args.checkpoint,
        bundles=_parse_bundles(args.bundles),
        text=args.text,
        steps=args.steps,
        contexts=tuple(int(x) for x in args.contexts.split(",")),
        rounds=args.rounds,
        steps_per_round=args.round_steps,
        threads=args.threads,
        starts=args.starts,
        says=args.says,
        phases=phases,
        out=args.out,
        throttle=args.throttle,
    )
    return _publish(run_bench(opts), args.out)


def render(saved: Path, out: Path) -> int:
    """Table and plots of a saved result; adds the board projection if the run predates it."""
    result = json.loads(saved.read_text())
    if "projection" not in result:
        bundles = {n: c["path"] for n, c in result["contenders"].items() if not c["missing"]}
        per_step = {n: step_bytes(Path(p), (100, 500)) for n, p in bundles.items() if n in ORT}
        result["bytes_per_step"] = per_step
        result["projection"] = projection(per_step)
    return _publish(result, out)


def _publish(result: dict[str, Any], out: Path) -> int:
    from .chattts_report import table

    files = write_outputs(result, out)
    print(table(result))
    print("wrote " + ", ".join(str(f) for f in files))
    return 0
