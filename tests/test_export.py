"""Checkpoint → bundle: contract of docs/bundle-format.md, hashes, parity, fp16."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("ChatTTS")

from speakd.engines.bundle import BundleError, load_bundle
from speakd_tools.chattts.parity import OnnxGpt, session

pytestmark = pytest.mark.host

FILES = {
    "gpt.onnx",
    "decoder.onnx",
    "vocos.onnx",
    "emb_text.npy",
    "emb_code.npy",
    "tokenizer.json",
    "voices.npz",
}


def test_bundle_verifies_and_follows_the_contract(tiny_bundle: Path) -> None:
    b = load_bundle(tiny_bundle)  # checks every sha256
    m = b.manifest
    assert (b.engine, b.precision, m["sample_rate"]) == ("chattts", "fp32", 24000)
    assert set(m["files"]) == FILES
    model = m["model"]
    assert (model["num_layers"], model["hidden_size"], model["eos_token"]) == (2, 768, 625)
    assert model["token_ids"]["spk_emb"] == 21143 and model["token_ids"]["speed_0"] == 21168
    assert m["defaults"]["temperature"] == 0.3 and m["defaults"]["repetition_window"] == 16
    assert m["source"]["real_weights"] is False
    assert len(m["source"]["files"]) == 9
    assert np.load(tiny_bundle / "emb_text.npy", mmap_mode="r").dtype == np.float16
    assert np.load(tiny_bundle / "emb_code.npy").shape == (4, 626, 768)
    voices = np.load(tiny_bundle / "voices.npz")
    assert "default" in m["voices"] and len(m["voices"]) >= 4
    for v in m["voices"].values():
        assert voices[v["key"]].shape == (768,) and voices[v["key"]].dtype == np.float32
        assert isinstance(v["spk_emb"], str) and v["seed"] is not None
    assert not np.array_equal(
        voices["default"], voices[next(k for k in m["voices"] if k != "default")]
    )


def test_export_parity_report_holds_the_bounds(tiny_bundle: Path) -> None:
    p = json.loads((tiny_bundle / "manifest.json").read_text())["parity"]
    assert p["ok"] is True
    gpt = p["gpt"]
    assert gpt["steps"] >= 200 and gpt["codes_identical_steps"] == gpt["steps"]
    assert gpt["first_divergence"] is None and gpt["logits_max_abs"] <= 1e-3
    assert p["distinct_codes"] > 50  # random weights do not collapse to one repeated code
    assert p["decoder"]["mel_rel"] <= 1e-4 and p["decoder"]["frames"] == 2 * gpt["steps"]
    assert p["vocos"]["spec_rel"] <= 1e-4 and p["vocos"]["wave_rel"] <= 1e-4
    assert p["tokenizer"]["ids_equal"] and p["tables"]["emb_code_max_abs"] == 0.0


def test_gpt_graph_io_and_batched_rows_match_single(tiny_bundle: Path) -> None:
    sess = session(tiny_bundle / "gpt.onnx")
    ins = {i.name: i for i in sess.get_inputs()}
    assert ins["inputs_embeds"].shape == ["batch", "sequence", 768]
    assert ins["seqlens_k"].type == "tensor(int32)" and ins["total_sequence_length"].shape == []
    assert ins["past_key_1"].shape == ["batch", 12, "max_context", 64]
    assert [o.name for o in sess.get_outputs()[:2]] == ["hidden", "logits"]
    # Batch 2 with prompts of 7 and 5 tokens (right-padded, per-row seqlens_k) equals two
    # single-row runs: the batched prompt pass and decode steps the bundle format promises.
    rng = np.random.default_rng(0)
    prompts = [rng.normal(0, 0.1, (1, n, 768)).astype(np.float32) for n in (7, 5)]
    steps = rng.normal(0, 0.1, (3, 2, 1, 768)).astype(np.float32)
    singles = []
    for r, p in enumerate(prompts):
        g = OnnxGpt(sess)
        logits = [g.run(p)[1][0, -1]] + [g.run(x[r : r + 1])[1][0, -1] for x in steps]
        singles.append(logits)
    both = OnnxGpt(sess, batch=2)
    padded = np.zeros((2, 7, 768), np.float32)
    padded[0], padded[1, :5] = prompts[0][0], prompts[1][0]
    _, first = both.run(padded, lengths=[7, 5])
    np.testing.assert_allclose(first[0, 6], singles[0][0], atol=1e-5)
    np.testing.assert_allclose(first[1, 4], singles[1][0], atol=1e-5)
    for i, x in enumerate(steps, start=1):
        _, lg = both.run(x)
        assert lg.shape == (2, 1, 2504)
        np.testing.assert_allclose(lg[0, 0], singles[0][i], atol=1e-5)
        np.testing.assert_allclose(lg[1, 0], singles[1][i], atol=1e-5)
    assert both.past_len.tolist() == [10, 8]


def test_tampered_file_fails_with_its_name(tiny_bundle: Path, tmp_path: Path) -> None:
    copy = Path(shutil.copytree(tiny_bundle, tmp_path / "bundle"))
    data = bytearray((copy / "decoder.onnx").read_bytes())
    data[len(data) // 2] ^= 0xFF
    (copy / "decoder.onnx").write_bytes(bytes(data))
    with pytest.raises(BundleError, match=r"decoder\.onnx: sha256"):
        load_bundle(copy)


def test_fp16_export_loads_and_runs(
    tiny_checkpoint: Path, tiny_bundle: Path, tmp_path: Path
) -> None:
    """fp16 stores weights as float16 with a Cast to float32 (parity of that path: CLI/bench)."""
    from speakd_tools.chattts.export import ExportOptions, export_bundle

    result = export_bundle(
        ExportOptions(tiny_checkpoint, tmp_path / "fp16", precision="fp16", parity=False)
    )
    b = load_bundle(result.bundle)
    assert (b.precision, b.manifest["parity"]) == ("fp16", None)
    for f in ("gpt.onnx", "decoder.onnx"):
        assert (b.path / f).stat().st_size < 0.6 * (tiny_bundle / f).stat().st_size
    # Same inputs through the fp32 and fp16 graphs: fp16 storage only rounds the weights.
    rng = np.random.default_rng(1)
    x = rng.normal(0, 0.1, (1, 5, 768)).astype(np.float32)
    _, l32 = OnnxGpt(session(tiny_bundle / "gpt.onnx")).run(x)
    _, l16 = OnnxGpt(session(b.path / "gpt.onnx")).run(x)
    assert 0 < np.abs(l16 - l32).max() < 0.05
    h = rng.normal(0, 1, (1, 768, 6)).astype(np.float32)
    mel32, mel16 = (
        session(p / "decoder.onnx").run(None, {"hidden": h})[0] for p in (tiny_bundle, b.path)
    )
    assert mel16.shape == (1, 100, 12) and np.abs(mel16 - mel32).max() < 1e-2 * np.abs(mel32).max()
    spec = session(b.path / "vocos.onnx").run(None, {"mel": mel16})
    assert [s.shape for s in spec] == [(1, 513, 12)] * 2 and np.isfinite(spec[0]).all()


def test_cli_refuses_a_context_too_small_for_parity(
    tiny_checkpoint: Path, tmp_path, capsys
) -> None:
    from speakd_tools.cli import main

    args = ["export", "--checkpoint", str(tiny_checkpoint), "--out", str(tmp_path / "b")]
    assert main([*args, "--max-context", "128"]) == 2
    assert "--max-context 128 is too small" in capsys.readouterr().err
    assert main([*args, "--parity-steps", "50"]) == 2
    assert "at least 200" in capsys.readouterr().err


def test_parity_catches_a_wrong_graph(tiny_checkpoint: Path, tiny_bundle: Path, tmp_path) -> None:
    """The bounds are not vacuous: a 1 % error in one weight vector breaks them."""
    import onnx
    import torch
    from safetensors.numpy import load_file

    from speakd_tools.chattts import parity
    from speakd_tools.chattts.export import DecoderForExport, _torch_export
    from speakd_tools.chattts.gpt_graph import GptGraphSpec, build_gpt_graph
    from speakd_tools.chattts.modules import load_modules

    mods = load_modules(tiny_checkpoint)
    asset = tiny_checkpoint / "asset"
    trunk = load_file(str(asset / "gpt" / "model.safetensors"))
    trunk["norm.weight"] = trunk["norm.weight"] * 1.01
    spec = GptGraphSpec.from_sizes(mods.sizes, 512)
    onnx.save(
        build_gpt_graph(spec, trunk, load_file(str(asset / "Embed.safetensors"))),
        str(tmp_path / "gpt.onnx"),
    )
    (tmp_path / "emb_code.npy").symlink_to(tiny_bundle / "emb_code.npy")
    (tmp_path / "vocos.onnx").symlink_to(tiny_bundle / "vocos.onnx")
    spk = json.loads((tiny_bundle / "manifest.json").read_text())["voices"]["default"]["spk_emb"]
    _, ids, mask, emb = parity.chattts_prompt(mods, asset / "tokenizer", spk, "hello")
    gpt = parity.check_gpt(mods, tmp_path, emb, ids, mask, steps=8)
    assert not gpt["ok"] and gpt["logits_max_abs"] > 1e-3

    wrong = DecoderForExport(mods.decoder)
    wrong.coef.mul_(1.01)
    _torch_export(
        wrong, torch.randn(1, 768, 4), tmp_path / "decoder.onnx", "hidden", ["mel"], "steps"
    )
    dec, voc = parity.check_decoders(mods, tmp_path, np.random.default_rng(0).normal(size=(6, 768)))
    assert not dec["ok"] and dec["mel_rel"] > 1e-4 and voc["ok"]
