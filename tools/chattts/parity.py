"""Parity of a bundle's graphs against the ``chattts`` package's own torch modules.

GPT: ChatTTS's ``GPT.generate`` (its LlamaModel with a DynamicCache, ``emb_code`` / ``head_code``
from Embed) is driven greedily by a logits processor that masks EOS (as ``min_new_token`` does) and
takes the argmax; the ONNX graph is driven step by step through IOBinding with the KV buffers
updated in place, choosing its own argmax. Both start from the same prompt embedding, built by
ChatTTS's Tokenizer, Embed and ``Speaker.apply``. Codes must be identical for every step and the
logits close. The hiddens that torch produced then go through ChatTTS's Decoder module and
``vocos.decode`` (torch.istft) vs decoder.onnx → vocos.onnx → the device's numpy ISTFT.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import torch
from torch.nn.utils import parametrize
from tqdm import tqdm

from speakd.engines.chattts.vocoder import istft

from .modules import ChatTTSModules

log = logging.getLogger(__name__)

LOGITS_MAX_ABS = 1e-3
REL_BOUND = 1e-4
MIN_STEPS = 200
PARITY_TEXT = "Hello world, the kitchen lights are on. 你好，今天天气很好。"
FP16_MIN_ELEMENTS = 4096  # tensors at least this large are stored fp16 in fp16 bundles


def session(path: Path, threads: int = 2) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.log_severity_level = 3
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


class OnnxGpt:
    """Drives gpt.onnx for one batch with fixed-capacity KV buffers bound as past and present."""

    def __init__(self, sess: ort.InferenceSession, batch: int = 1):
        past = [i for i in sess.get_inputs() if i.name.startswith("past_key_")]
        _, heads, _, head_dim = past[0].shape
        self.max_context = int(sess.get_modelmeta().custom_metadata_map["max_context"])
        self.sess, self.batch = sess, batch
        self.binding = sess.io_binding()
        shape = (batch, heads, self.max_context, head_dim)
        self.kv = []
        for i in range(len(past)):
            for kind in ("key", "value"):
                v = ort.OrtValue.ortvalue_from_numpy(np.zeros(shape, np.float32))
                self.binding.bind_ortvalue_input(f"past_{kind}_{i}", v)
                self.binding.bind_ortvalue_output(f"present_{kind}_{i}", v)
                self.kv.append(v)
        self.past_len = np.zeros(batch, np.int64)

    def run(
        self, embeds: np.ndarray, lengths: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Append ``embeds`` [B,S,H] at each row's position; returns hidden, logits [B,S,·].

        Rows of different lengths are right-padded: row b's valid tokens are the first
        ``lengths[b]`` (GroupQueryAttention reads seqlens_k per row; padded outputs are junk).
        """
        b, s, h = embeds.shape
        n = np.full(b, s, np.int64) if lengths is None else np.asarray(lengths, np.int64)
        end = self.past_len + n
        if end.max() > self.max_context:
            raise ValueError(f"context {end.max()} exceeds max_context {self.max_context}")
        hidden = np.empty((b, s, h), np.float32)
        logits = np.empty((b, s, self.sess.get_outputs()[1].shape[-1]), np.float32)
        self.binding.bind_cpu_input("inputs_embeds", np.ascontiguousarray(embeds, np.float32))
        self.binding.bind_cpu_input("seqlens_k", (end - 1).astype(np.int32))
        self.binding.bind_cpu_input("total_sequence_length", np.array(end.max(), np.int32))
        self.binding.bind_ortvalue_output("hidden", ort.OrtValue.ortvalue_from_numpy(hidden))
        self.binding.bind_ortvalue_output("logits", ort.OrtValue.ortvalue_from_numpy(logits))
        self.sess.run_with_iobinding(self.binding)
        self.past_len = end
        return hidden, logits


class _GreedyRecorder:
    """A ChatTTS logits processor: records the raw logits, then forces argmax with EOS masked."""

    def __init__(self, eos: int):
        self.eos, self.logits = eos, []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        self.logits.append(scores.detach().clone().numpy())
        masked = scores.clone()
        masked[:, self.eos] = -torch.inf
        out = torch.full_like(scores, -torch.inf)
        out.scatter_(1, masked.argmax(-1, keepdim=True), 0.0)
        return out


@dataclass
class ParityReport:
    ok: bool
    sections: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, **self.sections}

    def format(self) -> str:
        lines = [f"parity: {'PASS' if self.ok else 'FAIL'}"]
        for name, sec in self.sections.items():
            if isinstance(sec, dict):
                body = ", ".join(f"{k}={_fmt(v)}" for k, v in sec.items())
                lines.append(f"  {name}: {body}")
            else:
                lines.append(f"  {name}: {_fmt(sec)}")
        return "\n".join(lines)


def _fmt(v: Any) -> str:
    return f"{v:.3g}" if isinstance(v, float) else str(v)


def _rel(a: np.ndarray, ref: np.ndarray) -> float:
    return float(np.abs(a - ref).max() / max(np.abs(ref).max(), 1e-12))


def round_reference_to_fp16(mods: ChatTTSModules, head_matrix: np.ndarray) -> None:
    """Give the torch modules the weights an fp16 bundle stores (same size rule as the export)."""
    with torch.no_grad():
        for net in (mods.gpt.gpt, mods.decoder, mods.vocos):
            for t in [*net.parameters(), *net.buffers()]:
                if t.is_floating_point() and t.numel() >= FP16_MIN_ELEMENTS:
                    t.copy_(t.half().float())
        w16 = torch.from_numpy(head_matrix.astype(np.float16).astype(np.float32))
        n = mods.sizes.num_audio_tokens
        for q, head in enumerate(mods.embed.head_code):
            w = w16[:, q * n : (q + 1) * n].T.contiguous()  # [626, hidden]
            par = head.parametrizations.weight
            par.original1.copy_(w)
            par.original0.copy_(w.norm(dim=1, keepdim=True))


def chattts_prompt(mods: ChatTTSModules, tokenizer_dir: Path, spk_emb: str, text: str):
    """ChatTTS's code-pass prompt: Tokenizer.encode, Embed, Speaker.apply (as _infer_code)."""
    from ChatTTS.model.speaker import Speaker
    from ChatTTS.model.tokenizer import Tokenizer

    tok = Tokenizer(str(tokenizer_dir))
    prompts = Speaker.decorate_code_prompts([text], "[speed_5]", None, spk_emb)
    input_ids, attention_mask, text_mask = tok.encode(prompts, mods.sizes.num_vq)
    emb = mods.embed(input_ids, text_mask)
    from .voices import speaker

    speaker(mods.sizes.hidden_size).apply(emb, spk_emb, input_ids, tok.spk_emb_ids, "cpu")
    return prompts[0], input_ids, attention_mask, emb


def _tokenizer_check(bundle: Path, prompt: str, input_ids: torch.Tensor) -> dict[str, Any]:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(bundle / "tokenizer.json"))
    tok.no_padding()
    tok.no_truncation()
    ids = tok.encode(prompt, add_special_tokens=False).ids
    return {"ids_equal": ids == input_ids[0, :, 0].tolist(), "tokens": len(ids)}


def check_gpt(mods, bundle: Path, emb, input_ids, attention_mask, steps: int) -> dict[str, Any]:
    n = mods.sizes.num_audio_tokens
    eos = n - 1
    rec = _GreedyRecorder(eos)
    for head in mods.embed.head_code:  # the value P.cached() recomputes every step, once
        if parametrize.is_parametrized(head, "weight"):
            parametrize.remove_parametrizations(head, "weight", leave_parametrized=True)
    logging.getLogger("ChatTTS.model.gpt").setLevel(
        logging.ERROR
    )  # "hit max_new_token" is the plan
    gen = mods.gpt.generate(
        emb.clone(),
        input_ids,
        temperature=torch.ones(mods.sizes.num_vq),
        eos_token=eos,
        attention_mask=attention_mask,
        max_new_token=steps,
        min_new_token=steps,
        logits_processors=(rec,),
        return_hidden=True,
        show_tqdm=True,
        ensure_non_empty=False,
    )
    out = list(gen)[-1]
    ref_codes = out.ids[0].numpy()  # [T, 4]
    ref_hidden = out.hiddens[0].numpy()  # [T, 768]
    ref_logits = np.stack(rec.logits)  # [T, 4, 626] (temperature 1)

    emb_code = np.load(bundle / "emb_code.npy")
    gpt = OnnxGpt(session(bundle / "gpt.onnx"))
    x = emb.numpy()
    codes, logits_diff, hidden_diff, first_div = [], 0.0, 0.0, None
    for t in tqdm(range(steps), desc="parity gpt", unit="step", leave=False):
        hidden, logits = gpt.run(x)
        lg = logits[0, -1].reshape(mods.sizes.num_vq, n)
        masked = lg.copy()
        masked[:, eos] = -np.inf
        c = masked.argmax(-1)
        codes.append(c)
        if first_div is None:
            logits_diff = max(logits_diff, float(np.abs(lg - ref_logits[t]).max()))
            hidden_diff = max(hidden_diff, float(np.abs(hidden[0, -1] - ref_hidden[t]).max()))
            if not np.array_equal(c, ref_codes[t]):
                first_div = t
        x = emb_code[np.arange(mods.sizes.num_vq), c].sum(0)[None, None, :]
    codes = np.stack(codes)
    same = steps if first_div is None else first_div
    return {
        "steps": steps,
        "codes_identical_steps": same,
        "first_divergence": first_div,
        "logits_max_abs": logits_diff,
        "hidden_max_abs": hidden_diff,
        "bound_logits_max_abs": LOGITS_MAX_ABS,
        "ok": first_div is None and steps >= MIN_STEPS and logits_diff <= LOGITS_MAX_ABS,
        "_ref_hidden": ref_hidden,
        "_distinct_codes": len(np.unique(codes)),
    }


def check_decoders(mods, bundle: Path, hiddens: np.ndarray) -> tuple[dict, dict]:
    h = torch.from_numpy(np.ascontiguousarray(hiddens.T[None], np.float32))  # [1, 768, T]
    with torch.inference_mode():
        ref_mel = mods.decoder(h.clone()).numpy()
        ref_wave = mods.vocos.decode(torch.from_numpy(ref_mel)).numpy()
        x = mods.vocos.head.out(mods.vocos.backbone(torch.from_numpy(ref_mel))).transpose(1, 2)
        mag, p = x.chunk(2, dim=1)
        mag = torch.clip(torch.exp(mag), max=1e2)
        ref_real, ref_imag = (mag * torch.cos(p)).numpy(), (mag * torch.sin(p)).numpy()
    mel = session(bundle / "decoder.onnx").run(["mel"], {"hidden": h.numpy()})[0]
    real, imag = session(bundle / "vocos.onnx").run(
        ["spec_real", "spec_imag"], {"mel": ref_mel.astype(np.float32)}
    )
    wave = istft(real[0], imag[0])[None]  # the device's ISTFT
    dec = {"frames": int(mel.shape[-1]), "mel_rel": _rel(mel, ref_mel), "bound_rel": REL_BOUND}
    dec["ok"] = mel.shape == ref_mel.shape and dec["mel_rel"] <= REL_BOUND
    voc = {
        "samples": int(wave.shape[-1]),
        "spec_rel": max(_rel(real, ref_real), _rel(imag, ref_imag)),
        "wave_rel": _rel(wave, ref_wave),
        "bound_rel": REL_BOUND,
    }
    voc["ok"] = wave.shape == ref_wave.shape and max(voc["spec_rel"], voc["wave_rel"]) <= REL_BOUND
    return dec, voc


def check_tables(bundle: Path, checkpoint: Path) -> dict[str, Any]:
    from safetensors.numpy import load_file

    embed = load_file(str(checkpoint / "asset" / "Embed.safetensors"))
    codes = np.load(bundle / "emb_code.npy")
    ref_codes = np.stack([embed[f"emb_code.{q}.weight"] for q in range(codes.shape[0])])
    text = np.load(bundle / "emb_text.npy", mmap_mode="r").astype(np.float32)
    ref_text = embed["emb_text.weight"]
    return {
        "emb_code_max_abs": float(np.abs(codes - ref_codes).max()),
        "emb_text_f16_rel": _rel(text, ref_text),  # f16 storage rounding (≤ 2^-11 relative)
        "ok": bool(np.array_equal(codes, ref_codes)) and _rel(text, ref_text) <= 1e-3,
    }


def run_parity(
    mods: ChatTTSModules,
    bundle: Path,
    checkpoint: Path,
    spk_emb: str,
    steps: int = MIN_STEPS,
    text: str = PARITY_TEXT,
    fp16_weights: bool = False,
) -> ParityReport:
    """Compare the bundle at ``bundle`` with ``mods``; ``mods`` is modified when fp16_weights."""
    t0 = time.perf_counter()
    if fp16_weights:
        from safetensors.numpy import load_file

        from .gpt_graph import code_head_matrix

        embed = load_file(str(checkpoint / "asset" / "Embed.safetensors"))
        round_reference_to_fp16(mods, code_head_matrix(embed, mods.sizes.num_vq))
    prompt, input_ids, attention_mask, emb = chattts_prompt(
        mods, checkpoint / "asset" / "tokenizer", spk_emb, text
    )
    gpt = check_gpt(mods, bundle, emb, input_ids, attention_mask, steps)
    ref_hidden = gpt.pop("_ref_hidden")
    distinct = gpt.pop("_distinct_codes")
    dec, voc = check_decoders(mods, bundle, ref_hidden)
    tables = check_tables(bundle, checkpoint)
    tok = _tokenizer_check(bundle, prompt, input_ids)
    ok = all(s["ok"] for s in (gpt, dec, voc, tables)) and tok["ids_equal"]
    return ParityReport(
        ok,
        {
            "reference": "chattts: GPT.generate (greedy, EOS masked), Decoder, vocos.decode",
            "reference_weights": "fp16-rounded" if fp16_weights else "fp32",
            "prompt": prompt,
            "prompt_tokens": int(input_ids.shape[1]),
            "distinct_codes": distinct,
            "gpt": gpt,
            "decoder": dec,
            "vocos": voc,
            "tables": tables,
            "tokenizer": tok,
            "seconds": round(time.perf_counter() - t0, 2),
        },
    )
