"""The ChatTTS engine on the tiny generated bundle: real ONNX sessions, tokenizer and files."""

from __future__ import annotations

import json
import shutil
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from speakd.audio import join_chunks
from speakd.engines.base import EngineError, SynthesisConfig, UnknownSpeakerError, UnknownVoiceError
from speakd.engines.bundle import BundleError
from speakd.engines.chattts.engine import ChatTTSEngine
from speakd.engines.chattts.reach import bundle_reach
from speakd.engines.chattts.sampling import CodeSampler, SamplingParams
from speakd.engines.chattts.vocoder import StreamingVocoder, StreamSchedule

SENTENCE = "Hello world, the kitchen lights are on."
# Long enough to exercise streaming, short enough to keep the file fast; min_new_token keeps the
# random tiny model from ending at step 3.
RUN = {"max_new_token": 96, "min_new_token": 96}


@pytest.fixture(scope="module")
def engine(tiny_bundle: Path) -> ChatTTSEngine:
    return ChatTTSEngine.load(tiny_bundle, threads=1)


def _snr_db(ref: np.ndarray, test: np.ndarray) -> float:
    noise = float(np.sum((ref.astype(np.float64) - test) ** 2))
    return (
        float("inf") if noise == 0 else 10 * np.log10(np.sum(ref.astype(np.float64) ** 2) / noise)
    )


def _stream(engine: ChatTTSEngine, hiddens: np.ndarray, schedule: StreamSchedule) -> np.ndarray:
    sv = StreamingVocoder(engine.vocoder, schedule, len(hiddens), hiddens.shape[1])
    parts = [p for h in hiddens if (p := sv.push(h)) is not None]
    tail = sv.finish()
    return np.concatenate([*parts, *([tail] if tail is not None else [])])


def test_bundle_with_missing_or_altered_file_is_refused(tiny_bundle: Path, tmp_path: Path) -> None:
    missing = tmp_path / "missing"
    shutil.copytree(tiny_bundle, missing)
    (missing / "vocos.onnx").unlink()
    with pytest.raises(BundleError, match=r"vocos\.onnx.*missing"):
        ChatTTSEngine.load(missing)
    altered = tmp_path / "altered"
    shutil.copytree(tiny_bundle, altered)
    data = bytearray((altered / "voices.npz").read_bytes())
    data[-20] ^= 0xFF
    (altered / "voices.npz").write_bytes(bytes(data))
    with pytest.raises(BundleError, match=r"voices\.npz.*sha256"):
        ChatTTSEngine.load(altered)


def test_voices_options_and_limits(engine: ChatTTSEngine) -> None:
    (voice,) = engine.voices()  # one voice, named for the bundle; its speakers are embeddings
    assert voice.name == engine.default_voice() == engine.bundle.path.name.removesuffix("-int8")
    assert voice.speakers[0] == "default"
    assert engine.audio_params(SynthesisConfig(voice=voice.name))["voice"] == "default"
    with pytest.raises(UnknownVoiceError, match=r"'nobody'"):
        list(engine.synthesize("hi", SynthesisConfig(voice="nobody")))
    with pytest.raises(UnknownSpeakerError, match=r"'nobody'.*its speakers: default") as e:
        engine.audio_params(SynthesisConfig(speaker="nobody"))
    assert e.value.code == "unknown_speaker"
    with pytest.raises(EngineError, match="top_q"):
        engine.audio_params(SynthesisConfig(extra={"top_q": 1}))
    with pytest.raises(EngineError, match="temperature"):
        list(engine.synthesize("hi", SynthesisConfig(extra={"temperature": -1})))
    with pytest.raises(EngineError, match="lang 'fr'"):
        engine.audio_params(SynthesisConfig(lang="fr"))
    with pytest.raises(EngineError, match="speed_level"):
        engine.audio_params(SynthesisConfig(extra={"speed_level": 12}))
    with pytest.raises(EngineError, match="top_k"):
        engine.audio_params(SynthesisConfig(extra={"top_k": "many"}))
    with pytest.raises(EngineError, match="at most 2000"):
        engine.normalize_text("a" * 2001)
    params = engine.audio_params(SynthesisConfig(speed=1.5))
    assert params["speed_level"] == 8 and params["temperature"] == pytest.approx(0.3)
    assert engine.normalize_text("12月2日，3.5 kg，$20") == "十二月二日，三点五千克，二十美元"
    assert (
        engine.normalize_text("It is 3.5 kg, $20.")
        == "It is three point five kilograms, twenty dollars."
    )


def test_prompt_follows_chattts(engine: ChatTTSEngine) -> None:
    text = engine.prompts.prompt_text("[Stts]hello[spk_emb]", speed=5)
    assert text == "[Stts][spk_emb][speed_5]hello[Ptts]"
    ids = engine.prompts.encode(text)
    tid = engine.spec.token_ids
    assert ids[0] == tid["Stts"] and ids[1] == tid["spk_emb"] and ids[-1] == tid["Ptts"]
    assert ids[2] == tid["speed_0"] + 5
    assert len(ids) < 20  # no padding to 256
    emb = engine.prompts.embed(ids, engine._voices["default"])
    assert np.linalg.norm(emb[0, 1]) == pytest.approx(1.0, abs=1e-5)  # replaced, normalised
    np.testing.assert_array_equal(emb[0, 0], engine.prompts.emb_text[ids[0]].astype(np.float32))


def test_in_place_kv_step_equals_full_prompt_pass(engine: ChatTTSEngine) -> None:
    """The KV written in place by prompt + steps gives what one pass over everything gives."""
    params = engine.audio_params(SynthesisConfig())
    prompt = engine.prompt_embeds(SENTENCE, params)
    utt = engine.decode(SENTENCE, SynthesisConfig(extra={"max_new_token": 12}), seed=3)
    assert len(utt.codes) == 12
    steps = np.stack([engine.gpt.emb_code[np.arange(4), c].sum(0) for c in utt.codes[:-1]])
    full = np.concatenate([prompt, steps[None]], axis=1)
    hidden, _ = engine.gpt.prompt(full)  # fresh pass from position 0 over prompt + 11 steps
    np.testing.assert_allclose(hidden, utt.hiddens[-1], atol=2e-4, rtol=1e-4)


def test_same_seed_same_audio_different_seed_different_audio(engine: ChatTTSEngine) -> None:
    def run(seed: int) -> bytes:
        extra = {"max_new_token": 48, "min_new_token": 48}
        chunk = join_chunks(engine.synthesize(SENTENCE, SynthesisConfig(seed=seed, extra=extra)))
        assert chunk is not None and chunk.sample_rate == 24000
        return chunk.pcm

    a, b, c = run(11), run(11), run(12)
    assert a == b
    assert a != c
    assert len(a) // 2 == 48 * 512 - 256  # 48 steps → (2·48 − 1)·256 samples


def test_seed_none_is_derived_from_the_request(engine: ChatTTSEngine) -> None:
    cfg = SynthesisConfig(extra={"max_new_token": 20, "min_new_token": 20})
    first = join_chunks(engine.synthesize("你好。", cfg))
    again = join_chunks(engine.synthesize("你好。", cfg))
    assert first is not None and again is not None and first.pcm == again.pcm


def test_no_session_keeps_spinning_after_its_run(tiny_bundle: Path) -> None:
    """The GPT, Decoder and Vocos pools spin while they run but not after: a pool still spinning
    takes a core from the next session and the Python between runs (docs/benchmarks.md,
    "Batched decoding"). Without ``session.force_spinning_stop`` a spinning 2-thread pool burns
    20-40 ms of CPU in the 0.2 s after its run."""
    engine = ChatTTSEngine.load(tiny_bundle, threads=2)
    rng = np.random.default_rng(0)
    hidden = rng.normal(0, 1, (1, engine.spec.hidden_size, 24)).astype(np.float32)
    (mel,) = engine.vocoder.decoder.run(["mel"], {"hidden": hidden})
    runs = {
        "gpt": lambda: engine.gpt.prompt(rng.normal(0, 0.5, (1, 12, hidden.shape[1])).astype("f4")),
        "decoder": lambda: engine.vocoder.decoder.run(["mel"], {"hidden": hidden}),
        "vocos": lambda: engine.vocoder.vocos.run(None, {"mel": mel}),
    }
    for name, run in runs.items():
        burnt = []
        for _ in range(3):
            run()
            cpu = time.process_time()
            time.sleep(0.2)
            burnt.append(time.process_time() - cpu)
        assert min(burnt) < 0.005, f"{name}: {burnt} s of CPU after its run"


def test_receptive_field_is_read_from_the_graphs(tiny_bundle: Path) -> None:
    """ChatTTS's architecture: conv_in ±1 ±1, blocks of kernel 7 dilation 2 (±6), out_conv ±1;
    Vocos embed ±3 and blocks of kernel 7 (±3). The sizes come from the checkpoint's manifest."""
    sizes = json.loads((tiny_bundle / "manifest.json").read_text())["source"]["sizes"]
    reach = bundle_reach(tiny_bundle / "decoder.onnx", tiny_bundle / "vocos.onnx")
    assert reach.decoder == 3 + 6 * sizes["decoder"]["n_layer"]
    assert reach.vocos == 3 + 3 * sizes["vocos_layers"]
    assert reach.steps == -(-(reach.decoder + reach.vocos + 2) // 2)


def test_streamed_equals_one_shot(engine: ChatTTSEngine, tiny_bundle: Path) -> None:
    utt = engine.decode(SENTENCE, SynthesisConfig(extra=RUN), seed=5)
    one_shot = engine.vocoder.waveform(utt.hiddens)
    assert len(one_shot) == (2 * len(utt.hiddens) - 1) * 256
    # context = the receptive field read from the graphs: equal up to float rounding
    reach = bundle_reach(tiny_bundle / "decoder.onnx", tiny_bundle / "vocos.onnx")
    exact = _stream(engine, utt.hiddens, StreamSchedule.exact(reach.steps))
    assert len(exact) == len(one_shot)
    assert _snr_db(one_shot, exact) >= 110.0
    # A schedule with context below the tiny model's receptive field must show it (the test can
    # fail), and the default schedule is what the engine streams.
    starved_schedule = StreamSchedule(first_chunk=8, chunk=8, left=1, right=0, first_right=0)
    starved = _stream(engine, utt.hiddens, starved_schedule)
    assert len(starved) == len(one_shot) and _snr_db(one_shot, starved) < 40.0
    engine_pcm = join_chunks(engine.synthesize(SENTENCE, SynthesisConfig(seed=5, extra=RUN)))
    default = _stream(engine, utt.hiddens, engine.schedule)
    assert engine_pcm is not None
    expected = (np.clip(default, -1, 1) * 32767).astype("<i2")
    np.testing.assert_array_equal(engine_pcm.samples(), expected)


def test_a_render_decodes_its_new_steps_and_the_schedule_overlap(engine: ChatTTSEngine) -> None:
    """Each render's Decoder/Vocos input is its chunk's steps and look-ahead plus ``left`` steps
    already emitted (fewer at the start), and it keeps exactly its chunk's samples."""
    utt = engine.decode(SENTENCE, SynthesisConfig(extra=RUN), seed=5)
    n, schedule = len(utt.hiddens), engine.schedule
    sv = StreamingVocoder(engine.vocoder, schedule, n, utt.hiddens.shape[1])
    renders = [(r, False) for h in utt.hiddens if (r := sv.add(h)) is not None]
    tail = sv.final()
    assert tail is not None and len(renders) >= 4
    done = 0
    for k, (render, final) in enumerate([*renders, (tail, True)]):
        end = n if final else done + schedule.size(k)
        w0, w1 = max(0, done - schedule.left), n if final else end + schedule.look_ahead(k)
        np.testing.assert_array_equal(render.hiddens, utt.hiddens[w0:w1])
        assert render.b - render.a == (end - done) * 512 - (256 if final else 0)
        done = end
    assert done == n


def test_first_chunk_is_small(engine: ChatTTSEngine) -> None:
    chunks = engine.synthesize(SENTENCE, SynthesisConfig(seed=1, extra=RUN))
    first = next(chunks)
    chunks.close()
    assert first.frames == engine.schedule.first_chunk * 512


def test_cancel_stops_within_one_step(engine: ChatTTSEngine) -> None:
    cancel = threading.Event()
    calls = {"n": 0}
    step = engine.gpt.step

    def counting_step(codes: np.ndarray):
        calls["n"] += 1
        return step(codes)

    engine.gpt.step = counting_step
    try:
        gen = engine.synthesize(SENTENCE, SynthesisConfig(seed=2, extra=RUN), cancel)
        next(gen)
        cancel.set()
        at_cancel = calls["n"]
        rest = list(gen)
    finally:
        del engine.gpt.step
    assert rest == []
    assert calls["n"] - at_cancel <= 1

    sampler = CodeSampler(SamplingParams(max_new_token=50, min_new_token=50), 625, seed=0)
    cancel = threading.Event()
    steps = 0
    for _codes, _hidden in engine.gpt.generate(
        engine.prompt_embeds(SENTENCE, engine.audio_params(SynthesisConfig())), sampler, cancel
    ):
        steps += 1
        if steps == 7:
            cancel.set()
    assert steps == 7


def test_long_text_goes_sentence_by_sentence(engine: ChatTTSEngine) -> None:
    cfg = SynthesisConfig(seed=4, extra={"max_new_token": 10, "min_new_token": 10})
    text = "第一句。第二句。第三句。"
    chunk = join_chunks(engine.synthesize(text, cfg))
    assert chunk is not None
    assert chunk.frames == 3 * (10 * 512 - 256)  # three utterances, KV restarted each time


@pytest.mark.host
def test_greedy_codes_equal_chattts_torch(tiny_checkpoint: Path, engine: ChatTTSEngine) -> None:
    """ChatTTS's GPT.generate with its own processors, forced to argmax, vs the ONNX engine."""
    torch = pytest.importorskip("torch")
    from ChatTTS.model.processors import gen_logits
    from ChatTTS.model.speaker import Speaker
    from ChatTTS.model.tokenizer import Tokenizer

    from speakd_tools.chattts.modules import load_modules
    from speakd_tools.chattts.voices import speaker

    torch.set_num_threads(1)  # ChatTTS's loop is overhead-bound; 2 threads only contend
    mods = load_modules(tiny_checkpoint)
    with torch.no_grad():  # the bundle stores emb_text in fp16 (docs/bundle-format.md)
        w = mods.embed.emb_text.weight
        w.copy_(w.half().float())
    steps = 80
    spk_emb = engine.bundle.manifest["voices"]["default"]["spk_emb"]
    tok = Tokenizer(str(tiny_checkpoint / "asset" / "tokenizer"))
    prompts = Speaker.decorate_code_prompts([SENTENCE], "[speed_5]", None, spk_emb)
    input_ids, attention_mask, text_mask = tok.encode(prompts, 4)
    emb = mods.embed(input_ids, text_mask)
    speaker(768).apply(emb, spk_emb, input_ids, tok.spk_emb_ids, "cpu")
    warpers, procs = gen_logits(num_code=625, top_P=0.7, top_K=20, repetition_penalty=1.05)

    def argmax(_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        return torch.full_like(scores, -torch.inf).scatter_(1, scores.argmax(-1, keepdim=True), 0)

    out = list(
        mods.gpt.generate(
            emb, input_ids, temperature=torch.tensor([0.3] * 4), eos_token=625,
            attention_mask=attention_mask, max_new_token=steps, min_new_token=0,
            logits_processors=(*procs, *warpers, argmax), return_hidden=True,
            show_tqdm=False, ensure_non_empty=False,
        )
    )[-1]  # fmt: skip
    ref_codes = out.ids[0].numpy()
    utt = engine.decode(SENTENCE, SynthesisConfig(extra={"greedy": True, "max_new_token": steps}))
    assert len(ref_codes) > 20
    np.testing.assert_array_equal(utt.codes, ref_codes)
    np.testing.assert_allclose(utt.hiddens, out.hiddens[0].numpy(), atol=1e-3)
