"""Generated ChatTTS checkpoints: ChatTTS's layout, strict loading, tokenizer, hashes, errors."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict
from pathlib import Path

import pytest

pytest.importorskip("ChatTTS")

from speakd_tools.chattts import checkpoint as ckpt
from speakd_tools.chattts.checkpoint import (
    ASSET_FILES,
    CheckpointError,
    CheckpointSizes,
    read_sizes,
    source_report,
)
from speakd_tools.cli import main

pytestmark = pytest.mark.host


def test_layout_matches_chattts_and_modules_load_strictly(tiny_checkpoint: Path) -> None:
    from speakd_tools.chattts.modules import load_modules

    for rel in ASSET_FILES:
        assert (tiny_checkpoint / rel).is_file(), rel
    mods = load_modules(tiny_checkpoint)  # load_state_dict(strict=True) on every file
    assert mods.sizes == CheckpointSizes.tiny() == read_sizes(tiny_checkpoint)
    assert not hasattr(mods.gpt.gpt, "embed_tokens")
    w = mods.embed.state_dict()
    assert "head_code.0.parametrizations.weight.original0" in w  # weight norm g/v as stored


def test_full_sizes_are_chatttss_config() -> None:
    from ChatTTS.config import Config

    cfg, full = Config(), CheckpointSizes.full()
    assert asdict(full.decoder) == asdict(cfg.decoder)
    assert asdict(full.dvae_encoder) == asdict(cfg.dvae.encoder)
    assert asdict(full.dvae_decoder) == asdict(cfg.dvae.decoder)
    assert (full.vocos_dim, full.vocos_intermediate, full.vocos_layers) == (
        cfg.vocos.backbone.init_args.dim,
        cfg.vocos.backbone.init_args.intermediate_dim,
        cfg.vocos.backbone.init_args.num_layers,
    )
    # The full gpt/config.json is byte-identical to the real one (ChatTTS's sha256 map).
    text = json.dumps(full.gpt_config(), indent=2) + "\n"
    expected = ckpt.chattts_sha256_map()["asset/gpt/config.json"]
    assert hashlib.sha256(text.encode()).hexdigest() == expected


def test_tokenizer_has_chattts_ids_and_traps(tiny_checkpoint: Path) -> None:
    from ChatTTS.model.tokenizer import Tokenizer as ChatTTSTokenizer
    from tokenizers import Tokenizer

    folder = tiny_checkpoint / "asset" / "tokenizer"
    chat_tok = ChatTTSTokenizer(str(folder))  # transformers BertTokenizerFast, like Chat.load
    assert chat_tok.len == 21178
    assert (chat_tok.spk_emb_ids, chat_tok.break_0_ids, chat_tok.eos_token) == (21143, 21147, 21136)
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    assert (
        tok.padding["length"] == 256 and tok.truncation["max_length"] == 256
    )  # like the real file
    tok.no_padding()
    tok.no_truncation()
    assert tok.token_to_id("[PAD]") == 0 and tok.token_to_id("[UNK]") == 100
    enc = tok.encode(
        "[Stts][spk_emb]Turn on the kitchen lights 你好。[Ptts]", add_special_tokens=False
    )
    assert enc.tokens[:2] == ["[Stts]", "[spk_emb]"] and enc.ids[-1] == 21132
    assert "kitchen" in enc.tokens and "你" in enc.tokens and 100 not in enc.ids
    # tokenizer_config.json and special_tokens_map.json are byte-identical to ChatTTS's.
    report = source_report(tiny_checkpoint)
    assert report["files"]["asset/tokenizer/tokenizer_config.json"]["matches_chattts"]
    assert report["files"]["asset/tokenizer/special_tokens_map.json"]["matches_chattts"]
    assert report["real_weights"] is False


def test_real_weights_detected_by_chattts_hash_map(tiny_checkpoint: Path, monkeypatch) -> None:
    own = {rel: source_report(tiny_checkpoint)["files"][rel]["sha256"] for rel in ASSET_FILES}
    monkeypatch.setattr(ckpt, "chattts_sha256_map", lambda: own)
    assert source_report(tiny_checkpoint)["real_weights"] is True


def _partial_copy(src: Path, dst: Path, skip: str) -> Path:
    for rel in ASSET_FILES:
        if rel != skip:
            (dst / rel).parent.mkdir(parents=True, exist_ok=True)
            os.symlink(src / rel, dst / rel)
    return dst


def test_missing_file_is_named(tiny_checkpoint: Path, tmp_path: Path, capsys) -> None:
    broken = _partial_copy(tiny_checkpoint, tmp_path / "ck", "asset/Vocos.safetensors")
    with pytest.raises(CheckpointError, match=r"Vocos\.safetensors: missing"):
        read_sizes(broken)
    assert main(["export", "--checkpoint", str(broken), "--out", str(tmp_path / "b")]) == 2
    assert "asset/Vocos.safetensors: missing" in capsys.readouterr().err
    assert not (tmp_path / "b").exists()
    with pytest.raises(CheckpointError, match="not asset/ itself"):
        read_sizes(tiny_checkpoint / "asset")
