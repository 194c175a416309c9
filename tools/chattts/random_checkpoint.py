"""Random-weight ChatTTS checkpoints (real weights cannot be downloaded here).

The weights are drawn so the models behave like working networks rather than near-identity ones:
residual branches of the GPT, Decoder and Vocos contribute visibly (so parity checks see every
layer), logits have unit scale, and the EOS code's head row is scaled down so greedy decoding
does not stop at the first steps. Random weights show speed and plumbing, never voice quality:
the audio is noise-like, utterance lengths mean nothing (EOS is rare, so generation usually runs
to ``max_new_token``), and quantization error on them is not the error on real weights.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch
from safetensors.torch import save_file
from tqdm import tqdm

from .checkpoint import CheckpointSizes
from .modules import ChatTTSModules, build_modules
from .tokenizer_asset import write_tokenizer

log = logging.getLogger(__name__)

EOS_HEAD_SCALE = 0.5


@torch.no_grad()
def _randomize(mods: ChatTTSModules, gen: torch.Generator) -> None:
    def normal_(t: torch.Tensor, std: float, mean: float = 0.0) -> None:
        t.copy_(torch.randn(t.shape, generator=gen) * std + mean)

    for name, p in mods.gpt.gpt.named_parameters():
        if name.endswith("norm.weight") or "layernorm" in name:
            normal_(p, 0.1, 1.0)
        else:
            normal_(p, 0.03)
    for table in [mods.embed.emb_text, *mods.embed.emb_code]:
        normal_(table.weight, 0.1)
    for head in [mods.embed.head_text, *mods.embed.head_code]:
        par = head.parametrizations.weight
        normal_(par.original1, 1.0)  # v: direction
        par.original0.fill_(1.0)  # g: row norm = logit scale (hidden is RMS-normalised)
    for head in mods.embed.head_code:
        head.parametrizations.weight.original0[mods.sizes.num_audio_tokens - 1] = EOS_HEAD_SCALE
    for net in (mods.decoder, mods.dvae, mods.vocos):
        for name, p in net.named_parameters():
            if name.endswith(".weight") and p.dim() == 1 and ".norm" not in name:
                normal_(p, 0.02, 0.1)  # ConvNeXt layer scale: 1e-6 at init would hide the blocks
            elif "norm" in name and name.endswith(".weight"):
                normal_(p, 0.1, 1.0)
            elif p.dim() >= 2:
                normal_(p, (1.0 / p[0].numel()) ** 0.5)
            else:
                normal_(p, 0.02)
    for net in (mods.decoder, mods.dvae):
        net.coef.copy_(torch.rand(net.coef.shape, generator=gen) + 0.5)
    mods.vocos.head.out.bias[: mods.vocos.head.out.bias.numel() // 2] -= 3.0  # quiet magnitudes


def _save(module: torch.nn.Module, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file({k: v.detach().contiguous() for k, v in module.state_dict().items()}, str(path))


def write_random_checkpoint(out: Path, size: str = "tiny", seed: int = 0) -> Path:
    """Write ``out/asset/`` in ChatTTS 0.2.5's layout with random weights; returns ``out``."""
    sizes = {"tiny": CheckpointSizes.tiny, "full": CheckpointSizes.full}[size]()
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    asset = out / "asset"
    steps = tqdm(total=7, desc=f"checkpoint ({size})", unit="file", leave=False)
    mods = build_modules(sizes)
    _randomize(mods, gen)
    steps.update()
    (asset / "gpt").mkdir(parents=True, exist_ok=True)
    (asset / "gpt" / "config.json").write_text(json.dumps(sizes.gpt_config(), indent=2) + "\n")
    _save(mods.gpt.gpt, asset / "gpt" / "model.safetensors")
    steps.update()
    for module, name in (
        (mods.embed, "Embed.safetensors"),
        (mods.decoder, "Decoder.safetensors"),
        (mods.dvae, "DVAE.safetensors"),
        (mods.vocos, "Vocos.safetensors"),
    ):
        _save(module, asset / name)
        steps.update()
    write_tokenizer(asset / "tokenizer")
    steps.update()
    steps.close()
    log.info("wrote %s checkpoint (seed %d) to %s", size, seed, out)
    return out
