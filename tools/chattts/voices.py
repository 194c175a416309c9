"""Seeded speakers drawn the way ChatTTS's ``Speaker.sample_random`` draws them.

ChatTTS samples ``randn(768) · std + mean`` from its ``spk_stat`` (fp16) and serialises the result
as a base16384(LZMA2(fp16 bytes)) "spk_emb" string. The bundle stores each voice both ways: the
decoded f32 [768] array (voices.npz, what the device uses) and the string in the manifest (what a
ChatTTS user passes as ``InferCodeParams(spk_emb=...)``). The decode goes through ChatTTS's own
``Speaker._decode``, so the array is exactly what ChatTTS would inject.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

DEFAULT_VOICE_SEEDS: dict[str, int] = {
    "default": 2222,
    "seed_7": 7,
    "seed_42": 42,
    "seed_1234": 1234,
}


@dataclass(frozen=True)
class Voice:
    name: str
    seed: int
    spk_emb: str  # ChatTTS's string form
    vector: np.ndarray  # f32 [768], not normalised (the host L2-normalises at injection)


def speaker(hidden_size: int = 768):
    """ChatTTS's ``Speaker`` with the package's own ``spk_stat``."""
    from ChatTTS.config import Config
    from ChatTTS.model.speaker import Speaker

    return Speaker(hidden_size, Config().spk_stat)


def sample_voice(name: str, seed: int, spk=None) -> Voice:
    spk = spk or speaker()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        s = spk.sample_random()
    return Voice(name, seed, s, spk._decode(s).astype(np.float32))


def sample_voices(seeds: dict[str, int] = DEFAULT_VOICE_SEEDS) -> list[Voice]:
    spk = speaker()
    return [sample_voice(name, seed, spk) for name, seed in seeds.items()]
