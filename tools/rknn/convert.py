"""``speakd-tools rknn convert``: a bundle's NPU-suited graphs → ``.rknn`` files for one Rockchip
target, fp16 and int8, each checked in the toolkit's simulator against onnxruntime.

This half runs in the host-tools venv: it picks the graphs (tools/rknn/graphs.py), makes their
inputs from the calibration corpus through the device engine itself (the Piper voice's flow
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
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

from speakd.engines.base import SynthesisConfig
from speakd.engines.bundle import MANIFEST, file_entry, load_bundle
from speakd.engines.chattts.vocoder import StreamSchedule
from speakd.engines.rknn_session import plan, stitch, windows
from speakd.engines.vits.noise import SEED_INPUT, make_noise_deterministic

from ..calibrate.bundle_out import copy_into, write_manifest
from ..calibrate.corpus import Corpus, Sentence
from ..calibrate.metrics import snr_db
from .graphs import CPU_ONLY, NpuGraph, cut_vits_decoder

log = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("worker.py")
RKNN_DIR = "rknn"
PRECISIONS = ("fp16", "int8")
SEED = 20261202
WORKER_TIMEOUT_S = 3600
# ChatTTS: the Decoder's window in GPT steps, with the engine's own streaming context on each
# side (``StreamSchedule.left``), so the windowing costs what it costs on the CPU. Piper: 64
# frames (0.74 s at 22 kHz) with 8 frames each side, whose stitching alone stays above 55 dB.
DECODER_WINDOW = 64
ENGINE_CONTEXT = StreamSchedule().left
VITS_WINDOW, VITS_CONTEXT = 64, 8


class RknnError(ValueError):
    """The conversion cannot run: no toolkit venv, a bundle it cannot read, a worker crash."""


@dataclass(frozen=True)
class ConvertOptions:
    bundle: str  # a bundle folder; for a Piper voice also "embedded" or <voice>.onnx
    out: Path | None = None  # default: the bundle itself
    target: str = "rk3588"
    calib_sentences: int = 8
    eval_sentences: int = 4
    asr: bool = True  # Piper: Whisper WER of CPU and NPU audio on the evaluation sentences
    max_calib_windows: int = 64
    algorithm: str = "normal"  # the toolkit's int8 quantized_algorithm
    threads: int = 2
    corpus: Path | None = None
    rknn_python: Path | None = None


@dataclass
class Prepared:
    """A source bundle with its NPU graphs and their whole-sentence inputs ([1, C, T] each)."""

    engine: str
    graphs: list[NpuGraph]
    calib: dict[str, list[np.ndarray]]
    evaluate: dict[str, list[np.ndarray]]
    manifest: dict[str, Any]  # the base manifest of the output bundle
    copy: Callable[[Path], None]  # writes the bundle's own files into an output folder
    sample_rate: int
    eval_texts: list[str] = field(default_factory=list)
    corpus_sha256: str = ""


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


# --- sources ---------------------------------------------------------------------------------


def _seeded_with_output(model_path: Path, name: str) -> ort.InferenceSession:
    """The voice graph with its noise seeded as the engine seeds it (speakd.engines.vits.noise), so
    the same corpus gives the same ``z`` every run, and tensor ``name`` as an extra output."""
    model = onnx.load(str(model_path))
    make_noise_deterministic(model)
    value = onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None)
    model.graph.output.append(value)
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def prepare_vits(opts: ConvertOptions, work: Path) -> Prepared:
    """A Piper voice: its HiFi-GAN decoder, fed the flow's ``z`` for each corpus sentence as
    ``VitsEngine.synthesize`` runs it (tools/calibrate/vits.py records the exact feeds)."""
    from speakd.engines.vits.params import BUNDLE_CONFIG, BUNDLE_MODEL

    from ..calibrate.vits import record_feeds, resolve_source

    src = resolve_source(opts.bundle)
    engine = src.load(opts.threads)
    corpus = Corpus.load(opts.corpus).only(engine.config.language[:2])
    calib, evaluate = corpus.split(opts.calib_sentences, opts.eval_sentences)
    cut = work / "vits_decoder.onnx"
    z_name, wave_name = cut_vits_decoder(src.model, cut)
    flow = _seeded_with_output(src.model, z_name)

    def z_of(sentence: Sentence) -> np.ndarray:
        feeds = record_feeds(engine, src.model, [sentence])
        seed = {SEED_INPUT: np.array(SEED, np.int64)}
        zs = [flow.run([z_name], feed | seed)[0] for feed in feeds]
        return np.concatenate(zs, axis=-1).astype(np.float32)

    cal_z = [z_of(s) for s in calib]
    eval_z = [z_of(s) for s in evaluate]
    graph = NpuGraph(
        "decoder",
        cut,
        z_name,
        (wave_name,),
        channels=int(cal_z[0].shape[1]),
        window=VITS_WINDOW,
        context=VITS_CONTEXT,
        source={"file": BUNDLE_MODEL, "cut": {"input": z_name, "output": wave_name}},
    )
    if src.manifest is not None:
        base = src.manifest
        names = list(base["files"])

        def copy(out: Path) -> None:
            copy_into(src.model.parent, out, names)
    else:
        base = {
            "engine": "vits",
            "precision": "fp32",
            "sample_rate": engine.sample_rate,
            "source": src.to_dict(),
            "calibration": None,
            "files": {BUNDLE_MODEL: {}, BUNDLE_CONFIG: {}},
        }

        def copy(out: Path) -> None:
            shutil.copyfile(src.model, out / BUNDLE_MODEL)
            shutil.copyfile(src.config, out / BUNDLE_CONFIG)

    return Prepared(
        "vits",
        [graph],
        {"decoder": cal_z},
        {"decoder": eval_z},
        base,
        copy,
        engine.sample_rate,
        [s.text for s in evaluate],
        corpus.sha256(calib + evaluate),
    )


def prepare_chattts(opts: ConvertOptions, bundle_path: Path) -> Prepared:
    """A ChatTTS bundle: its Decoder (hidden → mel) and Vocos (mel → spectra), fed the hidden
    states and mels of the engine's own decode of each corpus sentence."""
    from speakd.engines.chattts import text as textfe
    from speakd.engines.chattts.engine import ChatTTSEngine

    engine = ChatTTSEngine.load(bundle_path, threads=opts.threads)
    corpus = Corpus.load(opts.corpus)
    calib, evaluate = corpus.split(opts.calib_sentences, opts.eval_sentences)
    config = SynthesisConfig(extra={"max_new_token": 2 * DECODER_WINDOW})

    def decoded(sentences: list[Sentence]) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        for s in sentences:
            normalized = engine.normalize_text(s.text, s.lang)
            for sentence in textfe.split_sentences(normalized, engine.split):
                utt = engine.decode(sentence, config, seed=SEED)
                if len(utt.codes) < 2:
                    continue
                hidden = np.ascontiguousarray(utt.hiddens.T[None], np.float32)
                mel = engine.vocoder.decoder.run(["mel"], {"hidden": hidden})[0]
                yield hidden, mel

    cal = list(decoded(calib))
    ev = list(decoded(evaluate))
    if not cal or not ev:
        raise RknnError("the corpus produced no decodable sentence")
    bundle = load_bundle(bundle_path, verify=False)
    graphs = [
        NpuGraph(
            "decoder",
            bundle.file("decoder.onnx"),
            "hidden",
            ("mel",),
            channels=int(cal[0][0].shape[1]),
            window=DECODER_WINDOW,
            context=ENGINE_CONTEXT,
            source={"file": "decoder.onnx"},
        ),
        NpuGraph(
            "vocos",
            bundle.file("vocos.onnx"),
            "mel",
            ("spec_real", "spec_imag"),
            channels=int(cal[0][1].shape[1]),
            window=2 * DECODER_WINDOW,  # two mel frames per step
            context=2 * ENGINE_CONTEXT,
            source={"file": "vocos.onnx"},
        ),
    ]

    def copy(out: Path) -> None:
        copy_into(bundle_path, out, list(bundle.manifest["files"]))

    return Prepared(
        "chattts",
        graphs,
        {"decoder": [h for h, _ in cal], "vocos": [m for _, m in cal]},
        {"decoder": [h for h, _ in ev], "vocos": [m for _, m in ev]},
        bundle.manifest,
        copy,
        int(bundle.manifest.get("sample_rate", 24000)),
        corpus_sha256=corpus.sha256(calib + evaluate),
    )


def prepare(opts: ConvertOptions, work: Path) -> Prepared:
    path = Path(opts.bundle)
    if (path / MANIFEST).is_file():
        engine = load_bundle(path, verify=False).engine
        if engine == "chattts":
            return prepare_chattts(opts, path)
        if engine != "vits":
            raise RknnError(f"{path}: engine {engine!r} has no NPU conversion")
    elif opts.out is None:
        raise RknnError(f"{opts.bundle}: not a bundle folder; name the bundle to write with --out")
    return prepare_vits(opts, work)


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
