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
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .machine import describe
from .stats import in_child, loadavg, peak_rss_mb, percentile

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


# --- board projection ------------------------------------------------------------------------

STEP_MS_AUDIO = 512 / 24  # one GPT step = 512 samples at 24 kHz = 21.33 ms of audio
BOARDS = {  # effective DRAM read bandwidth, GB/s (published memcpy figures of the boards)
    "Raspberry Pi 5": (9.0, 10.5),
    "RK3588": (12.4, 12.4),
}
NOT_STREAMED = ("cos_cache", "sin_cache")  # RoPE tables: GQA reads one row per step


def step_bytes(bundle: Path, contexts: tuple[int, ...]) -> dict[str, Any]:
    """Bytes one decode step must read: every GPT weight once + the KV cache up to ``ctx``."""
    import onnx

    manifest = json.loads((bundle / "manifest.json").read_text())
    model = manifest["model"]
    graph = onnx.load(str(bundle / "gpt.onnx")).graph
    weights = sum(
        len(t.raw_data) or onnx.numpy_helper.to_array(t).nbytes
        for t in graph.initializer
        if t.name not in NOT_STREAMED
    )
    kv_item = 1 if model.get("kv_dtype") == "int8" else 4
    per_pos = 2 * model["num_layers"] * model["num_heads"] * model["head_dim"] * kv_item
    return {
        "weights": weights,
        "kv_dtype": model.get("kv_dtype", "float32"),
        "kv": {str(c): per_pos * c for c in contexts},
    }


def floors(result: dict[str, Any]) -> dict[str, dict[str, dict[str, float]]]:
    """Per contender: ``step_ms`` (the interleaved GPT step's median) and ``floor_ms`` (bytes one
    step reads ÷ the measured read bandwidth), each by context; empty when either is missing."""
    gbps = result.get("machine", {}).get("read_gbps")
    per_step = result.get("bytes_per_step") or {}
    out: dict[str, dict[str, dict[str, float]]] = {}
    for name, steps in (result.get("steps") or {}).items():
        if name not in result.get("contenders", {}):
            continue  # the phase's load averages and load times
        b = per_step.get("fp32" if name == "torch" else name)
        out[name] = {
            "step_ms": {ctx: cell["median_ms"] for ctx, cell in steps.items()},
            "floor_ms": {
                ctx: round((b["weights"] + kv) / (gbps * 1e9) * 1e3, 3)
                for ctx, kv in (b["kv"] if b and gbps else {}).items()
            },
        }
    return out


def projection(bytes_per_step: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Bandwidth floor per board: ms/step = bytes / bandwidth; GPT-only RTF = ms / 21.33."""
    out: dict[str, Any] = {}
    for name, b in bytes_per_step.items():
        for ctx, kv in b["kv"].items():
            total = b["weights"] + kv
            row: dict[str, Any] = {"mb_per_step": round(total / 1e6, 1)}
            for board, (lo, hi) in BOARDS.items():
                slow, fast = total / (lo * 1e9) * 1e3, total / (hi * 1e9) * 1e3
                row[board] = {
                    "ms_per_step": [round(fast, 1), round(slow, 1)],
                    "gpt_rtf": [round(fast / STEP_MS_AUDIO, 2), round(slow / STEP_MS_AUDIO, 2)],
                }
            out.setdefault(name, {})[ctx] = row
    return out


# --- phase 1: GPT step, interleaved -------------------------------------------------------------


class OrtStep:
    """The engine's decode step (``GptRunner.step``) at a fixed context."""

    def __init__(self, bundle: Path, threads: int, prefix: int, seed: int) -> None:
        import numpy as np

        from speakd.engines.bundle import load_bundle
        from speakd.engines.chattts.gpt_runner import GptRunner, ModelSpec
        from speakd.engines.chattts.ortsession import make_session

        b = load_bundle(bundle, verify=False)
        spec = ModelSpec.from_manifest(b.manifest["model"])
        emb_code = np.load(b.file("emb_code.npy"))
        self.runner = GptRunner(make_session(b.file("gpt.onnx"), threads), spec, emb_code)
        rng = np.random.default_rng(seed)
        self.codes = rng.integers(0, spec.num_audio_tokens - 1, (64, spec.num_vq))
        embeds = emb_code[np.arange(spec.num_vq), rng.integers(0, 625, (prefix, spec.num_vq))]
        self.runner.prompt(embeds.sum(axis=1)[None].astype(np.float32))  # fills slots 0..prefix-1
        self.i = 0

    def __call__(self, ctx: int) -> None:
        self.runner.position = ctx
        self.runner.step(self.codes[self.i % len(self.codes)])
        self.i += 1


class TorchStep:
    """One ``GPT.generate`` code step of ChatTTS's own modules, at a fixed context."""

    def __init__(self, checkpoint: Path, threads: int, contexts: list[int], seed: int) -> None:
        import torch
        from torch.nn.utils import parametrize
        from transformers import DynamicCache

        from speakd_tools.chattts.modules import load_modules

        torch.set_num_threads(threads)
        self.torch, self.parametrize = torch, parametrize
        self.mods = load_modules(checkpoint)
        self.gpt = self.mods.gpt
        g = torch.Generator().manual_seed(seed)
        q = self.mods.sizes.num_vq
        self.codes = torch.randint(0, 625, (64, 1, 1, q), generator=g)
        self.caches: dict[int, Any] = {}
        with torch.inference_mode():
            for ctx in contexts:
                ids = torch.randint(0, 625, (1, ctx, q), generator=g)
                emb = torch.stack([self.gpt.emb_code[i](ids[:, :, i]) for i in range(q)], 3).sum(3)
                cache = DynamicCache()
                self.gpt.gpt(inputs_embeds=emb, past_key_values=cache, use_cache=True)
                self.caches[ctx] = cache
        self.i = 0

    def __call__(self, ctx: int) -> None:
        torch, gpt, q = self.torch, self.gpt, self.mods.sizes.num_vq
        cache = self.caches[ctx]
        ids = self.codes[self.i % len(self.codes)]
        self.i += 1
        with torch.inference_mode():
            extra = cache.get_seq_length() - ctx
            if extra:  # drop the previous timed step's token (transformers 5: crop(-n))
                cache.crop(-extra)
            emb = torch.stack([gpt.emb_code[i](ids[:, :, i]) for i in range(q)], 3).sum(3)
            out = gpt.gpt(
                inputs_embeds=emb,
                attention_mask=torch.ones(1, ctx + 1, dtype=torch.long),
                position_ids=torch.tensor([[ctx]]),
                cache_position=torch.tensor([ctx]),
                past_key_values=cache,
                use_cache=True,
            )
            h = out.last_hidden_state.float()
            with self.parametrize.cached():
                logits = torch.empty(1, 1, 626, q)
                for i in range(q):
                    logits[..., i] = gpt.head_code[i](h)


def run_steps(spec: dict[str, Any]) -> dict[str, Any]:
    """Phase 1 in this process: every present contender loaded, interleaved rounds."""
    contexts: list[int] = spec["contexts"]
    rounds, steps, warm = spec["rounds"], spec["steps_per_round"], spec["warmup"]
    timers: dict[str, Any] = {}
    load_s: dict[str, float] = {}
    for c in spec["contenders"]:
        t0 = time.perf_counter()
        if c["name"] == "torch":
            timers["torch"] = TorchStep(Path(c["path"]), spec["threads"], contexts, spec["seed"])
        else:
            timers[c["name"]] = OrtStep(
                Path(c["path"]), spec["threads"], max(contexts), spec["seed"]
            )
        load_s[c["name"]] = round(time.perf_counter() - t0, 2)
    names = list(timers)
    times: dict[str, dict[int, list[list[float]]]] = {n: {x: [] for x in contexts} for n in names}
    la0 = loadavg()
    for r in range(rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for ctx in contexts:
            for n in order:
                step = timers[n]
                for _ in range(warm):
                    step(ctx)
                got = []
                for _ in range(steps):
                    t0 = time.perf_counter()
                    step(ctx)
                    got.append((time.perf_counter() - t0) * 1e3)
                times[n][ctx].append(got)
    out: dict[str, Any] = {"loadavg_before": la0, "loadavg_after": loadavg(), "load_s": load_s}
    for n in names:
        out[n] = {}
        for ctx in contexts:
            flat = [t for rnd in times[n][ctx] for t in rnd]
            out[n][str(ctx)] = {
                "median_ms": round(statistics.median(flat), 3),
                "best_round_ms": round(min(statistics.median(rnd) for rnd in times[n][ctx]), 3),
                "p90_ms": round(percentile(flat, 90), 3),
                "n": len(flat),
            }
    return out


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


# --- phase 3: start-up to READY -----------------------------------------------------------------


def _warm_page_cache(bundle: Path) -> None:
    for f in bundle.iterdir():
        if f.is_file():
            with f.open("rb") as fh:
                while fh.read(1 << 24):
                    pass


def startup(bundle: Path, threads: int, text: str, starts: int, timeout: float) -> dict[str, Any]:
    """``speakd serve`` with this bundle: seconds from spawn to READY=1 (each start), the
    daemon's VmHWM at READY, then one uncached ``say`` → the ``started`` event's latency."""
    from speakd.library.client import Client

    _warm_page_cache(bundle)
    with tempfile.TemporaryDirectory(prefix="speakd-bench-start-") as tmp:
        work = Path(tmp)
        sock = work / "speakd.sock"
        (work / "speakd.toml").write_text(
            f'[engine]\nkind = "chattts"\nbundle = "{bundle}"\nprecision = "exact"\n'
            f'threads = {threads}\nfallback_text = ""\n\n[audio]\nsink = "null"\n\n'
            f'[socket]\npath = "{sock}"\nssip_path = ""\n\n[cache]\npath = "{work / "c.db"}"\n'
        )
        notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        notify.bind(str(work / "notify.sock"))
        env = {**os.environ, "NOTIFY_SOCKET": str(work / "notify.sock")}
        env["SPEAKD_LOG_LEVEL"] = "WARNING"
        ready, rss, ttfa = [], [], None
        for n in range(starts):
            t0 = time.monotonic()
            proc = subprocess.Popen(
                [sys.executable, "-m", "speakd", "serve", "--config", str(work / "speakd.toml")],
                stdout=subprocess.DEVNULL,
                stderr=(work / f"serve{n}.log").open("wb"),
                env=env,
            )
            try:
                notify.settimeout(1.0)
                while b"READY=1" not in _recv(notify):
                    if proc.poll() is not None or time.monotonic() - t0 > timeout:
                        raise RuntimeError(
                            f"speakd serve {bundle} never sent READY=1: "
                            + (work / f"serve{n}.log").read_text()[-2000:]
                        )
                ready.append(round(time.monotonic() - t0, 3))
                rss.append(peak_rss_mb(proc.pid))
                if n == starts - 1:
                    with Client(str(sock), timeout=timeout) as c:
                        for ev in c.say({"text": text, "id": "bench-ttfa"}, wait=True):
                            if ev["event"] == "started":
                                ttfa = float(ev["latency_ms"])
                                break
                            if ev["event"] == "error":
                                raise RuntimeError(f"say failed: {ev}")
            finally:
                proc.terminate()
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    proc.kill()
        notify.close()
    return {
        "ready_s": ready,
        "ready_s_warm": min(ready[1:] or ready),
        "vmhwm_at_ready_mb": rss,
        "daemon_first_audio_ms": ttfa,
        "loadavg": loadavg(),
    }


def _recv(sock: socket.socket) -> bytes:
    try:
        return sock.recv(4096)
    except TimeoutError:
        return b""


# --- phase 4: cache hits --------------------------------------------------------------------------


def cache_hits(says: int, threads: int) -> dict[str, Any]:
    """``bench cache`` (socket, real daemon) and ``bench mqtt`` (real mosquitto), cached clips."""
    import asyncio

    from . import cache, mqtt

    out: dict[str, Any] = {"loadavg_before": loadavg()}
    for name in ("speakd", "paho"):  # per-request INFO lines would drown the table
        logging.getLogger(name).setLevel(logging.WARNING)
    ns = argparse.Namespace(
        prompts=8, jobs=[1], threads=threads, says=says, misses=0, bundle=None, pack=None
    )
    r = cache.measure(ns)
    out["socket"] = {"server_ms": r["hit_server_ms"], "client_ms": r["hit_client_ms"]}
    mosquitto = shutil.which("mosquitto")
    if mosquitto is None:
        out["mqtt"] = {"missing": "mosquitto not installed"}
        return out
    with tempfile.TemporaryDirectory(prefix="speakd-bench-mqtt-") as tmp:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        conf = Path(tmp, "m.conf")
        conf.write_text(f"listener {port} 127.0.0.1\nallow_anonymous true\nset_tcp_nodelay true\n")
        broker = subprocess.Popen([mosquitto, "-c", str(conf)], stderr=subprocess.DEVNULL)
        try:
            time.sleep(0.5)
            ns = argparse.Namespace(
                host="127.0.0.1", port=port, count=says, qos=1, threads=threads,
                client_nagle=False, miss=False,
            )  # fmt: skip
            r = asyncio.run(mqtt.measure(ns))
            out["mqtt"] = {"say_to_first_sample_ms": r["say_to_first_sample_ms"], "qos": 1}
        finally:
            broker.terminate()
            broker.wait(10)
    out["loadavg_after"] = loadavg()
    return out


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
    from .plots import plot_all
    from .report import table

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
    from .report import table

    files = write_outputs(result, out)
    print(table(result))
    print("wrote " + ", ".join(str(f) for f in files))
    return 0
