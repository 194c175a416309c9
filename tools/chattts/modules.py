"""ChatTTS's own torch modules, built at a checkpoint's sizes and loaded with ``strict=True``.

Everything here uses the classes of the installed ``chattts`` / ``vocos`` packages (never copies),
so the parity checks compare the ONNX graphs against exactly what ``Chat.load`` would run.
``Chat.load`` itself is not used: it always builds the full-size config and requires the real
weights' sha256, so it cannot load generated (or tiny) checkpoints.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file

from .checkpoint import CheckpointError, CheckpointSizes, read_sizes

log = logging.getLogger(__name__)


@dataclass
class ChatTTSModules:
    """The modules ``Chat._load`` builds (minus the tokenizer), in eval mode on the CPU."""

    sizes: CheckpointSizes
    embed: torch.nn.Module  # ChatTTS.model.Embed
    gpt: torch.nn.Module  # ChatTTS.model.GPT (its .gpt is the LlamaModel, embed_tokens deleted)
    decoder: torch.nn.Module  # ChatTTS.model.DVAE without encoder/VQ (Decoder.safetensors)
    dvae: torch.nn.Module  # ChatTTS.model.DVAE with encoder + VQ (DVAE.safetensors)
    vocos: torch.nn.Module  # vocos.Vocos


def build_modules(sizes: CheckpointSizes) -> ChatTTSModules:
    """Freshly initialised modules at ``sizes`` (the layout the checkpoint files must match)."""
    from ChatTTS.model import DVAE, GPT, Embed
    from transformers import LlamaConfig, LlamaModel
    from vocos import Vocos
    from vocos.feature_extractors import MelSpectrogramFeatures
    from vocos.heads import ISTFTHead
    from vocos.models import VocosBackbone

    embed = Embed(sizes.hidden_size, sizes.num_audio_tokens, sizes.num_text_tokens, sizes.num_vq)
    gpt = GPT(gpt_config=sizes.gpt_config(), embed=embed)
    gpt.gpt = LlamaModel(LlamaConfig(**sizes.gpt_config()))
    vq = {"dim": 2 * sizes.dvae_decoder.idim, "levels": (5, 5, 5, 5), "G": 2, "R": 2}
    dvae = DVAE(
        decoder_config=asdict(sizes.dvae_decoder),
        encoder_config=asdict(sizes.dvae_encoder),
        vq_config=vq,
        dim=sizes.dvae_decoder.idim,
    )
    decoder = DVAE(decoder_config=asdict(sizes.decoder), dim=sizes.decoder.idim)
    vocos = Vocos(
        feature_extractor=MelSpectrogramFeatures(
            sample_rate=24000, n_fft=1024, hop_length=256, n_mels=100, padding="center"
        ),
        backbone=VocosBackbone(
            input_channels=100,
            dim=sizes.vocos_dim,
            intermediate_dim=sizes.vocos_intermediate,
            num_layers=sizes.vocos_layers,
        ),
        head=ISTFTHead(dim=sizes.vocos_dim, n_fft=1024, hop_length=256, padding="center"),
    )
    mods = ChatTTSModules(sizes, embed, gpt, decoder, dvae, vocos)
    for m in (embed, gpt, decoder, dvae, vocos):
        m.eval()
    return mods


def _load_strict(module: torch.nn.Module, path: Path) -> None:
    try:
        module.load_state_dict(load_file(str(path)), strict=True)
    except RuntimeError as e:
        raise CheckpointError(f"{path}: does not load into {type(module).__name__}: {e}") from e


def load_modules(root: Path) -> ChatTTSModules:
    """Build the modules at the checkpoint's sizes and load every weight file strictly."""
    sizes = read_sizes(root)
    asset = root / "asset"
    mods = build_modules(sizes)
    _load_strict(mods.embed, asset / "Embed.safetensors")
    _load_strict(mods.gpt.gpt, asset / "gpt" / "model.safetensors")
    del mods.gpt.gpt.embed_tokens  # as GPT.load_pretrained does: inputs are always embeddings
    _load_strict(mods.decoder, asset / "Decoder.safetensors")
    _load_strict(mods.dvae, asset / "DVAE.safetensors")
    _load_strict(mods.vocos, asset / "Vocos.safetensors")
    return mods
