"""What ``speakd-tools rknn convert`` converts: a bundle's NPU-suited graphs and the
whole-sentence inputs they are calibrated and evaluated on.

The inputs come from the calibration corpus through the device engine itself: a Piper voice's
flow output ``z`` (its noise seeded as the engine seeds it), ChatTTS's hidden states and mels from
its own decode. Which graphs there are, and where a voice's decoder is cut, is
tools/rknn/graphs.py's.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

from speakd.engines.base import SynthesisConfig
from speakd.engines.bundle import MANIFEST, load_bundle
from speakd.engines.chattts.vocoder import StreamSchedule
from speakd.engines.vits.noise import SEED_INPUT, make_noise_deterministic

from ..calibrate.bundle_out import copy_into
from ..calibrate.corpus import Corpus, Sentence
from .graphs import NpuGraph, cut_vits_decoder

SEED = 20261202
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
