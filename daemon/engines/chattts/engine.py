"""ChatTTS on onnxruntime + numpy: the ``chattts`` engine (docs/chattts-engine.md, docs/chattts.md).

text → ``text.normalize`` → sentences → prompt ``[Stts][spk_emb][speed_N]{text}[Ptts]`` → GPT prompt
pass → decode loop (in-place KV, numpy sampling in ChatTTS's order) → hidden states → streamed
Decoder + Vocos + ISTFT → int16 PCM at 24 kHz. Each sentence is its own utterance (KV restarts at
position 0), so memory stays bounded whatever the text length; ``cancel`` is checked every step.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from speakd.audio import AudioChunk, Word
from speakd.engines.base import (
    EngineError,
    SynthesisConfig,
    TextTooLongError,
    UnknownSpeakerError,
    UnknownVoiceError,
    VoiceInfo,
)
from speakd.engines.bundle import INT8_SUFFIX, Bundle, BundleError, load_bundle
from speakd.engines.chattts import text as textfe
from speakd.engines.chattts.batch import BatchDecoder, sentence_sampler
from speakd.engines.chattts.batch_scheduler import BatchScheduler, Sentence
from speakd.engines.chattts.gpt_runner import DecodeStats, GptRunner, ModelSpec
from speakd.engines.chattts.prebuffer import StartGate
from speakd.engines.chattts.sampling import CodeSampler, SamplingParams
from speakd.engines.chattts.tokenizer import PromptBuilder
from speakd.engines.chattts.vocoder import (
    SAMPLE_RATE,
    Render,
    StreamingVocoder,
    StreamSchedule,
    Vocoder,
)
from speakd.engines.options import Option
from speakd.engines.ortsession import make_session
from speakd.engines.spans import span

if TYPE_CHECKING:
    from speakd.machine.npu import NpuPlan

log = logging.getLogger(__name__)

CHATTTS_LICENCE = "CC BY-NC 4.0 (ChatTTS's published weights: non-commercial use only)"

MAX_CHARS = 2000  # per request, before normalisation
LANGS = ("zh", "en")
SAMPLING_OPTIONS = (
    Option("temperature", float, "sampling temperature of the audio codes", 0.0, 2.0),
    Option("top_p", float, "nucleus sampling: keep the likeliest codes up to this mass", 0.0, 1.0),
    Option("top_k", int, "keep only the k most likely codes", 1, 626),
    Option("repetition_penalty", float, "penalise codes repeated in the recent window", 1.0, 2.0),
    Option("max_new_token", int, "at most this many codes per sentence", 1, 4096),
    Option("min_new_token", int, "at least this many codes per sentence", 0, 4096),
)
OPTIONS = (
    *SAMPLING_OPTIONS,
    Option("greedy", bool, "take the most likely code at every step (no sampling)", default=False),
    Option("speed_level", int, "ChatTTS's [speed_N] token directly (overrides speed)", 0, 9),
)


@dataclasses.dataclass(frozen=True)
class Utterance:
    """One sentence's decode result (for tests and tools): codes (T, 4), hiddens (T, hidden)."""

    text: str
    codes: np.ndarray
    hiddens: np.ndarray
    stats: DecodeStats


class ChatTTSVoice:
    """A ChatTTS bundle as its manifest describes it: one voice whose speakers are the bundle's
    speaker embeddings, its text front-end and parameters, but no session. The voice library keys
    requests with it before (or without) loading the model; ``ChatTTSEngine`` adds the model."""

    kind = "chattts"
    sample_rate = SAMPLE_RATE
    options = OPTIONS
    npu: NpuPlan | None = None  # engine.accelerator's plan (speakd.engines.accelerate)

    def __init__(
        self,
        bundle: Bundle,
        schedule: StreamSchedule | None = None,
        max_chars: int = MAX_CHARS,
    ) -> None:
        if bundle.engine != "chattts":
            raise BundleError(f"{bundle.path}: engine {bundle.engine!r}, expected 'chattts'")
        m = bundle.manifest
        try:
            self.spec = ModelSpec.from_manifest(m["model"])
            self._defaults = dict(m.get("defaults") or {})
            self._speaker_entries: dict[str, Any] = dict(m["voices"])
        except (KeyError, TypeError, ValueError) as e:
            raise BundleError(f"{bundle.path / 'manifest.json'}: {e.args[0]}") from None
        if "default" not in self._speaker_entries:
            raise BundleError(f"{bundle.path / 'manifest.json'}: no 'default' voice")
        self.bundle = bundle
        self.bundle_id = bundle.bundle_id
        self.precision = bundle.precision
        self.loudness_record = m.get("loudness")
        # one name for a bundle and its calibrated sibling (models/chattts, models/chattts-int8)
        self.name = str(m.get("name", bundle.path.name)).removesuffix(INT8_SUFFIX)
        # a bundle exported from other weights says so in its manifest
        self.licence = str(m.get("license") or CHATTTS_LICENCE)
        self.schedule = schedule or StreamSchedule()
        self.max_chars = max_chars

    @property
    def bundle_dir(self) -> Path:
        return self.bundle.path

    @classmethod
    def from_bundle(cls, bundle_path: Path) -> ChatTTSVoice:
        """The bundle's manifest only; the files' hashes are verified when it loads."""
        return cls(load_bundle(bundle_path, verify=False))

    def load_model(self, threads: int = 2, **kwargs: Any) -> ChatTTSEngine:
        """The model itself (hashes verified, sessions made): the costly part."""
        return ChatTTSEngine.load(self.bundle.path, threads=threads, **kwargs)

    # --- the voice's meaning -----------------------------------------------------------------

    def voices(self) -> list[VoiceInfo]:
        speakers = ("default", *sorted(set(self._speaker_entries) - {"default"}))
        return [VoiceInfo(self.name, ",".join(LANGS), "ChatTTS", speakers)]

    def default_voice(self) -> str:
        return self.name

    def normalize_text(self, text: str, lang: str | None = None) -> str:
        if len(text) > self.max_chars:
            raise TextTooLongError(
                f"text is {len(text)} characters; this engine takes at most {self.max_chars} "
                "per request (send it as several requests)"
            )
        return textfe.normalize(text, _lang(lang))

    def audio_params(self, config: SynthesisConfig) -> dict[str, Any]:
        if config.voice not in (None, "", "default", self.name):
            raise UnknownVoiceError(f"unknown voice {config.voice!r}; this bundle is {self.name!r}")
        speaker = config.speaker or "default"
        if speaker not in self._speaker_entries:
            raise UnknownSpeakerError(
                f"voice {self.name!r} has no speaker {speaker!r}; its speakers: "
                + ", ".join(self.voices()[0].speakers)
            )
        known = {o.name for o in OPTIONS}
        unknown = sorted(set(config.extra) - known)
        if unknown:
            raise EngineError(
                f"unknown ChatTTS option(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}"
            )
        p = self._sampling(config)
        params: dict[str, Any] = {
            "voice": speaker,
            "speed_level": self._speed_level(config),
            **dataclasses.asdict(p),
            "stream": self.schedule.key,
        }
        if config.lang is not None:  # it decides how numbers and symbols are read
            params["lang"] = _lang(config.lang)
        if config.seed is not None:
            params["seed"] = config.seed
        return params

    def _sampling(self, config: SynthesisConfig) -> SamplingParams:
        d, x = self._defaults, config.extra
        values: dict[str, Any] = {}
        for option in SAMPLING_OPTIONS:
            key = option.name
            value = x.get(key, d.get(key))
            if value is not None:
                try:
                    values[key] = option.type(value)
                except (TypeError, ValueError):
                    raise EngineError(f"ChatTTS option {key}: {value!r} is not a number") from None
        if "repetition_window" in d:
            values["repetition_window"] = int(d["repetition_window"])
        values["greedy"] = bool(x.get("greedy", False))
        try:
            return SamplingParams(**values)
        except ValueError as e:
            raise EngineError(f"ChatTTS options: {e}") from None

    def _speed_level(self, config: SynthesisConfig) -> int:
        """``[speed_N]``, N in 0..9: ``extra['speed_level']`` or bundle default × speed factor."""
        if "speed_level" in config.extra:
            level = config.extra["speed_level"]
            if not isinstance(level, int) or isinstance(level, bool) or not 0 <= level <= 9:
                raise EngineError(f"speed_level {level!r}: an integer 0..9 ([speed_N])")
        else:
            level = int(float(self._defaults.get("speed", 5)) * (config.speed or 1.0) + 0.5)
        return min(max(level, 0), 9)

    def _default_seed(self, text: str, config: SynthesisConfig) -> int:
        """The daemon passes a seed; direct callers get the one the daemon would derive."""
        from speakd.engines.keys import audio_key, seed_from_key

        return seed_from_key(audio_key(self, text, config))


class ChatTTSEngine(ChatTTSVoice):
    """The loaded model: ChatTTS's GPT, Decoder and Vocos sessions and the speaker embeddings."""

    def __init__(
        self,
        bundle: Bundle,
        threads: int = 2,
        schedule: StreamSchedule | None = None,
        max_chars: int = MAX_CHARS,
        split: textfe.SplitPolicy | None = None,
        batch_size: int = 1,
        prefill_chunk: int = 0,
        batch_exact: bool = True,
        paced: bool = True,
    ) -> None:
        super().__init__(bundle, schedule, max_chars)
        self.split = split or textfe.SplitPolicy()
        self._voices = self._load_voices(self._speaker_entries)
        emb_text = np.load(bundle.file("emb_text.npy"), mmap_mode="r")
        emb_code = np.load(bundle.file("emb_code.npy"))
        self.prompts = PromptBuilder(
            bundle.file("tokenizer.json"), emb_text, self.spec.token_ids["spk_emb"]
        )
        self.gpt = GptRunner(make_session(bundle.file("gpt.onnx"), threads), self.spec, emb_code)
        self.vocoder = Vocoder(
            make_session(bundle.file("decoder.onnx"), threads),
            make_session(bundle.file("vocos.onnx"), threads),
        )
        self._lock = threading.Lock()  # one KV cache: one utterance at a time
        self.paced = paced  # a live listener: hold the first audio until it can play through
        self.clock = time.perf_counter  # every timing of the one-row path (tests simulate it)
        self._render_s = self._rendered_steps = 0.0  # one-row path: Decoder/Vocos cost
        # batch_size > 1: sentences and requests share decode steps (batch.py). When
        # the graph is batch-invariant a sentence's audio does not depend on what shares its
        # steps: identical to batch_size = 1 for float graphs; for 4-bit graphs (steps of ≥ 2
        # rows) identical across batches, and within float rounding of batch_size = 1's M = 1
        # kernel. A graph that is not (activations quantized per batch) decodes one sentence at
        # a time unless batch_exact=False, so the same seed keeps the same audio.
        self.batch_size, self.batch, self.batch_invariant = batch_size, None, True
        if batch_size > 1:
            decoder = BatchDecoder(self.gpt.session, self.spec, emb_code, batch_size, prefill_chunk)
            self.batch_invariant = decoder.batch_invariant()
            decoder.prompts_batched = self.batch_invariant and decoder.prompts_batch_exact()
            if self.batch_invariant or not batch_exact:
                # rows' chunks that come due together share Decoder/Vocos runs when a window's
                # spectra do not depend on what is stacked with it (float conv nets)
                self.vocoder.batched = (
                    self.vocoder.batch_invariant(self.spec.hidden_size) or not batch_exact
                )
                self.batch = BatchScheduler(decoder, self.vocoder, self.schedule, paced)
                if decoder.min_rows > 1:
                    log.info(
                        "%s: decode steps run over ≥ %d rows (M-dependent kernels)",
                        bundle.path,
                        decoder.min_rows,
                    )
            else:
                self.batch_size = 1
                log.warning(
                    "%s: gpt.onnx is not batch-invariant (a row's output depends on the rows "
                    "decoded with it, e.g. activations quantized per batch); batch_size %d "
                    "would change the audio of a seed, so this engine decodes one sentence at "
                    "a time",
                    bundle.path,
                    batch_size,
                )
        self.concurrent_synthesis = self.batch is not None  # the resolver drops its engine lock

    def use_npu(self, sessions: dict[str, Any], voice: ChatTTSVoice) -> None:
        """The Decoder and Vocos on the NPU (``speakd.engines.rknn_session``: each row runs alone,
        so batched chunks stay batch-invariant); the GPT stays on the CPU. The engine takes the
        voice's NPU bundle id and precision."""
        self.vocoder.decoder, self.vocoder.vocos = sessions["decoder"], sessions["vocos"]
        self.bundle_id, self.precision = voice.bundle_id, voice.precision

    @classmethod
    def load(cls, bundle_path: Path, threads: int = 2, **kwargs: Any) -> ChatTTSEngine:
        """Verify the bundle's hashes (refusing it, file named, on any mismatch) and load it."""
        return cls(load_bundle(bundle_path, verify=True), threads=threads, **kwargs)

    def _load_voices(self, voices: dict[str, Any]) -> dict[str, np.ndarray]:
        out: dict[str, np.ndarray] = {}
        arrays: dict[str, Any] = {}
        for name, entry in voices.items():
            f = entry.get("file", "voices.npz")
            if f not in arrays:
                arrays[f] = np.load(self.bundle.file(f))
            key = entry.get("key", name)
            if key not in arrays[f]:
                raise BundleError(f"{self.bundle.path / f}: no array {key!r} for voice {name!r}")
            vec = np.asarray(arrays[f][key], np.float32).reshape(-1)
            if vec.shape != (self.spec.hidden_size,):
                raise BundleError(f"{self.bundle.path / f}: voice {name!r} has shape {vec.shape}")
            out[name] = vec
        return out

    # --- Engine protocol ---------------------------------------------------------------------

    def synthesize(
        self, text: str, config: SynthesisConfig, cancel: threading.Event | None = None
    ) -> Iterator[AudioChunk]:
        params = self.audio_params(config)  # validates voice/options before any work
        normalized = self.normalize_text(text, config.lang)
        seed = config.seed if config.seed is not None else self._default_seed(text, config)
        sampling = self._sampling(config)
        sentences = textfe.split_sentences(normalized, self.split)
        log.info(
            "chattts: %d sentence(s), voice %s, seed %d: %.60r",
            len(sentences),
            params["voice"],
            seed,
            normalized,
        )
        t0 = time.perf_counter()
        first_audio, samples = None, 0
        said = 0  # samples of the sentences before this one
        current = 0  # the sentence being yielded
        for index, audio in self._audio(sentences, params, sampling, seed, cancel):
            if first_audio is None:
                first_audio = time.perf_counter() - t0
                log.debug("chattts: first audio after %.0f ms", first_audio * 1e3)
            if index != current:
                if samples > said:
                    yield _sentence_end(sentences[current], samples - said)
                current, said = index, samples
            samples += len(audio)
            yield AudioChunk.from_float(audio, SAMPLE_RATE)
        if samples > said and not (cancel is not None and cancel.is_set()):
            yield _sentence_end(sentences[current], samples - said)
        elapsed = time.perf_counter() - t0
        cancelled = ", cancelled" if cancel is not None and cancel.is_set() else ""
        log.info(
            "chattts: %.2f s audio in %.2f s (RTF %.2f), first audio %.0f ms%s",
            samples / SAMPLE_RATE,
            elapsed,
            elapsed / max(samples / SAMPLE_RATE, 1e-9),
            (first_audio or 0) * 1e3,
            cancelled,
        )

    def _audio(
        self,
        sentences: list[str],
        params: dict[str, Any],
        sampling: SamplingParams,
        seed: int,
        cancel: threading.Event | None,
    ) -> Iterator[tuple[int, np.ndarray]]:
        """(sentence index, float audio) of the sentences in order; sentence i samples from its
        own seeded stream (``sentence_sampler``), so batching cannot change it."""
        eos = self.spec.eos_token
        if self.batch is not None:
            jobs = [
                Sentence(self.prompt_embeds(s, params), sentence_sampler(sampling, eos, seed, i))
                for i, s in enumerate(sentences)
            ]
            yield from self.batch.stream(jobs, cancel)
            return
        with self._lock:
            gate = StartGate(self.clock) if self.paced else None
            for i, sentence in enumerate(sentences):
                if cancel is not None and cancel.is_set():
                    break
                stats = DecodeStats()
                sampler = sentence_sampler(sampling, eos, seed, i)
                for audio in self._stream_sentence(
                    sentence, params, sampler, cancel, stats, gate if i == 0 else None
                ):
                    yield i, audio
                log.debug(
                    "chattts: sentence %.30r: prompt %d tokens %.0f ms, %d steps %.1f ms/step (%s)",
                    sentence,
                    stats.prompt_tokens,
                    stats.prompt_ms,
                    stats.steps,
                    stats.ms_per_step,
                    stats.stop,
                )

    # --- pieces (also used by tests and tools) -------------------------------------------------

    def prompt_embeds(self, sentence: str, params: dict[str, Any]) -> np.ndarray:
        prompt = self.prompts.prompt_text(sentence, params["speed_level"])
        ids = self.prompts.encode(prompt)
        return self.prompts.embed(ids, self._voices[params["voice"]])

    def decode(
        self,
        sentence: str,
        config: SynthesisConfig,
        seed: int = 0,
        cancel: threading.Event | None = None,
    ) -> Utterance:
        """Codes and hidden states of one already-normalised sentence (no audio)."""
        params = self.audio_params(config)
        sampler = CodeSampler(self._sampling(config), self.spec.eos_token, seed)
        stats = DecodeStats()
        codes, hiddens = [], []
        with self._lock:
            for c, h in self.gpt.generate(
                self.prompt_embeds(sentence, params), sampler, cancel, stats
            ):
                codes.append(c.copy())
                hiddens.append(h.copy())
        q, d = self.spec.num_vq, self.spec.hidden_size
        return Utterance(
            sentence,
            np.array(codes, np.int64).reshape(-1, q),
            np.array(hiddens, np.float32).reshape(-1, d),
            stats,
        )

    def _stream_sentence(
        self,
        sentence: str,
        params: dict[str, Any],
        sampler: CodeSampler,
        cancel: threading.Event | None,
        stats: DecodeStats,
        gate: StartGate | None = None,
    ) -> Iterator[np.ndarray]:
        """One sentence's audio chunks; with a ``gate`` they are held (decoding goes on) until
        it opens or the sentence ends (prebuffer.py)."""
        with span("text, prompt"):
            embeds = self.prompt_embeds(sentence, params)
        max_steps = min(sampler.params.max_new_token, self.spec.max_context)
        stream = StreamingVocoder(self.vocoder, self.schedule, max_steps, self.spec.hidden_size)
        held: list[np.ndarray] = []
        for _codes, hidden in self.gpt.generate(embeds, sampler, cancel, stats):
            if gate is not None:
                gate.tick()
            render = stream.add(hidden)
            if render is not None:
                held.append(self._render(stream, render))
            if held and (
                gate is None or gate.opens(self.schedule, stream, max_steps, self._render_step_s)
            ):
                yield from held
                held.clear()
        if stats.stop != "cancelled":
            tail = stream.final()
            if tail is not None:
                held.append(self._render(stream, tail))
        yield from held

    def _render(self, stream: StreamingVocoder, render: Render) -> np.ndarray:
        t0 = self.clock()
        with span("vocoder"):  # decoder, Vocos, iSTFT
            audio = stream.emit(render, self.vocoder.spectra(render.hiddens))
        self._render_s += self.clock() - t0
        self._rendered_steps += len(render.hiddens)
        return audio

    @property
    def _render_step_s(self) -> float:
        return self._render_s / self._rendered_steps if self._rendered_steps else 0.0


def _sentence_end(sentence: str, samples: int) -> AudioChunk:
    """An empty chunk after a sentence's audio that times it (``Word`` of kind ``sentence``,
    starting ``samples`` back): ChatTTS knows where a sentence ends only once it has made it, and
    it has no word timings (docs/chattts-engine.md)."""
    return AudioChunk(b"", SAMPLE_RATE, words=(Word(sentence, -samples, 0, "sentence"),))


def _lang(lang: str | None) -> textfe.Lang | None:
    """A language code as the text front-end takes it: "en_US" → "en"; others are refused."""
    if lang is None:
        return None
    base = lang.replace("-", "_").split("_")[0].lower()
    if base not in LANGS:
        raise EngineError(f"lang {lang!r}: ChatTTS speaks {' or '.join(LANGS)}")
    return base  # type: ignore[return-value]
