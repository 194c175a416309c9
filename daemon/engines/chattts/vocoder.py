"""Hidden states → waveform: ``decoder.onnx`` → ``vocos.onnx`` → numpy ISTFT, one-shot or streamed.

The ISTFT is ``torch.istft(n_fft=1024, hop=256, win=1024, hann periodic, center=True)``: inverse
real FFT of each frame × window, overlap-add, divide by the overlap-added squared window, trim
n_fft/2 per end. T hidden states → 2T mel frames → (2T − 1)·256 samples.

Streaming cuts the hidden sequence into chunks and decodes each with ``left``/``right`` steps of
context around it (the Decoder and Vocos are non-causal convolution stacks). With context at least
the receptive field (reach.py reads it from the graphs; full-size ChatTTS: Decoder ±75 mel frames,
Vocos ±27, ISTFT ±2 → 52 steps each side) the chunks equal the one-shot waveform up to float
rounding; smaller context trades exactness for latency and compute (each chunk re-decodes its
context). Keeping each convolution's state instead would not remove that work: a non-causal layer's
last outputs depend on frames not yet decoded, so either they are recomputed at the next chunk or
the audio waits for the whole receptive field (docs/chattts-engine.md, "Streaming schedule").

Chunks grow geometrically after the first: a small first chunk gives early audio, and each later
chunk is decoded while the audio already emitted plays, so it can be larger than the one before
without a gap. Larger chunks re-decode proportionally less context and pay the Decoder/Vocos
per-call cost less often. Chunk boundaries depend on the step count only (never on timing), so
the audio of a request is the same on every run.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import onnxruntime as ort

log = logging.getLogger(__name__)

SAMPLE_RATE = 24000
N_FFT = 1024
HOP = 256
SAMPLES_PER_STEP = 2 * HOP  # one GPT step = 2 mel frames


def hann_periodic(n: int) -> np.ndarray:
    return (0.5 - 0.5 * np.cos(2 * np.pi * np.arange(n) / n)).astype(np.float32)


_WINDOW = hann_periodic(N_FFT)
_WINDOW_SQ = _WINDOW.astype(np.float64) ** 2


def overlap_add(real: np.ndarray, imag: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Spectra (513, F) → (windowed overlap-add signal, overlap-added window²), uncentred:
    index 0 is the start of frame 0, length (F − 1)·hop + n_fft."""
    frames = np.fft.irfft(real + 1j * imag, n=N_FFT, axis=0) * _WINDOW[:, None]
    f = frames.shape[1]
    n = (f - 1) * HOP + N_FFT
    y = np.zeros(n, np.float64)
    env = np.zeros(n, np.float64)
    for k in range(N_FFT // HOP):  # 4 strided adds instead of F slice-adds
        idx = slice(k * HOP, k * HOP + f * HOP)
        seg = frames[k * HOP : (k + 1) * HOP].T.reshape(-1)
        y[idx][: seg.size] += seg
        env[idx][: seg.size] += np.tile(_WINDOW_SQ[k * HOP : (k + 1) * HOP], f)
    return y, env


def istft(real: np.ndarray, imag: np.ndarray) -> np.ndarray:
    """``torch.istft(..., center=True)`` of spectra (513, F) → (F − 1)·hop samples."""
    y, env = overlap_add(real, imag)
    out = y[N_FFT // 2 : len(y) - N_FFT // 2] / env[N_FFT // 2 : len(y) - N_FFT // 2]
    return out.astype(np.float32)


class Vocoder:
    """The Decoder and Vocos sessions. ``batched``: windows of equal length share one run of each
    (stacked on the batch axis); set it only for graphs whose rows do not see each other
    (``batch_invariant``), so a window's spectra are the same alone or stacked. onnxruntime's
    float convolutions can still round a stacked run differently at some lengths (full-size
    graphs, 50-step windows: 2e-8 in fp32), so the first stacked run of each length is checked
    against its first window alone; a length that differs is rendered one by one from then on."""

    def __init__(
        self, decoder: ort.InferenceSession, vocos: ort.InferenceSession, batched: bool = False
    ) -> None:
        self.decoder = decoder
        self.vocos = vocos
        self.batched = batched
        self.stackable: dict[int, bool] = {}  # window length → stacked runs checked exact

    def spectra(self, hiddens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(T, hidden) → spec_real, spec_imag (513, 2T)."""
        return self.spectra_many([hiddens])[0]

    def _run(self, windows: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        x = np.stack(windows).transpose(0, 2, 1)
        (mel,) = self.decoder.run(["mel"], {"hidden": np.ascontiguousarray(x, np.float32)})
        real, imag = self.vocos.run(["spec_real", "spec_imag"], {"mel": mel})
        return real, imag

    def spectra_many(self, windows: list[np.ndarray]) -> list[tuple[np.ndarray, np.ndarray]]:
        """The spectra of each (T_i, hidden) window, in order: one Decoder and one Vocos run per
        group of equal-length windows when ``batched`` (and the length stacks exactly), else one
        per window. Padding windows to a common length would change their samples (the
        convolutions see the padding), so windows of different lengths never share a run."""
        groups: dict[int, list[int]] = {}
        for i, window in enumerate(windows):
            stack = self.batched and self.stackable.get(len(window), True)
            groups.setdefault(len(window) if stack else -1 - i, []).append(i)
        out: list[tuple[np.ndarray, np.ndarray]] = [None] * len(windows)  # type: ignore[list-item]
        for length, members in groups.items():
            real, imag = self._run([windows[i] for i in members])
            if len(members) > 1 and length not in self.stackable:
                lone = self._run([windows[members[0]]])
                self.stackable[length] = np.array_equal(lone[0][0], real[0]) and np.array_equal(
                    lone[1][0], imag[0]
                )
                if not self.stackable[length]:
                    log.info("vocoder: %d-step windows round differently stacked: one by one",
                             length)  # fmt: skip
                    for i in members:
                        out[i] = tuple(a[0] for a in self._run([windows[i]]))  # type: ignore[assignment]
                    continue
            for j, i in enumerate(members):
                out[i] = real[j], imag[j]
        return out

    def batch_invariant(self, dim: int, steps: int = 12) -> bool:
        """Are a window's spectra bit-identical stacked with others and alone? Float conv nets
        are (per-row convolutions and GEMM rows); dynamic int8 MatMuls are not (one activation
        scale over every stacked row)."""
        rng = np.random.default_rng(0)
        windows = [rng.normal(0, 1, (steps, dim)).astype(np.float32) for _ in range(3)]
        windows[1] *= 8.0  # a companion with a wider range would move a shared scale
        alone, stacked = self._run(windows[:1]), self._run(windows)
        return all(np.array_equal(a[0], b[0]) for a, b in zip(alone, stacked, strict=True))

    def waveform(self, hiddens: np.ndarray) -> np.ndarray:
        """One-shot: the whole utterance at once, float32 in [-1, 1]-ish."""
        if len(hiddens) == 0:
            return np.zeros(0, np.float32)
        return istft(*self.spectra(hiddens))


@dataclass(frozen=True)
class Render:
    """A chunk due: the hidden window its Decoder/Vocos pass covers and the slice ``[a, b)`` of
    the window's overlap-add that is the chunk's own audio (``StreamingVocoder.emit``)."""

    hiddens: np.ndarray
    a: int
    b: int


@dataclass(frozen=True)
class StreamSchedule:
    """Chunk sizes and context, in GPT steps (1 step = 512 samples = 21.3 ms).

    Chunk 0 has ``first_chunk`` steps and is rendered once ``first_right`` steps past it exist;
    chunk k ≥ 1 has ``min(max_chunk, round(chunk · growth^(k−1)))`` steps and ``right`` steps of
    look-ahead. Every chunk re-decodes ``left`` steps before it."""

    name: str = "low-latency"
    first_chunk: int = 6  # first audio after first_chunk + first_right steps
    chunk: int = 8
    left: int = 12
    right: int = 12
    first_right: int = 6
    growth: float = 1.25  # 6, 8, 10, 12, 16, … 128: chunk k is decoded while chunk k−1 plays
    max_chunk: int = 128

    def __post_init__(self) -> None:
        if (
            self.first_chunk < 1
            or self.chunk < 1
            or self.left < 1
            or min(self.right, self.first_right) < 0
            or self.growth < 1.0
            or self.max_chunk < self.chunk
        ):
            raise ValueError(f"bad stream schedule {self}")

    @property
    def key(self) -> str:
        """Every field that shapes the audio (the cache key's part; a name alone could hide a
        change of parameters)."""
        return (
            f"{self.name}:{self.first_chunk}+{self.first_right},{self.chunk}x{self.growth:g}"
            f"<={self.max_chunk},{self.left}/{self.right}"
        )

    def size(self, k: int) -> int:
        """Steps in chunk ``k`` (0-based)."""
        if k == 0:
            return self.first_chunk
        return min(self.max_chunk, round(self.chunk * self.growth ** (k - 1)))

    def look_ahead(self, k: int) -> int:
        return self.first_right if k == 0 else self.right

    @classmethod
    def exact(cls, context: int = 52) -> StreamSchedule:
        """Context = the receptive field in steps (``reach.bundle_reach(...).steps``; 52 for
        full-size ChatTTS): streamed ≡ one-shot up to float rounding, for float graphs."""
        return cls(
            "exact",
            first_chunk=8,
            chunk=48,
            left=context,
            right=context,
            first_right=context,
            growth=1.0,
            max_chunk=48,
        )


class StreamingVocoder:
    """Feed hidden states one by one; get float audio chunks as soon as the schedule allows.

    ``push``/``finish`` render at once. ``add``/``final`` only plan the render and return it, so a
    caller with many streams can render their chunks together (``Vocoder.spectra_many``) and
    cut each one's audio with ``emit``; the audio is the same either way."""

    def __init__(self, vocoder: Vocoder, schedule: StreamSchedule, max_steps: int, dim: int):
        self.vocoder = vocoder
        self.schedule = schedule
        self.hiddens = np.zeros((max_steps, dim), np.float32)
        self.n = 0  # hidden states received
        self.done = 0  # steps whose audio was emitted
        self.chunks = 0  # chunks emitted

    def push(self, hidden: np.ndarray) -> np.ndarray | None:
        return self._now(self.add(hidden))

    def finish(self) -> np.ndarray | None:
        """The rest of the utterance (call once, after the last ``push``)."""
        return self._now(self.final())

    def add(self, hidden: np.ndarray) -> Render | None:
        """Store a hidden state; the chunk it completes, if any, to render."""
        self.hiddens[self.n] = hidden
        self.n += 1
        if self.steps_to_next_chunk() == 0:
            return self._plan(
                self.done + self.schedule.size(self.chunks),
                self.schedule.look_ahead(self.chunks),
                final=False,
            )
        return None

    def final(self) -> Render | None:
        """The render of the rest of the utterance (call once, after the last ``add``)."""
        if self.n == 0 or self.done >= self.n:
            return None
        return self._plan(self.n, 0, final=True)

    def steps_to_next_chunk(self) -> int:
        """Hidden states still to push before the next chunk renders (0: this push renders)."""
        size, right = self.schedule.size(self.chunks), self.schedule.look_ahead(self.chunks)
        # at least one step past the chunk, so the utterance's end is always rendered by finish()
        return max(0, self.done + size + max(right, 1) - self.n)

    @staticmethod
    def emit(render: Render, spectra: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
        """The chunk's float audio from its window's spectra."""
        y, env = overlap_add(*spectra)
        return (y[render.a : render.b] / env[render.a : render.b]).astype(np.float32)

    def _now(self, render: Render | None) -> np.ndarray | None:
        if render is None:
            return None
        return self.emit(render, self.vocoder.spectra(render.hiddens))

    def _plan(self, end: int, right: int, final: bool) -> Render:
        s0, s1 = self.done, end
        w0 = max(0, s0 - self.schedule.left)
        w1 = self.n if final else min(self.n, s1 + right)
        # global output sample t ↔ uncentred sample t + n_fft/2 ↔ local index below
        origin = w0 * SAMPLES_PER_STEP - N_FFT // 2
        a = s0 * SAMPLES_PER_STEP - origin
        b = (s1 * SAMPLES_PER_STEP - (HOP if final else 0)) - origin
        self.done = s1
        self.chunks += 1
        return Render(self.hiddens[w0:w1], a, b)
