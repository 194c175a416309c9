"""``speakd-tools rknn convert``: a bundle's NPU-suited graphs → ``.rknn`` files for one Rockchip
target, fp16 and int8, each checked in the toolkit's simulator against onnxruntime.

This half runs in the host-tools venv: it takes the graphs and their inputs, made from the
calibration corpus through the device engine itself (tools/rknn/sources.py: the Piper voice's flow
output ``z``; ChatTTS's hidden states and mels), writes a job and runs tools/rknn/worker.py with
the toolkit venv's Python (``make rknn-env``). Back here it compares the simulator's outputs
with onnxruntime's on the same windows, per graph and per whole sentence (windows stitched), and
for a Piper voice transcribes both with Whisper (WER).

Output, in the bundle (or ``--out``): ``rknn/<graph>.<precision>.rknn``, ``rknn/report.json`` and
a manifest ``rknn`` section with their hashes. The manifest's ``files`` stay as they were, so the
bundle's CPU id (and its cache) does not change: NPU audio is another precision and the runtime
names it apart.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from speakd.engines.bundle import MANIFEST, file_entry
from speakd.engines.rknn_session import plan, stitch, windows

from ..calibrate.bundle_out import write_manifest
from ..calibrate.metrics import snr_db
from .graphs import CPU_ONLY, NpuGraph
from .sources import ConvertOptions, Prepared, RknnError, prepare

log = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("worker.py")
RKNN_DIR = "rknn"
PRECISIONS = ("fp16", "int8")
WORKER_TIMEOUT_S = 3600


def toolkit_python(explicit: Path | None) -> Path:
    """The toolkit venv's interpreter: ``--rknn-python``, ``$SPEAKD_RKNN_PYTHON``, or the
    checkout's ``.venv-rknn`` (what ``make rknn-env`` builds)."""
    env = os.environ.get("SPEAKD_RKNN_PYTHON")
    path = explicit or (Path(env) if env else REPO / ".venv-rknn" / "bin" / "python")
    if not path.is_file():
        raise RknnError(
            f"{path}: no rknn-toolkit2 venv; build it with `make rknn-env` in the speakd "
            'checkout (docs/boards.md, "The RK3588\'s NPU")'
        )
    return path


# --- the toolkit run -------------------------------------------------------------------------


def _cuts(graph: NpuGraph, x: np.ndarray) -> list[tuple[int, int, int]]:
    return plan(x.shape[-1], graph.window, graph.context)


def _windows(graph: NpuGraph, x: np.ndarray) -> np.ndarray:
    return windows(x, _cuts(graph, x), graph.window)


def _calibration_set(graph: NpuGraph, inputs: list[np.ndarray], work: Path, cap: int) -> Path:
    """The int8 dataset file: one ``.npy`` window per line, at most ``cap`` evenly spread."""
    wins = np.concatenate([_windows(graph, x) for x in inputs])
    keep = np.linspace(0, len(wins) - 1, min(cap, len(wins))).round().astype(int)
    folder = work / f"calib-{graph.name}"
    folder.mkdir()
    lines = []
    for i in sorted(set(keep.tolist())):
        np.save(folder / f"{i}.npy", wins[i : i + 1])
        lines.append(str(folder / f"{i}.npy"))
    dataset = folder / "dataset.txt"
    dataset.write_text("\n".join(lines) + "\n")
    return dataset


def run_toolkit(prep: Prepared, opts: ConvertOptions, work: Path, rknn_dir: Path) -> dict:
    job_graphs = []
    for g in prep.graphs:
        eval_windows = np.concatenate([_windows(g, x) for x in prep.evaluate[g.name]])
        np.save(work / f"eval-{g.name}.npy", eval_windows)
        dataset = _calibration_set(g, prep.calib[g.name], work, opts.max_calib_windows)
        builds = []
        for precision in PRECISIONS:
            build = {
                "precision": precision,
                "rknn": str(rknn_dir / f"{g.name}.{precision}.rknn"),
                "outputs": str(work / f"sim-{g.name}-{precision}.npz"),
            }
            if precision == "int8":
                build |= {"dataset": str(dataset), "algorithm": opts.algorithm}
            builds.append(build)
        job_graphs.append(
            {
                "name": g.name,
                "onnx": str(g.onnx),
                "input": g.input,
                "shape": g.shape,
                "eval": str(work / f"eval-{g.name}.npy"),
                "builds": builds,
            }
        )
    job = {"target": opts.target, "graphs": job_graphs, "result": str(work / "result.json")}
    (work / "job.json").write_text(json.dumps(job, indent=2))
    python = toolkit_python(opts.rknn_python)
    toolkit_log = work / "toolkit.log"
    log.info("converting %d graphs for %s with %s", len(prep.graphs), opts.target, python)
    with toolkit_log.open("w") as f:
        r = subprocess.run(
            [str(python), str(WORKER), str(work / "job.json")],
            stdout=f,
            stderr=subprocess.STDOUT,
            timeout=WORKER_TIMEOUT_S,
            check=False,
        )
    if r.returncode != 0 or not (work / "result.json").is_file():
        tail = toolkit_log.read_text(errors="replace")[-3000:]
        raise RknnError(f"the toolkit worker failed (exit {r.returncode}):\n{tail}")
    return json.loads((work / "result.json").read_text())


# --- accuracy ----------------------------------------------------------------------------------


def _signal(graph: NpuGraph, outputs: list[np.ndarray]) -> np.ndarray:
    """What a sentence is compared on: Vocos's spectra as the waveform they make, else the
    graph's first output."""
    if graph.name == "vocos":
        from speakd.engines.chattts.vocoder import istft

        return istft(outputs[0][0], outputs[1][0])
    return outputs[0].ravel()


def _stats(values: list[float]) -> dict[str, float]:
    return {"mean": round(float(np.mean(values)), 2), "min": round(float(np.min(values)), 2)}


def evaluate_graph(graph: NpuGraph, inputs: list[np.ndarray], sim: dict[str, np.ndarray]) -> dict:
    """SNR of the simulator vs onnxruntime on the same windows, and per sentence (the
    simulator's windows stitched vs onnxruntime's whole-sentence run); ``windowing`` is the
    stitching's own cost (onnxruntime's windows stitched vs its whole-sentence run)."""
    session = ort.InferenceSession(str(graph.onnx), providers=["CPUExecutionProvider"])
    outs = [f"out{k}" for k in range(len(graph.outputs))]
    win_snr, sent_snr, windowing = [], [], []
    signals: list[tuple[np.ndarray, np.ndarray]] = []
    start = 0
    for x in inputs:
        cuts = _cuts(graph, x)
        wins = windows(x, cuts, graph.window)
        cpu_w = [session.run(list(graph.outputs), {graph.input: w[None]}) for w in wins]
        npu_w = [[sim[o][start + i] for o in outs] for i in range(len(wins))]
        start += len(wins)
        for c, n in zip(cpu_w, npu_w, strict=True):
            win_snr.append(snr_db(np.concatenate([a.ravel() for a in c]), np.concatenate(
                [b.ravel() for b in n])))  # fmt: skip
        whole = session.run(list(graph.outputs), {graph.input: x})
        stitched_cpu = [
            stitch(np.stack([c[k] for c in cpu_w]), cuts, graph.window) for k in range(len(outs))
        ]
        stitched_npu = [
            stitch(np.stack([n[k] for n in npu_w]), cuts, graph.window) for k in range(len(outs))
        ]
        ref = _signal(graph, whole)
        npu = _signal(graph, stitched_npu)
        sent_snr.append(snr_db(ref, npu))
        windowing.append(snr_db(ref, _signal(graph, stitched_cpu)))
        signals.append((ref, npu))
    return {
        "window_snr_db": _stats(win_snr),
        "sentence_snr_db": _stats(sent_snr),
        "windowing_snr_db": _stats(windowing),
        "signals": signals,
    }


class AsrRoundTrip:
    """Whisper ``tiny.en`` (tools/calibrate/asr.py) on the CPU's audio once and on each
    precision's NPU audio: WER against the corpus text for both."""

    def __init__(self, texts: list[str], cpu: list[np.ndarray], rate: int, threads: int) -> None:
        from ..calibrate.asr import Transcriber

        self.texts, self.rate = texts, rate
        self.model = Transcriber.load(threads)
        self.wer_cpu = self._wer(cpu)

    def _wer(self, audio: list[np.ndarray]) -> float:
        from ..calibrate.asr import wer

        return round(wer(self.texts, [self.model.transcribe(a, self.rate) for a in audio]), 4)

    def __call__(self, npu: list[np.ndarray]) -> dict[str, float]:
        return {"wer_cpu": self.wer_cpu, "wer_npu": self._wer(npu)}


# --- the command -------------------------------------------------------------------------------


@dataclass
class ConvertResult:
    out: Path
    report: dict[str, Any]

    @property
    def converted(self) -> int:
        return sum(
            1 for g in self.report["graphs"].values() for p in g["precisions"].values() if p["ok"]
        )


def convert(opts: ConvertOptions) -> ConvertResult:
    with tempfile.TemporaryDirectory(prefix="speakd-rknn-") as tmp:
        work = Path(tmp)
        prep = prepare(opts, work)
        out = Path(opts.out or opts.bundle)
        in_place = out.resolve() == Path(opts.bundle).resolve()
        out.mkdir(parents=True, exist_ok=True)
        if not in_place:
            (out / MANIFEST).unlink(missing_ok=True)
            prep.copy(out)
        rknn_dir = out / RKNN_DIR
        shutil.rmtree(rknn_dir, ignore_errors=True)
        rknn_dir.mkdir()
        result = run_toolkit(prep, opts, work, rknn_dir)
        report = _report(prep, opts, result, work, rknn_dir)
    (rknn_dir / "report.json").write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n")
    _write_manifest(out, prep, report, in_place)
    return ConvertResult(out, report)


def _report(prep: Prepared, opts: ConvertOptions, result: dict, work: Path, rknn_dir: Path):
    graphs: dict[str, Any] = {}
    cpu = dict(CPU_ONLY[prep.engine])
    asr: AsrRoundTrip | None = None
    for g in prep.graphs:
        entry: dict[str, Any] = {
            "input": g.input,
            "outputs": list(g.outputs),
            "shape": g.shape,
            "context": g.context,
            "source": g.source,
            "calibration_sentences": len(prep.calib[g.name]),
            "evaluation_sentences": len(prep.evaluate[g.name]),
            "precisions": {},
        }
        for precision in PRECISIONS:
            build = result["builds"][f"{g.name}/{precision}"]
            p: dict[str, Any] = {"ok": build["ok"]}
            if build["ok"]:
                f = rknn_dir / f"{g.name}.{precision}.rknn"
                sim = dict(np.load(work / f"sim-{g.name}-{precision}.npz"))
                acc = evaluate_graph(g, prep.evaluate[g.name], sim)
                signals = acc.pop("signals")
                entry["windowing_snr_db"] = acc.pop("windowing_snr_db")
                p |= {"file": f"{RKNN_DIR}/{f.name}", "bytes": f.stat().st_size}
                p |= {"build_s": build["seconds"], **acc}
                if prep.engine == "vits" and opts.asr and prep.eval_texts:
                    if asr is None:
                        cpu_audio = [c for c, _ in signals]
                        asr = AsrRoundTrip(
                            prep.eval_texts, cpu_audio, prep.sample_rate, opts.threads
                        )
                    p |= asr([n for _, n in signals])
            else:
                p |= {"step": build["step"], "error": build["error"]}
                (rknn_dir / f"{g.name}.{precision}.rknn").unlink(missing_ok=True)
            entry["precisions"][precision] = p
        if not any(p["ok"] for p in entry["precisions"].values()):
            cpu[g.name] = "the toolkit failed: " + entry["precisions"]["fp16"]["error"]
        graphs[g.name] = entry
    return {
        "target": opts.target,
        "toolkit": f"rknn-toolkit2 {result['toolkit']}",
        "engine": prep.engine,
        "simulator": "rknn-toolkit2 init_runtime() without a target, vs onnxruntime "
        f"{ort.__version__} fp32 on the same inputs",
        "corpus_sha256": prep.corpus_sha256,
        "int8_algorithm": opts.algorithm,
        "graphs": graphs,
        "cpu": cpu,
    }


def _write_manifest(out: Path, prep: Prepared, report: dict[str, Any], in_place: bool) -> None:
    built = [p for g in report["graphs"].values() for p in g["precisions"].values() if p["ok"]]
    rknn_files = sorted([f"{RKNN_DIR}/report.json"] + [p["file"] for p in built])

    section = {
        "target": report["target"],
        "toolkit": report["toolkit"],
        "report": f"{RKNN_DIR}/report.json",
        "graphs": {
            name: {
                "input": g["input"],
                "outputs": g["outputs"],
                "shape": g["shape"],
                "context": g["context"],
                "source": g["source"],
                "files": {k: p["file"] for k, p in g["precisions"].items() if p["ok"]},
            }
            for name, g in report["graphs"].items()
        },
        "cpu": report["cpu"],
        "files": {f: file_entry(out / f) for f in rknn_files},
    }
    base = prep.manifest
    name = base.get("name", out.name) if in_place else out.name
    write_manifest(out, base, list(base["files"]), name=name, rknn=section)


def format_report(report: dict[str, Any]) -> str:
    lines = [f"{report['toolkit']}, target {report['target']}; {report['simulator']}"]
    head = f"{'graph':<9} {'prec':<5} {'window SNR dB':>14} {'sentence SNR dB':>16}  extra"
    lines.append(head)
    for name, g in report["graphs"].items():
        w = g.get("windowing_snr_db")
        for precision, p in g["precisions"].items():
            if not p["ok"]:
                lines.append(f"{name:<9} {precision:<5} failed at {p['step']}: {p['error']}")
                continue
            ws, ss = p["window_snr_db"], p["sentence_snr_db"]
            extra = f"shape {g['shape']}, {p['bytes'] / 1e6:.1f} MB"
            if "wer_npu" in p:
                extra += f", WER {p['wer_npu']:.3f} (CPU {p['wer_cpu']:.3f})"
            lines.append(
                f"{name:<9} {precision:<5} {ws['mean']:>7.1f} (≥{ws['min']:.1f})"
                f" {ss['mean']:>8.1f} (≥{ss['min']:.1f})  {extra}"
            )
        if w:
            lines.append(f"{name:<9} {'':<5} windowing alone (CPU): {w['mean']:.1f} dB")
    for graph, why in report["cpu"].items():
        lines.append(f"stays on the CPU: {graph}: {why}")
    return "\n".join(lines)
