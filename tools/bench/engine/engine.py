"""speakd's ChatTTS engine vs ChatTTS's own torch pipeline, same checkpoint, same decode steps.

    speakd-tools bench engine --checkpoint CKPT --bundle BUNDLE [--steps 520] [--snr-sweep]

Each side runs in its own fresh process (so peak RSS is its own) on the same text, with the same
number of decode steps (``min_new_token = max_new_token = steps``, so EOS never ends either early):

* speakd: ``ChatTTSEngine.synthesize`` (streaming, default schedule) → time to first audio, total,
  RTF; ms/step around context 100 and 500 from per-step timestamps of the decode loop; playback
  stall and the gapless first-audio time from the chunks' arrival times (``playback``).
* torch: ChatTTS's modules driven as ``Chat.infer(skip_refine_text=True)`` drives them
  (Tokenizer, Embed, ``Speaker.apply``, ``GPT.generate`` with ``gen_logits`` processors, Decoder,
  ``Vocos.decode``).
  ``Chat.load`` itself refuses non-official weights (sha256 check), so the modules are built by
  ``speakd_tools.chattts.modules``. RTF from a non-streamed run; time to first audio from a
  ``stream=True`` run decoded the way ``Chat._infer`` streams (every 24 steps, first 2 batches
  skipped, whole prefix re-decoded).

One run per side; the numbers are wall-clock on a shared machine. Random weights show speed and
plumbing, not voice quality. Prints a table with speakd/torch ratios and one JSON line. The speakd
side also reports the SNR of its streamed audio against the one-shot decode of the same codes.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

from ..harness.stats import in_child, peak_rss_mb

TEXT = "Hello world, the kitchen lights are on and the front door is locked for the night."
CONTEXTS = (100, 500)
WINDOW = 10  # steps either side of a context for the ms/step median


def _ms_per_step_at(stamps: list[float], prompt_len: int) -> dict[str, float | None]:
    """stamps[i] = time step i finished; step i runs at context prompt_len + i."""
    out: dict[str, float | None] = {}
    for ctx in CONTEXTS:
        lo, hi = ctx - prompt_len - WINDOW, ctx - prompt_len + WINDOW
        d = [(stamps[i] - stamps[i - 1]) * 1e3 for i in range(max(lo, 1), min(hi, len(stamps)))]
        out[f"ms_per_step_ctx{ctx}"] = statistics.median(d) if d else None
    return out


def playback(arrivals: list[tuple[float, float]]) -> dict[str, float]:
    """Real-time playback of chunks (arrival s, duration s) that starts at the first arrival:
    total gap where the player waits for the next chunk, and the earliest start that plays
    without any gap (first arrival + the prebuffer that covers the worst lateness)."""
    if not arrivals:
        return {"stall_s": 0.0, "gapless_first_audio_s": 0.0}
    first = arrivals[0][0]
    end, stall, lateness, played = first, 0.0, 0.0, 0.0
    for at, seconds in arrivals:
        stall += max(0.0, at - end)
        end = max(end, at) + seconds
        lateness = max(lateness, at - (first + played))
        played += seconds
    return {"stall_s": stall, "gapless_first_audio_s": first + lateness}


def stream_snr(
    engine: Any, config: Any, schedules: list[Any], text: str = TEXT
) -> dict[str, float]:
    """SNR (dB) of each streaming schedule against the one-shot waveform of the same codes."""
    import numpy as np

    from speakd.engines.chattts.vocoder import StreamingVocoder

    utt = engine.decode(engine.normalize_text(text), config, seed=1)
    ref = engine.vocoder.waveform(utt.hiddens).astype(np.float64)
    out = {}
    for sched in schedules:
        sv = StreamingVocoder(engine.vocoder, sched, len(utt.hiddens), utt.hiddens.shape[1])
        parts = [a for h in utt.hiddens if (a := sv.push(h)) is not None]
        parts.append(sv.finish())
        got = np.concatenate([p for p in parts if p is not None])
        err = float(np.sum((ref - got) ** 2))
        out[f"snr_db_{sched.name}"] = 10 * np.log10(np.sum(ref**2) / err) if err else float("inf")
    return out


def snr_sweep(bundle: Path, steps: int, threads: int) -> dict[str, float]:
    """Streamed-vs-one-shot SNR for context = 0..52 steps (chunk 32, first chunk 8)."""
    from speakd.engines.base import SynthesisConfig
    from speakd.engines.chattts.engine import ChatTTSEngine
    from speakd.engines.chattts.vocoder import StreamSchedule

    engine = ChatTTSEngine.load(bundle, threads=threads)
    config = SynthesisConfig(extra={"max_new_token": steps, "min_new_token": steps})
    sweep = [(1, 0), (2, 2), (4, 4), (8, 8), (12, 12), (24, 24), (52, 52)]
    schedules = [
        StreamSchedule(
            f"{lo}/{r}",
            first_chunk=8,
            chunk=32,
            left=lo,
            right=r,
            first_right=r,
            growth=1.0,
            max_chunk=32,
        )
        for lo, r in sweep
    ]
    return stream_snr(engine, config, schedules)


def run_speakd(bundle: Path, steps: int, threads: int, text: str = TEXT) -> dict[str, Any]:
    from speakd.engines.base import SynthesisConfig
    from speakd.engines.chattts.engine import ChatTTSEngine

    t0 = time.perf_counter()
    engine = ChatTTSEngine.load(bundle, threads=threads)
    load_s = time.perf_counter() - t0
    stamps: list[float] = []
    step = engine.gpt.step
    gpt_s = [0.0]
    spectra = engine.vocoder.spectra
    renders: list[tuple[int, float]] = []  # (window steps, seconds) per Decoder+Vocos pass

    def timed_step(codes: Any) -> Any:
        t = time.perf_counter()
        out = step(codes)
        stamps.append(time.perf_counter())
        gpt_s[0] += stamps[-1] - t
        return out

    def timed_spectra(hiddens: Any) -> Any:
        t = time.perf_counter()
        out = spectra(hiddens)
        renders.append((len(hiddens), time.perf_counter() - t))
        return out

    engine.gpt.step = timed_step  # type: ignore[method-assign]
    engine.vocoder.spectra = timed_spectra  # type: ignore[method-assign]
    config = SynthesisConfig(seed=1, extra={"max_new_token": steps, "min_new_token": steps})
    prompt_len = engine.prompt_embeds(engine.normalize_text(text), engine.audio_params(config))
    t0 = time.perf_counter()
    arrivals: list[tuple[float, float]] = []
    for chunk in engine.synthesize(text, config):
        arrivals.append((time.perf_counter() - t0, chunk.frames / engine.sample_rate))
    total = time.perf_counter() - t0
    audio_s = sum(seconds for _, seconds in arrivals)
    engine.gpt.step = step  # type: ignore[method-assign]
    engine.vocoder.spectra = spectra  # type: ignore[method-assign]
    from speakd.engines.chattts.reach import bundle_reach
    from speakd.engines.chattts.vocoder import StreamSchedule

    reach = bundle_reach(bundle / "decoder.onnx", bundle / "vocos.onnx")
    exact = StreamSchedule.exact(reach.steps)
    snr = stream_snr(engine, config, [engine.schedule, exact], text)
    return {
        **snr,
        "side": "speakd", "load_s": load_s, "first_audio_s": arrivals[0][0], "total_s": total,
        **playback(arrivals), "chunks": len(arrivals),
        "audio_s": audio_s, "rtf": total / audio_s, "steps": len(stamps) + 1,
        **_ms_per_step_at(stamps, prompt_len.shape[1]), "peak_rss_mb": peak_rss_mb(),
        "schedule": engine.schedule.key,
        # where the time went: GPT steps, Decoder+Vocos passes (the first one: first audio's)
        "gpt_s": gpt_s[0], "renders": len(renders), "render_s": sum(s for _, s in renders),
        "render_window_steps": sum(w for w, _ in renders), "first_render_s": renders[0][1],
        "reach_frames": {"decoder": reach.decoder, "vocos": reach.vocos, "istft": reach.istft},
        "reach_steps": reach.steps,
    }  # fmt: skip


def run_torch(
    checkpoint: Path, bundle: Path, steps: int, threads: int, text: str = TEXT
) -> dict[str, Any]:
    import numpy as np
    import torch
    from ChatTTS.model.processors import gen_logits
    from ChatTTS.model.speaker import Speaker
    from ChatTTS.model.tokenizer import Tokenizer

    from speakd.engines.chattts.text import normalize
    from speakd_tools.chattts.modules import load_modules
    from speakd_tools.chattts.voices import speaker

    torch.set_num_threads(threads)
    t0 = time.perf_counter()
    mods = load_modules(checkpoint)
    tok = Tokenizer(str(checkpoint / "asset" / "tokenizer"))
    spk = speaker(mods.sizes.hidden_size)
    load_s = time.perf_counter() - t0
    spk_emb = json.loads((bundle / "manifest.json").read_text())["voices"]["default"]["spk_emb"]
    warpers, procs = gen_logits(num_code=625, top_P=0.7, top_K=20, repetition_penalty=1.05)
    stamps: list[float] = []

    def stamp(_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        stamps.append(time.perf_counter())
        return scores

    def generate(stream: bool):
        torch.manual_seed(1)
        prompts = Speaker.decorate_code_prompts([normalize(text)], "[speed_5]", None, spk_emb)
        input_ids, attention_mask, text_mask = tok.encode(prompts, mods.sizes.num_vq)
        emb = mods.embed(input_ids, text_mask)
        spk.apply(emb, spk_emb, input_ids, tok.spk_emb_ids, "cpu")
        return input_ids.shape[1], mods.gpt.generate(
            emb, input_ids, temperature=torch.tensor([0.3] * 4), eos_token=625,
            attention_mask=attention_mask, max_new_token=steps, min_new_token=steps,
            logits_processors=(stamp, *procs, *warpers), return_hidden=True, stream=stream,
            show_tqdm=False, ensure_non_empty=False, stream_batch=24,
        )  # fmt: skip

    def wav(hiddens: torch.Tensor) -> np.ndarray:  # Chat._decode_to_wavs + _vocos_decode
        with torch.inference_mode():
            mel = mods.decoder(hiddens.T[None].contiguous())
            return mods.vocos.decode(mel).numpy()

    with torch.inference_mode():
        t0 = time.perf_counter()
        prompt_len, gen = generate(stream=False)
        out = list(gen)[-1]
        audio = wav(out.hiddens[0])
        total = time.perf_counter() - t0
        run_stamps = list(stamps)
        stamps.clear()
        # Chat._infer(stream=True): every yield (24 steps) re-decodes the whole prefix; the
        # first pass_first_n_batches=2 are dropped, so the third one is the first audio.
        t0 = time.perf_counter()
        first = None
        for n, partial in enumerate(generate(stream=True)[1]):
            wav(partial.hiddens[0])
            if n >= 2:
                first = time.perf_counter() - t0
                break
    audio_s = audio.shape[-1] / 24000
    return {
        "side": "torch", "load_s": load_s, "first_audio_s": first, "total_s": total,
        "audio_s": audio_s, "rtf": total / audio_s, "steps": len(out.ids[0]),
        **_ms_per_step_at(run_stamps, prompt_len), "peak_rss_mb": peak_rss_mb(),
    }  # fmt: skip


def _child(args: argparse.Namespace, side: str) -> dict[str, Any]:
    paths = ["--checkpoint", str(args.checkpoint), "--bundle", str(args.bundle)]
    sizes = ["--steps", str(args.steps), "--threads", str(args.threads)]
    return in_child(["engine", "--side", side, *paths, *sizes])


def _fmt(v: Any) -> str:
    return f"{v:.3f}" if isinstance(v, float) else str(v)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--checkpoint", type=Path, required=True, help="folder that contains asset/")
    p.add_argument("--bundle", type=Path, required=True, help="fp32 bundle exported from it")
    p.add_argument(
        "--steps", type=int, default=520, help="decode steps per side (≥ 510 for ctx 500)"
    )
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--side", choices=("speakd", "torch"), help=argparse.SUPPRESS)
    p.add_argument(
        "--snr-sweep",
        action="store_true",
        help="only the streamed-vs-one-shot SNR per context (speakd)",
    )


def run(args: argparse.Namespace) -> int:
    if args.snr_sweep:
        print(json.dumps(snr_sweep(args.bundle, args.steps, args.threads)))
        return 0
    if args.side == "speakd":
        print(json.dumps(run_speakd(args.bundle, args.steps, args.threads)))
        return 0
    if args.side == "torch":
        print(json.dumps(run_torch(args.checkpoint, args.bundle, args.steps, args.threads)))
        return 0
    ours, ref = _child(args, "speakd"), _child(args, "torch")
    keys = [
        *("load_s", "first_audio_s", "gapless_first_audio_s", "stall_s", "total_s", "audio_s"),
        *("rtf", "steps", *(f"ms_per_step_ctx{c}" for c in CONTEXTS), "peak_rss_mb"),
        *(k for k in ours if k.startswith("snr_db_")),
    ]
    print(f"{'':22}{'speakd':>12}{'torch':>12}{'speakd/torch':>14}")
    for k in keys:
        a, b = ours.get(k), ref.get(k)
        ratio = f"{a / b:.2f}" if isinstance(a, float) and isinstance(b, float) and b else ""
        print(f"{k:22}{_fmt(a):>12}{_fmt(b):>12}{ratio:>14}")
    print(json.dumps({"speakd": ours, "torch": ref}))
    return 0
