"""ChatTTS code-pass prompts: text → token ids → input embeddings, on the host in numpy.

Uses the checkpoint's ``tokenizer.json`` with the ``tokenizers`` package. That file enables
padding Fixed(256) and truncation 256 (docs/chattts.md, "Tokenizer and prompt"), so both are
switched off here, and special tokens are not added (ChatTTS encodes with
``add_special_tokens=False``).

The prompt is ChatTTS's ``decorate_code_prompts`` exactly: ``[Stts][spk_emb]{txt_smp}{prompt}
{text}[Ptts]`` with ``prompt = "[speed_N]"`` (``[empty_spk]`` when no speaker is given). The
embedding at ``[spk_emb]`` is *replaced* by the L2-normalised speaker vector (``speaker.apply``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

_CONTROL_TAGS = ("[Stts]", "[spk_emb]", "[empty_spk]")


class PromptBuilder:
    def __init__(self, tokenizer_json: Path, emb_text: np.ndarray, spk_emb_id: int) -> None:
        self.tokenizer = Tokenizer.from_file(str(tokenizer_json))
        self.tokenizer.no_padding()
        self.tokenizer.no_truncation()
        self.emb_text = emb_text  # (vocab, hidden), f16 memmap on the device
        self.spk_emb_id = spk_emb_id
        if self.tokenizer.token_to_id("[spk_emb]") != spk_emb_id:
            raise ValueError(
                f"{tokenizer_json}: [spk_emb] has id {self.tokenizer.token_to_id('[spk_emb]')}, "
                f"the manifest says {spk_emb_id}"
            )

    @staticmethod
    def prompt_text(text: str, speed: int, has_speaker: bool = True, txt_smp: str = "") -> str:
        """ChatTTS ``Speaker.decorate_code_prompts`` for one text."""
        for tag in _CONTROL_TAGS:  # as in ChatTTS: user text must not inject these
            text = text.replace(tag, "")
        text = f"[speed_{speed}]{text.strip()}"
        spk = "[spk_emb]" if has_speaker else "[empty_spk]"
        return f"[Stts]{spk}{txt_smp}{text}[Ptts]"

    def encode(self, prompt: str) -> np.ndarray:
        return np.asarray(self.tokenizer.encode(prompt, add_special_tokens=False).ids, np.int64)

    def embed(self, ids: np.ndarray, speaker: np.ndarray | None) -> np.ndarray:
        """ids (S,) → inputs_embeds (1, S, hidden) f32, speaker replacing ``[spk_emb]``."""
        emb = self.emb_text[ids].astype(np.float32)[None]
        if speaker is not None:
            emb[0, ids == self.spk_emb_id] = l2_normalize(speaker)
        return emb


def l2_normalize(v: np.ndarray, eps: float = 1e-12) -> np.ndarray:
    """``torch.nn.functional.normalize(v, p=2, dim=0, eps=1e-12)``."""
    v = np.asarray(v, np.float32)
    return v / max(float(np.linalg.norm(v)), eps)
