"""ChatTTS checkpoints in the package's on-disk layout: sizes, validation, hashes, random weights.

A checkpoint is a folder holding ``asset/`` exactly as ChatTTS 0.2.5 reads it (``config.py``
``Path``). Real weights (HF ``2Noise/ChatTTS``) and generated random ones go through the same code:
sizes are read from the tensors themselves, and the files are hashed against ChatTTS's own
``res/sha256_map.json`` so the manifest can say whether the weights are the real ones.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
from dataclasses import asdict, dataclass
from importlib import resources
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

# Relative to the checkpoint root, in the order ChatTTS's check_all_assets hashes them.
ASSET_FILES: tuple[str, ...] = (
    "asset/Decoder.safetensors",
    "asset/DVAE.safetensors",
    "asset/Embed.safetensors",
    "asset/Vocos.safetensors",
    "asset/gpt/config.json",
    "asset/gpt/model.safetensors",
    "asset/tokenizer/special_tokens_map.json",
    "asset/tokenizer/tokenizer_config.json",
    "asset/tokenizer/tokenizer.json",
)


class CheckpointError(Exception):
    """The checkpoint folder cannot be used; the message names the file."""


@dataclass(frozen=True)
class ConvNetSizes:
    """``ChatTTS.model.dvae.DVAEDecoder`` arguments (used for the Decoder and both DVAE halves)."""

    idim: int
    odim: int
    hidden: int
    n_layer: int
    bn_dim: int


@dataclass(frozen=True)
class CheckpointSizes:
    """Every size needed to build ChatTTS's modules; the text side and 768-d hidden are fixed.

    The hidden size stays 768 even when tiny: ChatTTS's ``spk_stat`` (speaker sampling) is 2×768
    values and the Decoder splits each hidden into two 384-d frames.
    """

    gpt_layers: int
    gpt_heads: int
    gpt_intermediate: int
    gpt_vocab: int  # rows of the unused ``embed_tokens`` (32000 in the real file)
    decoder: ConvNetSizes
    dvae_encoder: ConvNetSizes
    dvae_decoder: ConvNetSizes
    vocos_dim: int
    vocos_intermediate: int
    vocos_layers: int
    hidden_size: int = 768
    num_vq: int = 4
    num_audio_tokens: int = 626
    num_text_tokens: int = 21178
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    max_position_embeddings: int = 4096

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.gpt_heads

    @classmethod
    def full(cls) -> CheckpointSizes:
        return cls(
            gpt_layers=20,
            gpt_heads=12,
            gpt_intermediate=3072,
            gpt_vocab=32000,
            decoder=ConvNetSizes(384, 384, 512, 12, 128),
            dvae_encoder=ConvNetSizes(512, 1024, 256, 12, 128),
            dvae_decoder=ConvNetSizes(512, 512, 256, 12, 128),
            vocos_dim=512,
            vocos_intermediate=1536,
            vocos_layers=8,
        )

    @classmethod
    def tiny(cls) -> CheckpointSizes:
        return cls(
            gpt_layers=2,
            gpt_heads=12,
            gpt_intermediate=512,
            gpt_vocab=16,
            decoder=ConvNetSizes(384, 384, 64, 2, 32),
            dvae_encoder=ConvNetSizes(64, 128, 32, 1, 16),
            dvae_decoder=ConvNetSizes(64, 64, 32, 1, 16),
            vocos_dim=64,
            vocos_intermediate=128,
            vocos_layers=2,
        )

    def gpt_config(self) -> dict[str, Any]:
        """``asset/gpt/config.json`` content, key for key like the real file."""
        return {
            "architectures": ["LlamaModel"],
            "attention_bias": False,
            "attention_dropout": 0.0,
            "bos_token_id": 1,
            "eos_token_id": 2,
            "hidden_act": "silu",
            "hidden_size": self.hidden_size,
            "initializer_range": 0.02,
            "intermediate_size": self.gpt_intermediate,
            "max_position_embeddings": self.max_position_embeddings,
            "mlp_bias": False,
            "model_type": "llama",
            "num_attention_heads": self.gpt_heads,
            "num_audio_tokens": self.num_audio_tokens,
            "num_hidden_layers": self.gpt_layers,
            "num_key_value_heads": self.gpt_heads,
            "num_text_tokens": self.num_text_tokens,
            "num_vq": self.num_vq,
            "pretraining_tp": 1,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_scaling": None,
            "rope_theta": self.rope_theta,
            "spk_KL": False,
            "spk_emb_dim": 192,
            "tie_word_embeddings": False,
            "torch_dtype": "float32",
            "transformers_version": "4.41.2",
            "use_cache": False,
            "vocab_size": self.gpt_vocab,
        }

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def chattts_sha256_map() -> dict[str, str]:
    """ChatTTS's own expected hashes, keyed by path relative to the checkpoint root."""
    raw = json.loads(resources.files("ChatTTS").joinpath("res/sha256_map.json").read_text())
    out = {}
    for rel in ASSET_FILES:
        key = "sha256_" + rel.replace("/", "_").replace(".", "_")
        out[rel] = raw[key]
    return out


def _sha256(path: Path) -> str:
    st = path.stat()
    return _sha256_cached(str(path.resolve()), st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=64)
def _sha256_cached(path: str, size: int, mtime_ns: int) -> str:
    """Checkpoints are large and exported repeatedly in one process (tests): hash once."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def check_layout(root: Path) -> None:
    """Raise CheckpointError naming the first missing file (``root`` contains ``asset/``)."""
    if not root.is_dir():
        raise CheckpointError(f"{root}: checkpoint folder does not exist")
    if root.name == "asset" and not (root / "asset").exists():
        raise CheckpointError(f"{root}: pass the folder that contains asset/, not asset/ itself")
    for rel in ASSET_FILES:
        if not (root / rel).is_file():
            raise CheckpointError(
                f"{root / rel}: missing; a ChatTTS checkpoint needs {', '.join(ASSET_FILES)}"
            )


def source_report(root: Path) -> dict[str, Any]:
    """File hashes plus ``real_weights``: every file matches ChatTTS's sha256 map."""
    check_layout(root)
    expected = chattts_sha256_map()
    files = {}
    for rel in ASSET_FILES:
        digest = _sha256(root / rel)
        files[rel] = {
            "sha256": digest,
            "bytes": (root / rel).stat().st_size,
            "matches_chattts": digest == expected[rel],
        }
    real = all(f["matches_chattts"] for f in files.values())
    return {"checkpoint": str(root.resolve()), "real_weights": real, "files": files}


def _shapes(path: Path) -> dict[str, tuple[int, ...]]:
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="numpy") as f:
            return {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}  # noqa: SIM118
    except Exception as e:  # safetensors raises its own error types
        raise CheckpointError(f"{path}: not a readable safetensors file: {e}") from e


def _need(shapes: dict[str, tuple[int, ...]], key: str, path: Path) -> tuple[int, ...]:
    if key not in shapes:
        raise CheckpointError(f"{path}: tensor {key!r} missing (not a ChatTTS checkpoint file?)")
    return shapes[key]


def _convnet(shapes: dict[str, tuple[int, ...]], prefix: str, path: Path) -> ConvNetSizes:
    bn_dim, idim, _ = _need(shapes, f"{prefix}conv_in.0.weight", path)
    hidden = _need(shapes, f"{prefix}conv_in.2.weight", path)[0]
    odim = _need(shapes, f"{prefix}conv_out.weight", path)[0]
    n_layer = sum(
        1
        for k in shapes
        if k.startswith(f"{prefix}decoder_block.") and k.endswith(".dwconv.weight")
    )
    return ConvNetSizes(idim, odim, hidden, n_layer, bn_dim)


def read_sizes(root: Path) -> CheckpointSizes:
    """Sizes from the checkpoint's own tensors and ``gpt/config.json`` (works for real weights)."""
    check_layout(root)
    asset = root / "asset"
    cfg_path = asset / "gpt" / "config.json"
    try:
        cfg = json.loads(cfg_path.read_text())
        gpt = {
            k: cfg[k]
            for k in (
                "num_hidden_layers",
                "num_attention_heads",
                "intermediate_size",
                "vocab_size",
                "hidden_size",
            )
        }
    except (ValueError, KeyError) as e:
        raise CheckpointError(f"{cfg_path}: unreadable or missing key: {e}") from e
    if cfg.get("num_key_value_heads", gpt["num_attention_heads"]) != gpt["num_attention_heads"]:
        raise CheckpointError(f"{cfg_path}: num_key_value_heads must equal num_attention_heads")
    embed_path = asset / "Embed.safetensors"
    embed = _shapes(embed_path)
    text_rows, hidden = _need(embed, "emb_text.weight", embed_path)
    audio_rows = _need(embed, "emb_code.0.weight", embed_path)[0]
    num_vq = sum(1 for k in embed if k.startswith("emb_code."))
    dec_path, dvae_path, voc_path = (
        asset / n for n in ("Decoder.safetensors", "DVAE.safetensors", "Vocos.safetensors")
    )
    dec, dvae, voc = _shapes(dec_path), _shapes(dvae_path), _shapes(voc_path)
    vocos_dim = _need(voc, "backbone.embed.weight", voc_path)[0]
    vocos_inter = _need(voc, "backbone.convnext.0.pwconv1.weight", voc_path)[0]
    vocos_layers = sum(
        1 for k in voc if k.startswith("backbone.convnext.") and k.endswith(".dwconv.weight")
    )
    if hidden != gpt["hidden_size"]:
        raise CheckpointError(f"{embed_path}: hidden {hidden} != gpt config {gpt['hidden_size']}")
    return CheckpointSizes(
        gpt_layers=gpt["num_hidden_layers"],
        gpt_heads=gpt["num_attention_heads"],
        gpt_intermediate=gpt["intermediate_size"],
        gpt_vocab=gpt["vocab_size"],
        decoder=_convnet(dec, "decoder.", dec_path),
        dvae_encoder=_convnet(dvae, "encoder.", dvae_path),
        dvae_decoder=_convnet(dvae, "decoder.", dvae_path),
        vocos_dim=vocos_dim,
        vocos_intermediate=vocos_inter,
        vocos_layers=vocos_layers,
        hidden_size=hidden,
        num_vq=num_vq,
        num_audio_tokens=audio_rows,
        num_text_tokens=text_rows,
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        rope_theta=float(cfg.get("rope_theta", 10000.0)),
        max_position_embeddings=int(cfg.get("max_position_embeddings", 4096)),
    )
