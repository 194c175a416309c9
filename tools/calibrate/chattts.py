"""Calibrating a ChatTTS bundle: float reference runs, calibration feeds, candidates, metrics.

Everything is driven through the device engine's own classes (``ChatTTSEngine``, its
``GptRunner``, ``Vocoder`` and text front-end), so the feeds are what the board will run:

* GPT feeds: the prompt pass and every ``gpt_feed_every``-th decode step of the float engine's
  own generation over the corpus (same prompt builder, same sampling, same KV positions). The
  KV inputs are the runner's live cache sliced to the valid positions (GQA accepts a past buffer
  of exactly past_len).
* Decoder feeds: the float run's hidden states; Vocos feeds: the float Decoder's mels.

Quality (``evaluate``): the candidate and the float GPT are teacher-forced with the float run's
code sequence; code agreement = argmax of every codebook at every step equal, KL of the
codebook softmaxes, hidden-state SNR; Decoder alone (float hiddens in), Vocos alone (float mels
in), and end to end (teacher-forced candidate hiddens through the candidate Decoder and Vocos) as
mel SNR, mel-cepstral distortion and waveform SNR. Speed: ms per GPT step, interleaved.
"""

from __future__ import annotations

import copy
import json
import logging
import shutil
import statistics
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from speakd.engines.base import SynthesisConfig
from speakd.engines.bundle import MANIFEST, load_bundle
from speakd.engines.chattts import text as textfe
from speakd.engines.chattts.engine import ChatTTSEngine
from speakd.engines.chattts.gpt_runner import GptRunner
from speakd.engines.chattts.vocoder import istft

from .base import CalibrateOptions, RunBase
from .bundle_out import write_manifest
from .corpus import Corpus, Sentence
from .errors import CalibrationError
from .kvcache import KvRange, apply_int8_kv
from .metrics import kl_divergence, log_mel, mcd_db, snr_db
from .quantizers import quantize_graph
from .recipe import Mode, Recipe

log = logging.getLogger(__name__)

SEED = 20261202
DATA_FILES = ("emb_text.npy", "emb_code.npy", "tokenizer.json", "voices.npz")


@dataclass
class FloatUtterance:
    sentence: str
    prompt: np.ndarray  # (1, S, hidden)
    codes: np.ndarray  # (T, Q)
    hiddens: np.ndarray  # (T, hidden), the float run's (= float teacher forcing)
    logits: np.ndarray  # (T, Q·V) float teacher-forced
    mel: np.ndarray  # (1, mels, 2T) float Decoder
    wave: np.ndarray  # float Decoder → Vocos → ISTFT


def teacher_force(runner: GptRunner, prompt: np.ndarray, codes: np.ndarray):
    """Hidden states and logits of ``runner`` fed the given code sequence (no sampling)."""
    h, lg = runner.prompt(prompt)
    hs, ls = [h.copy()], [lg.copy()]
    for c in codes[:-1]:
        h, lg = runner.step(c)
        hs.append(h.copy())
        ls.append(lg.copy())
    return np.array(hs), np.array(ls)


def _run(session: Any, out: str, feed: dict[str, np.ndarray]) -> np.ndarray:
    return session.run([out], feed)[0]


class ChatTTSRun(RunBase):
    def __init__(self, opts: CalibrateOptions, recipe: Recipe, corpus: Corpus, method: str):
        super().__init__(opts, recipe, corpus, method)
        self.src = Path(opts.bundle)
        bundle = load_bundle(self.src)  # hashes verified
        if bundle.precision != "fp32":
            raise CalibrationError(
                f"{self.src / MANIFEST}: precision {bundle.precision!r}; "
                "calibrate the fp32 bundle from `speakd-tools export`"
            )
        self.base = bundle.manifest
        missing = sorted(set(recipe.graphs.values()) - set(self.base["files"]))
        if missing:
            raise CalibrationError(f"{recipe.path}: graphs {missing} are not files of {self.src}")
        self.fp = ChatTTSEngine.load(self.src, threads=opts.threads)
        o = recipe.options
        self.steps = int(o.get("max_new_token", 48))
        self.feed_every = int(o.get("gpt_feed_every", 4))
        self.speed_steps = int(o.get("speed_steps", 32))
        self.speed_rounds = int(o.get("speed_rounds", 5))
        self.config = SynthesisConfig(extra={"max_new_token": self.steps})
        self.kv = KvRange(self.fp.spec.num_layers)
        self.cal_utts = [
            u
            for s in tqdm(self.cal, desc="float runs (calibration)", unit="sent")
            for u in self._float(s, measure_kv=True)
        ]
        self.eval_utts = [
            u
            for s in tqdm(self.eval, desc="float runs (evaluation)", unit="sent")
            for u in self._float(s, measure_kv=False)
        ]
        if not self.cal_utts or not self.eval_utts:
            raise CalibrationError("the corpus produced no decodable sentence")
        self.kv_scales = self.kv.scales()
        self.fp32_bytes = self._bytes(self.src)

    # --- float reference ----------------------------------------------------------------------

    def _float(self, s: Sentence, measure_kv: bool) -> Iterator[FloatUtterance]:
        eng = self.fp
        normalized = eng.normalize_text(s.text, s.lang)
        for sentence in textfe.split_sentences(normalized, eng.split):
            utt = eng.decode(sentence, self.config, seed=SEED)
            if len(utt.codes) < 2:
                continue
            if measure_kv:
                self.kv.update(eng.gpt._kv, eng.gpt.position)  # the runner's live cache
            prompt = eng.prompt_embeds(sentence, eng.audio_params(self.config))
            hs, lg = teacher_force(eng.gpt, prompt, utt.codes)
            mel = _run(eng.vocoder.decoder, "mel", {"hidden": np.ascontiguousarray(hs.T[None])})
            real, imag = eng.vocoder.vocos.run(["spec_real", "spec_imag"], {"mel": mel})
            yield FloatUtterance(sentence, prompt, utt.codes, hs, lg, mel, istft(real[0], imag[0]))

    # --- calibration feeds (generators: ORT runs each feed before asking for the next) ---------

    def gpt_feeds(self) -> Iterator[dict[str, np.ndarray]]:
        runner, spec = self.fp.gpt, self.fp.spec
        e = runner.emb_code

        def feed(embeds: np.ndarray, past: int) -> dict[str, np.ndarray]:
            s = embeds.shape[1]
            d = {
                "inputs_embeds": np.ascontiguousarray(embeds, np.float32),
                "seqlens_k": np.array([past + s - 1], np.int32),
                "total_sequence_length": np.array(past + s, np.int32),
            }
            for i in range(spec.num_layers):
                d[f"past_key_{i}"] = np.ascontiguousarray(runner._kv[2 * i][:, :, :past])
                d[f"past_value_{i}"] = np.ascontiguousarray(runner._kv[2 * i + 1][:, :, :past])
            return d

        bar = tqdm(total=self.gpt_feed_count(), desc="gpt calibration", unit="feed")
        for u in self.cal_utts:
            bar.update()
            yield feed(u.prompt, 0)
            runner.prompt(u.prompt)
            for i, c in enumerate(u.codes[:-1]):
                if i % self.feed_every == 0:
                    emb = sum(e[q, c[q]] for q in range(spec.num_vq))[None, None]
                    bar.update()
                    yield feed(emb, runner.position)
                runner.step(c)

    def gpt_feed_count(self) -> int:
        return sum(1 + len(range(0, len(u.codes) - 1, self.feed_every)) for u in self.cal_utts)

    def decoder_feeds(self) -> Iterator[dict[str, np.ndarray]]:
        for u in self.cal_utts:
            yield {"hidden": np.ascontiguousarray(u.hiddens.T[None])}

    def vocos_feeds(self) -> Iterator[dict[str, np.ndarray]]:
        for u in self.cal_utts:
            yield {"mel": u.mel}

    # --- candidates ----------------------------------------------------------------------------

    def build(self, mode: Mode, out: Path) -> dict[str, Any]:
        out.mkdir(parents=True, exist_ok=True)
        for name in DATA_FILES:
            shutil.copyfile(self.src / name, out / name)
        feeds = {"gpt": self.gpt_feeds, "decoder": self.decoder_feeds, "vocos": self.vocos_feeds}
        counts = {
            "gpt": self.gpt_feed_count(),
            "decoder": len(self.cal_utts),
            "vocos": len(self.cal_utts),
        }
        infos: dict[str, Any] = {}
        for graph, fname in self.recipe.graphs.items():
            scheme = mode.graphs[graph]
            make = feeds.get(graph)
            if scheme.scheme == "static" and make is None:
                raise CalibrationError(
                    f"{self.recipe.path}: no calibration data for graph {graph!r}"
                )
            infos[graph] = quantize_graph(
                self.src / fname,
                out / fname,
                scheme,
                where=f"{self.recipe.path} mode {mode.name!r}, graph {graph} ({fname})",
                method=self.method,
                feeds=make() if scheme.scheme == "static" else None,
                feed_count=counts.get(graph),
            )
        if mode.kv_int8:
            gpt_file = self.recipe.graphs.get("gpt", "gpt.onnx")
            n = apply_int8_kv(out / gpt_file, self.kv_scales)
            infos.setdefault("gpt", {})["kv_cache"] = f"int8 per-tensor, {n} layers"
        self._manifest(out, mode, calibration=None)
        return infos

    def _manifest(self, out: Path, mode: Mode, calibration: Any) -> dict[str, Any]:
        base = copy.deepcopy(self.base)
        model = {**base["model"], "kv_dtype": "int8" if mode.kv_int8 else "float32"}
        files = sorted(set(DATA_FILES) | set(self.recipe.graphs.values()))
        return write_manifest(
            out, base, files, precision=mode.precision, model=model, calibration=calibration
        )

    @staticmethod
    def _bytes(bundle: Path) -> dict[str, int]:
        files = json.loads((bundle / MANIFEST).read_text())["files"]
        return {f: int(e["bytes"]) for f, e in files.items()}

    def candidate(self, mode: Mode, where: Path) -> dict[str, Any]:
        graphs = self.build(mode, where)
        q = ChatTTSEngine.load(where, threads=self.opts.threads)
        quality, per_graph, curves = self.evaluate(q)
        speed = self.speed(q, self.speed_rounds)
        qb = self._bytes(where)
        bytes_ = {
            "fp32_total": sum(self.fp32_bytes.values()),
            "quant_total": sum(qb.values()),
            **{f"{g}_ratio": qb[f] / self.fp32_bytes[f] for g, f in self.recipe.graphs.items()},
        }
        failed = []
        bound = self.recipe.bounds.get("code_agreement_min")
        if bound is not None and quality["code_agreement"] < bound:
            failed.append(f"code agreement {quality['code_agreement']:.3f} < {bound}")
        return {
            "precision": mode.precision,
            "why": mode.why,
            "graphs": graphs,
            "bytes": bytes_,
            "bytes_ratio": bytes_["quant_total"] / bytes_["fp32_total"],
            "gpt_bytes_ratio": bytes_.get("gpt_ratio"),
            "speed_ratio": speed["fp32_gpt_ms_per_step"] / speed["quant_gpt_ms_per_step"],
            "quality": quality,
            "per_graph": per_graph,
            "speed": speed,
            "within_bounds": not failed,
            "failed": failed,
            "score": quality["code_agreement"],  # quality rank when no candidate is in bounds
            "_curves": curves,
        }

    def evaluate(self, q: ChatTTSEngine) -> tuple[dict, dict, dict]:
        agree, kls, hid_snr = [], [], []
        dec_snr, dec_mcd, voc_snr, e2e_mel, e2e_mcd, e2e_wave = [], [], [], [], [], []
        spec = self.fp.spec
        qv = (spec.num_vq, spec.num_audio_tokens)
        example = None
        for u in tqdm(self.eval_utts, desc="evaluate", unit="utt"):
            hs, lg = teacher_force(q.gpt, u.prompt, u.codes)
            a, b = u.logits.reshape(-1, *qv), lg.reshape(-1, *qv)
            agree.append((a.argmax(-1) == b.argmax(-1)).mean(axis=1))
            kls.append(kl_divergence(a, b).mean(axis=1))
            hid_snr.append(snr_db(u.hiddens, hs))
            mel_fh = _run(
                q.vocoder.decoder, "mel", {"hidden": np.ascontiguousarray(u.hiddens.T[None])}
            )
            dec_snr.append(snr_db(u.mel, mel_fh))
            dec_mcd.append(mcd_db(u.mel[0].T, mel_fh[0].T))
            r, i = q.vocoder.vocos.run(["spec_real", "spec_imag"], {"mel": u.mel})
            voc_snr.append(snr_db(u.wave, istft(r[0], i[0])))
            mel_q = _run(q.vocoder.decoder, "mel", {"hidden": np.ascontiguousarray(hs.T[None])})
            r, i = q.vocoder.vocos.run(["spec_real", "spec_imag"], {"mel": mel_q})
            wave_q = istft(r[0], i[0])
            e2e_mel.append(snr_db(u.mel, mel_q))
            e2e_mcd.append(mcd_db(log_mel(u.wave, 24000), log_mel(wave_q, 24000)))
            e2e_wave.append(snr_db(u.wave, wave_q))
            example = example or (u.mel[0], mel_q[0])
        steps = np.concatenate(agree)
        quality = {
            "code_agreement": float(steps.mean()),
            "code_agreement_min_utterance": float(min(x.mean() for x in agree)),
            "logits_kl": float(np.concatenate(kls).mean()),
            "e2e_mel_snr_db": float(np.mean(e2e_mel)),
            "e2e_mcd_db": float(np.mean(e2e_mcd)),
            "e2e_wave_snr_db": float(np.mean(e2e_wave)),
            "steps_compared": int(steps.size),
        }
        per_graph = {
            "gpt": {
                "code_agreement": quality["code_agreement"],
                "logits_kl": quality["logits_kl"],
                "hidden_snr_db": float(np.mean(hid_snr)),
            },
            "decoder": {
                "mel_snr_db": float(np.mean(dec_snr)),
                "mel_mcd_db": float(np.mean(dec_mcd)),
            },
            "vocos": {"wave_snr_db": float(np.mean(voc_snr))},
        }
        curves = {"agreement": np.concatenate(agree), "mel": example}
        return quality, per_graph, curves

    def speed(self, q: ChatTTSEngine, rounds: int = 5) -> dict[str, float]:
        """ms per GPT decode step (and Decoder+Vocos per step), fp32 vs candidate interleaved."""
        u = max(self.eval_utts, key=lambda x: len(x.codes))
        codes = u.codes[: self.speed_steps + 1]
        timings: dict[str, list[float]] = {"fp32": [], "quant": [], "fp32_voc": [], "quant_voc": []}
        for r in range(rounds):
            order = (
                [("fp32", self.fp), ("quant", q)]
                if r % 2 == 0
                else [("quant", q), ("fp32", self.fp)]
            )
            for name, eng in order:
                eng.gpt.prompt(u.prompt)
                t0 = time.perf_counter()
                for c in codes[:-1]:
                    eng.gpt.step(c)
                timings[name].append((time.perf_counter() - t0) * 1e3 / max(len(codes) - 1, 1))
                t0 = time.perf_counter()
                eng.vocoder.waveform(u.hiddens)
                timings[f"{name}_voc"].append((time.perf_counter() - t0) * 1e3 / len(u.hiddens))
        med = {k: statistics.median(v) for k, v in timings.items()}
        return {
            "fp32_gpt_ms_per_step": med["fp32"],
            "quant_gpt_ms_per_step": med["quant"],
            "fp32_vocoder_ms_per_step": med["fp32_voc"],
            "quant_vocoder_ms_per_step": med["quant_voc"],
            "context": int(u.prompt.shape[1] + len(codes)),
            "rounds": rounds,
        }

    # --- report --------------------------------------------------------------------------------

    def header(self) -> dict[str, Any]:
        src = self.base.get("source", {})
        return {
            "real_weights": bool(src.get("real_weights", False)),
            "source": str(self.src),
            "corpus": self.corpus_info(),
            "kv_scales": self.kv_scales,
            "decode": {
                "max_new_token": self.steps,
                "seed": SEED,
                "gpt_feed_every": self.feed_every,
            },
            "headline": [
                "gpt_bytes_ratio",
                "code_agreement",
                "logits_kl",
                "e2e_mel_snr_db",
                "e2e_mcd_db",
                "e2e_wave_snr_db",
            ],
        }

    def plots(self, candidates: dict[str, dict[str, Any]], winner: str) -> dict[str, Any]:
        first = next(iter(candidates.values()))
        ref, test = candidates[winner]["_curves"]["mel"]
        return {
            "code_agreement_per_step": (
                "lines",
                {k: c["_curves"]["agreement"] for k, c in candidates.items()},
                "fraction of 4 codebooks",
            ),
            "gpt_ms_per_step": (
                "bars",
                {
                    "fp32": first["speed"]["fp32_gpt_ms_per_step"],
                    **{k: c["speed"]["quant_gpt_ms_per_step"] for k, c in candidates.items()},
                },
                "ms",
            ),
            "bundle_mb": (
                "bars",
                {
                    "fp32": first["bytes"]["fp32_total"] / 1e6,
                    **{k: c["bytes"]["quant_total"] / 1e6 for k, c in candidates.items()},
                },
                "MB",
            ),
            "mel_fp32_vs_winner": (
                "image",
                {"fp32 Decoder mel": ref, f"{winner} end to end (teacher forced)": test},
                "log amplitude",
            ),
        }

    def finish(self, out: Path, mode: Mode, report: dict[str, Any]) -> dict[str, Any]:
        section = self.calibration_section(mode, report)
        section["kv_scales"] = self.kv_scales
        section["kv_int8"] = mode.kv_int8
        return self._manifest(out, mode, calibration=section)
