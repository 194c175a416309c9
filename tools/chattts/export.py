"""ChatTTS checkpoint → speakd bundle (docs/bundle-format.md), with parity built in.

The GPT graph is written directly (gpt_graph.py); the Decoder and Vocos are exported with the
legacy TorchScript exporter through small wrappers around the modules loaded from the checkpoint
(the modules' own ``forward``s use ``out=`` arguments, in-place ops and ``inference_mode``, which
do not export). Vocos stops before the ISTFT (ONNX has none); the device runs it on the host.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib.metadata import version
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import torch
from onnx import TensorProto, helper, numpy_helper
from safetensors.numpy import load_file
from tqdm import tqdm

from speakd.engines.bundle import FORMAT, FORMAT_VERSION, MANIFEST, file_entry

from ..loudness import record_loudness
from .checkpoint import CheckpointError, CheckpointSizes, read_sizes, source_report
from .gpt_graph import build_gpt_from_checkpoint
from .modules import ChatTTSModules, load_modules
from .parity import FP16_MIN_ELEMENTS, MIN_STEPS, ParityReport, run_parity
from .tokenizer_asset import FIRST_SPECIAL_ID, SPECIAL_TOKENS
from .voices import DEFAULT_VOICE_SEEDS, Voice, sample_voices

log = logging.getLogger(__name__)

TORCH_OPSET = 17
BUNDLE_FILES = (
    "gpt.onnx",
    "decoder.onnx",
    "vocos.onnx",
    "emb_text.npy",
    "emb_code.npy",
    "tokenizer.json",
    "voices.npz",
)
DEFAULTS = {
    "temperature": 0.3,
    "top_p": 0.7,
    "top_k": 20,
    "repetition_penalty": 1.05,
    "repetition_window": 16,
    "max_new_token": 2048,
    "min_new_token": 0,
    "speed": 5,
}


@dataclass(frozen=True)
class ExportOptions:
    checkpoint: Path
    out: Path
    precision: str = "fp32"  # fp32 | fp16 (fp16 storage, fp32 compute)
    max_context: int = 2048
    parity: bool = True
    parity_steps: int = MIN_STEPS
    voice_seeds: tuple[tuple[str, int], ...] = tuple(DEFAULT_VOICE_SEEDS.items())


@dataclass(frozen=True)
class ExportResult:
    bundle: Path
    manifest: dict[str, Any]
    parity: ParityReport | None

    @property
    def ok(self) -> bool:
        return self.parity is None or self.parity.ok


class DecoderForExport(torch.nn.Module):
    """ChatTTS ``DVAE.forward`` (no VQ) without ``out=``: hidden [B,768,T] → log-mel [B,100,2T]."""

    def __init__(self, dvae: torch.nn.Module):
        super().__init__()
        self.decoder, self.out_conv = dvae.decoder, dvae.out_conv
        self.register_buffer("coef", dvae.coef.detach().clone())

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        b, c, t = hidden.shape
        x = hidden.view(b, 2, c // 2, t).permute(0, 2, 3, 1).flatten(2)
        return self.out_conv(self.decoder(x)) * self.coef


class VocosForExport(torch.nn.Module):
    """Vocos backbone + ``ISTFTHead`` up to the complex spectrum, as real and imaginary parts."""

    def __init__(self, vocos: torch.nn.Module):
        super().__init__()
        self.backbone, self.out = vocos.backbone, vocos.head.out

    def forward(self, mel: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.out(self.backbone(mel)).transpose(1, 2)
        mag, p = x.chunk(2, dim=1)
        mag = torch.clip(torch.exp(mag), max=1e2)
        return mag * torch.cos(p), mag * torch.sin(p)


def _torch_export(
    module: torch.nn.Module,
    example: torch.Tensor,
    path: Path,
    inp: str,
    outs: list[str],
    time_axis: str,
) -> None:
    axes = {inp: {0: "batch", 2: time_axis}}
    axes |= {o: {0: "batch", 2: "frames" if time_axis == "steps" else time_axis} for o in outs}
    with torch.no_grad():
        torch.onnx.export(
            module,
            (example,),
            str(path),
            input_names=[inp],
            output_names=outs,
            dynamic_axes=axes,
            opset_version=TORCH_OPSET,
            dynamo=False,
        )


def store_fp16(model: onnx.ModelProto, keep: frozenset[str] = frozenset()) -> onnx.ModelProto:
    """Store large float initializers as fp16 with a Cast back to fp32 (folded by ORT at load).

    Compute stays fp32 (ORT's CPU kernels for fp16 MatMul/Conv are slow or missing on most
    boards); the file and the disk read halve, and the weights are the fp16-rounded values.
    """
    graph = model.graph
    casts, kept = [], []
    for init in graph.initializer:
        if (
            init.data_type == TensorProto.FLOAT
            and init.name not in keep
            and int(np.prod(init.dims)) >= FP16_MIN_ELEMENTS
        ):
            arr = numpy_helper.to_array(init).astype(np.float16)
            kept.append(numpy_helper.from_array(arr, init.name + "__fp16"))
            casts.append(
                helper.make_node(
                    "Cast",
                    [init.name + "__fp16"],
                    [init.name],
                    to=TensorProto.FLOAT,
                    name=f"cast_{init.name}",
                )
            )
        else:
            kept.append(init)
    del graph.initializer[:]
    graph.initializer.extend(kept)
    nodes = casts + list(graph.node)
    del graph.node[:]
    graph.node.extend(nodes)
    return model


def _save(
    model: onnx.ModelProto, path: Path, precision: str, keep: frozenset[str] = frozenset()
) -> None:
    if precision == "fp16":
        store_fp16(model, keep)
    onnx.save(model, str(path))


def _model_section(sizes: CheckpointSizes, max_context: int) -> dict[str, Any]:
    return {
        "num_layers": sizes.gpt_layers,
        "num_heads": sizes.gpt_heads,
        "head_dim": sizes.head_dim,
        "hidden_size": sizes.hidden_size,
        "num_vq": sizes.num_vq,
        "num_audio_tokens": sizes.num_audio_tokens,
        "eos_token": sizes.num_audio_tokens - 1,
        "max_context": max_context,
        "kv_dtype": "float32",
        "vocab_size": sizes.num_text_tokens,
        "token_ids": {t.strip("[]"): FIRST_SPECIAL_ID + i for i, t in enumerate(SPECIAL_TOKENS)},
        "decoder_frames_per_step": 2,
        "hop_length": 256,
        "n_fft": 1024,
    }


def _check_special_ids(tokenizer_json: Path) -> None:
    """Real and generated tokenizers must agree with the ids the manifest promises."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_json))
    for i, t in enumerate(SPECIAL_TOKENS):
        if tok.token_to_id(t) != FIRST_SPECIAL_ID + i:
            raise CheckpointError(
                f"{tokenizer_json}: {t} has id {tok.token_to_id(t)}, "
                f"ChatTTS uses {FIRST_SPECIAL_ID + i}"
            )


def _check_options(opts: ExportOptions) -> None:
    if opts.precision not in ("fp32", "fp16"):
        raise ValueError(f"precision {opts.precision!r}: export writes fp32 or fp16")
    if opts.parity and opts.parity_steps < MIN_STEPS:
        raise ValueError(f"--parity-steps {opts.parity_steps}: parity needs at least {MIN_STEPS}")
    if opts.max_context < (opts.parity_steps + 64 if opts.parity else 16):
        raise ValueError(
            f"--max-context {opts.max_context} is too small"
            + (f" for {opts.parity_steps} parity steps plus the prompt" if opts.parity else "")
        )


def _write_conv_nets(mods: ChatTTSModules, out: Path, precision: str) -> None:
    """decoder.onnx and vocos.onnx through the legacy exporter (dynamic batch and time)."""
    for module, example, name, inp, outs, axis in (
        (
            DecoderForExport(mods.decoder),
            torch.randn(1, mods.sizes.hidden_size, 16),
            "decoder.onnx",
            "hidden",
            ["mel"],
            "steps",
        ),
        (
            VocosForExport(mods.vocos),
            torch.randn(1, 100, 32),
            "vocos.onnx",
            "mel",
            ["spec_real", "spec_imag"],
            "frames",
        ),
    ):
        _torch_export(module, example, out / name, inp, outs, axis)
        _save(onnx.load(str(out / name)), out / name, precision)


def _write_tables(root: Path, sizes: CheckpointSizes, out: Path) -> None:
    embed = load_file(str(root / "asset" / "Embed.safetensors"))
    np.save(out / "emb_text.npy", embed["emb_text.weight"].astype(np.float16))
    codes = np.stack([embed[f"emb_code.{q}.weight"] for q in range(sizes.num_vq)])
    np.save(out / "emb_code.npy", codes.astype(np.float32))
    shutil.copyfile(root / "asset" / "tokenizer" / "tokenizer.json", out / "tokenizer.json")


def _manifest(
    opts: ExportOptions,
    sizes: CheckpointSizes,
    source: dict,
    voices: list[Voice],
    report: ParityReport | None,
    seconds: float,
) -> dict[str, Any]:
    out = opts.out
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "name": out.name,
        "engine": "chattts",
        "precision": opts.precision,
        "sample_rate": 24000,
        "created": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "files": {f: file_entry(out / f) for f in BUNDLE_FILES},
        "model": _model_section(sizes, opts.max_context),
        "source": {**source, "sizes": sizes.to_dict(), "chattts_version": version("chattts")},
        "defaults": dict(DEFAULTS),
        "voices": {
            v.name: {"file": "voices.npz", "key": v.name, "seed": v.seed, "spk_emb": v.spk_emb}
            for v in voices
        },
        "parity": report.to_dict() if report else None,
        "calibration": None,
        "export": {
            "seconds": round(seconds, 1),
            "weights_storage": "float16, Cast to float32 at load"
            if opts.precision == "fp16"
            else "float32",
            "compute": "float32",
        },
    }


def export_bundle(opts: ExportOptions) -> ExportResult:
    """Write the bundle into ``opts.out`` (created); the manifest is written last, so a bundle
    whose export stopped half-way never loads. A failed parity still writes the bundle (with the
    report, ``ok: false``); the caller decides (the CLI exits 1)."""
    _check_options(opts)
    t0 = time.perf_counter()
    root, out = opts.checkpoint, opts.out
    bar = tqdm(total=7, desc="export", unit="step")

    def done(what: str) -> None:
        bar.set_postfix_str(what)
        bar.update()

    source = source_report(root)  # raises CheckpointError naming a missing file
    sizes = read_sizes(root)
    _check_special_ids(root / "asset" / "tokenizer" / "tokenizer.json")
    out.mkdir(parents=True, exist_ok=True)
    (out / MANIFEST).unlink(missing_ok=True)
    done("hashed checkpoint")

    gpt = build_gpt_from_checkpoint(root, sizes, opts.max_context)
    _save(gpt, out / "gpt.onnx", opts.precision, keep=frozenset({"cos_cache", "sin_cache"}))
    del gpt
    done("gpt.onnx")
    mods = load_modules(root)
    _write_conv_nets(mods, out, opts.precision)
    done("decoder.onnx, vocos.onnx")
    _write_tables(root, sizes, out)
    done("tables, tokenizer")
    voices = sample_voices(dict(opts.voice_seeds))
    np.savez(out / "voices.npz", **{v.name: v.vector for v in voices})
    done("voices.npz")

    report = None
    if opts.parity:
        report = run_parity(
            mods,
            out,
            root,
            voices[0].spk_emb,
            steps=opts.parity_steps,
            fp16_weights=opts.precision == "fp16",
        )
    done("parity" if report else "parity skipped")

    manifest = _manifest(opts, sizes, source, voices, report, time.perf_counter() - t0)
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n")
    manifest = record_loudness(out)
    done("manifest.json, loudness")
    bar.close()
    return ExportResult(out, manifest, report)
