"""The voice library: every voice the board has, from any engine, served side by side.

A voice is known from its files alone (``VoiceModel``: names, languages, speakers, bundle id,
licence), so requests are chosen and keyed without its model in memory, and a cached clip plays
while the voice stays unloaded. The model loads on the first synthesis that needs it (or at start,
``voices.preload``); past ``limits.max_loaded_voices`` or ``limits.max_voice_bytes`` the least
recently used idle voice is unloaded. A voice with a synthesis in flight never is.

Where voices come from (``scan``): the ``[engine]`` voice, the embedded Piper voice (unless
``voices.embedded = false``), and ``voices.dir``: Piper voices (``NAME.onnx`` + ``NAME.onnx.json``)
and bundle folders (``manifest.json``; a calibrated ``NAME-int8`` sibling stands in for ``NAME``
as ``engine.precision`` says). A voice whose files are broken is reported (``problems``) and left
out; it never stops the others. Two voices with one name is a ``ConfigError`` naming both.

Choosing (``select``) is one rule for every front-end: a request's ``voice`` by name, else its
``lang`` through ``voices.by_lang``, else the default voice when it speaks the language, else the
first voice that does; with neither, the default voice.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from speakd.config import Config, ConfigError, EngineConfig
from speakd.engines import accelerate, describe_engine, load_engine, load_model
from speakd.engines.base import (
    Engine,
    EngineError,
    SynthesisConfig,
    UnknownSpeakerError,
    VoiceInfo,
    VoiceModel,
)
from speakd.engines.bundle import INT8_SUFFIX
from speakd.engines.registry import KINDS, kind_of
from speakd.machine.memory import rss_bytes, trim_heap
from speakd.request.errors import InputWarning, RequestError
from speakd.request.prepare import (
    DEFAULT_VOICE,
    Prepared,
    bcp47,
    match_language,
    prepare,
    select_voice,
)

log = logging.getLogger(__name__)

EMBEDDED = "(embedded)"


@dataclass
class Voice:
    """One model in the library and its state. ``model`` is always there; ``engine`` only while
    loaded."""

    model: VoiceModel
    source: str  # the file or folder it came from, or "(embedded)"
    loader: Callable[[], Engine]
    engine: Engine | None = None
    busy: int = 0  # syntheses in flight
    last_used: float = 0.0
    load_s: float | None = None  # the last load's time
    resident_bytes: int = 0  # the process's resident memory the last load added
    loads: int = 0
    synthesis_lock: threading.Lock = field(default_factory=threading.Lock)
    load_lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def name(self) -> str:
        return self.model.voices()[0].name

    @property
    def licence(self) -> str:
        return getattr(self.model, "licence", "") or "unknown"


@dataclass(frozen=True)
class VoiceProblem:
    """A voice file that could not be read: named in status, doctor and the log."""

    source: str
    error: str


class VoiceLibrary:
    def __init__(
        self,
        voices: list[Voice],
        *,
        default: str = "",
        by_lang: dict[str, str] | None = None,
        max_loaded: int = 0,
        max_bytes: int = 0,
        problems: tuple[VoiceProblem, ...] = (),
        sentence_silence_ms: int = 0,
        loudness: float | None = None,
        default_speaker: str = "",
    ) -> None:
        if not voices:
            raise ConfigError("voices: no voice at all (voices.embedded = false and none found)")
        self._voices = voices
        self.primary = voices[0]  # the [engine] voice
        self.by_name: dict[str, Voice] = {}
        for voice in voices:
            for info in voice.model.voices():
                other = self.by_name.get(info.name)
                if other is not None:
                    raise ConfigError(
                        f"voices: two voices named {info.name!r}: {other.source} and "
                        f"{voice.source} (rename one file or folder)"
                    )
                self.by_name[info.name] = voice
        self.by_bundle = {v.model.bundle_id: v for v in voices}
        self.default = default or voices[0].model.default_voice()
        if self.default not in self.by_name:
            raise ConfigError(f"voices.default: no voice named {self.default!r} ({self.known()})")
        self.default_speaker = default_speaker
        default_model = self.by_name[self.default].model
        speakers = next(i for i in default_model.voices() if i.name == self.default).speakers
        if default_speaker and default_speaker not in speakers:
            raise ConfigError(
                f"voices.default_speaker: {self.default} has no speaker {default_speaker!r} "
                f"(it has {', '.join(speakers) or 'one, unnamed'})"
            )
        self.by_lang = dict(by_lang or {})
        for lang, name in self.by_lang.items():
            if name not in self.by_name:
                raise ConfigError(
                    f"voices.by_lang.{lang}: no voice named {name!r} ({self.known()})"
                )
        self.max_loaded = max_loaded
        self.max_bytes = max_bytes
        self.problems = problems
        self.sentence_silence_ms = sentence_silence_ms
        self.loudness = loudness  # the LUFS every clip is normalised to; None: as made
        self._lock = threading.Lock()

    @classmethod
    def of(cls, engine: Engine, loudness: float | None = None) -> VoiceLibrary:
        """One loaded engine as a library (tests, the library API, ``speakd synth``)."""
        return cls([Voice(engine, engine.kind, lambda: engine, engine=engine)], loudness=loudness)

    # ---- choosing ---------------------------------------------------------------------------

    def infos(self) -> list[VoiceInfo]:
        """Every voice, the default first, then in the order they were found."""
        infos = [i for v in self._voices for i in v.model.voices()]
        return sorted(infos, key=lambda i: i.name != self.default)

    def select(
        self, voice: str | None, lang: str | None, *, strict: bool = True
    ) -> tuple[Voice, str, str | None]:
        """(the voice, its name, the language code it lists) for a request; RequestError for
        an unknown voice or language (when ``strict``)."""
        chosen = self._by_lang(lang) if voice in (None, "", DEFAULT_VOICE) and lang else None
        if chosen is None:
            name, code = select_voice(self.infos(), self.default, voice, lang, strict=strict)
            name = self.default if name in (None, DEFAULT_VOICE) else name
            chosen = self.by_name[name], name, code
        return chosen

    def speaker(
        self, voice: Voice, name: str, speaker: str | None
    ) -> tuple[str | None, InputWarning | None]:
        """The speaker voice ``name`` speaks a request with (None: its default) and what the
        client is told. None on the default voice is ``voices.default_speaker``, when set (the
        add-on's speaker option: Home Assistant names none). A speaker it has is kept. A
        single-speaker voice speaks any other with its one speaker, silently for the shapes
        clients send for "the only one" (Home Assistant: ``"0"``, or the voice's name); an
        unknown speaker falls back to the default speaker with an ``unknown_speaker`` warning
        (docs/reliability.md, "Lenient input")."""
        if speaker in (None, ""):
            return (self.default_speaker or None) if name == self.default else None, None
        try:
            voice.model.audio_params(SynthesisConfig(voice=name, speaker=speaker))
            return speaker, None
        except UnknownSpeakerError as e:
            speakers = next(i for i in voice.model.voices() if i.name == name).speakers
            if len(speakers) <= 1 and speaker in ("0", name, *speakers):
                return None, None
            default = speakers[0] if speakers else "its one speaker"
            return None, InputWarning("unknown_speaker", f"{e}; spoken by {default}")
        except EngineError as e:
            raise RequestError(getattr(e, "code", "bad_request"), str(e)) from None

    def _by_lang(self, lang: str) -> tuple[Voice, str, str | None] | None:
        for wanted, name in self.by_lang.items():
            code = match_language(self.by_name[name].model.voices()[0].languages, lang)
            if match_language((wanted,), lang) is not None and code is not None:
                return self.by_name[name], name, code
        return None

    def prepare(self, text: str, config: SynthesisConfig, *, strict_lang: bool = True) -> Prepared:
        """``speakd.request.prepare.prepare`` against the voice the request chooses."""
        voice, name, lang = self.select(config.voice, config.lang, strict=strict_lang)
        extra = config.extra
        piper_like = any(o.name == "sentence_silence" for o in voice.model.options)
        if self.sentence_silence_ms and piper_like and "sentence_silence" not in extra:
            extra = {**extra, "sentence_silence": self.sentence_silence_ms / 1000}
        config = dataclasses.replace(config, voice=name, lang=lang, extra=extra)
        return prepare(voice.model, text, config, strict_lang=strict_lang, loudness=self.loudness)

    # ---- using ------------------------------------------------------------------------------

    @contextlib.contextmanager
    def using(
        self, bundle: str, on_load: Callable[[float], None] | None = None
    ) -> Iterator[Engine]:
        """The voice's engine, loaded if it is not (``on_load`` hears how long that took), held
        against unloading until the block ends; its synthesis lock is held too unless the engine
        runs requests side by side."""
        voice = self.by_bundle.get(bundle)
        if voice is None:
            raise EngineError(f"no voice with bundle {bundle} (removed by a reload?)")
        with self._lock:
            voice.busy += 1
        try:
            engine = self._load(voice, on_load)
            lock = (
                contextlib.nullcontext()
                if getattr(engine, "concurrent_synthesis", False)
                else voice.synthesis_lock
            )
            with lock:
                yield engine
        finally:
            with self._lock:
                voice.busy -= 1
                voice.last_used = time.monotonic()

    def load(self, name: str) -> Voice:
        """Load a voice now (``voices.preload``, tests)."""
        voice = self.by_name[name]
        with self._lock:
            voice.busy += 1
        try:
            self._load(voice)
        finally:
            with self._lock:
                voice.busy -= 1
                voice.last_used = time.monotonic()
        return voice

    def loaded_in(self, bundle: str) -> float | None:
        """How long the voice's last load took, while it is loaded (first-request events)."""
        voice = self.by_bundle.get(bundle)
        return voice.load_s if voice is not None and voice.engine is not None else None

    def _load(self, voice: Voice, on_load: Callable[[float], None] | None = None) -> Engine:
        with voice.load_lock:
            engine = voice.engine
            if engine is not None:
                return engine
            rss0, t0 = rss_bytes(), time.monotonic()
            engine = voice.loader()
            voice.load_s = time.monotonic() - t0
            voice.resident_bytes = max(0, rss_bytes() - rss0)
            voice.loads += 1
            voice.engine = engine
            if on_load is not None:
                on_load(voice.load_s)
            log.info(
                "voice %s loaded in %.2f s (%s, +%.0f MB resident)",
                voice.name,
                voice.load_s,
                voice.model.bundle_id,
                voice.resident_bytes / 1e6,
            )
        self._evict(keep=voice)
        return engine

    def _evict(self, keep: Voice) -> None:
        """Unload least recently used idle voices until the limits hold (or none is idle)."""
        unloaded: list[str] = []
        with self._lock:
            while True:
                loaded = [v for v in self._voices if v.engine is not None]
                total = sum(v.resident_bytes for v in loaded)
                over = (self.max_loaded and len(loaded) > self.max_loaded) or (
                    self.max_bytes and total > self.max_bytes
                )
                idle = [v for v in loaded if v.busy == 0 and v is not keep]
                if not over or not idle:
                    break
                victim = min(idle, key=lambda v: v.last_used)
                victim.engine = None
                unloaded.append(victim.name)
        for name in unloaded:
            log.info("voice %s unloaded (least recently used; limits)", name)
        if unloaded:
            trim_heap()

    # ---- what there is ----------------------------------------------------------------------

    def listing(self) -> list[dict[str, Any]]:
        """Every voice as ``speakd voices``, the socket, HTTP and Wyoming describe it."""
        out = []
        for info in self.infos():
            voice = self.by_name[info.name]
            model = voice.model
            kind = KINDS.get(model.kind)
            out.append(
                {
                    "name": info.name,
                    "engine": model.kind,
                    "made_by": kind.made_by if kind is not None else "",
                    "url": kind.url if kind is not None else "",
                    "language": ",".join(bcp47(code) for code in info.languages),
                    "languages": [bcp47(code) for code in info.languages],
                    "speakers": list(info.speakers),
                    "description": info.description,
                    "sample_rate": model.sample_rate,
                    "precision": model.precision,
                    "bundle": model.bundle_id,
                    "loaded": voice.engine is not None,
                    "default": info.name == self.default,
                    "licence": voice.licence,
                    "options": [o.describe() for o in model.options],
                    # SSML this voice's engine cannot honour is said so (docs/ssml.md); pitch is
                    # every voice's (speakd.audio.pitch shifts the engine's PCM)
                    "ssml": {"pitch": True, "phonemes": getattr(model, "phoneme_input", False)},
                }
            )
        return out

    def status(self) -> dict[str, Any]:
        return {
            "default": self.default,
            "by_lang": self.by_lang,
            "loaded": [v.name for v in self._voices if v.engine is not None],
            "max_loaded": self.max_loaded,
            "max_bytes": self.max_bytes,
            "voices": {
                v.name: {
                    "engine": v.model.kind,
                    "loaded": v.engine is not None,
                    "busy": v.busy,
                    "resident_bytes": v.resident_bytes if v.engine is not None else 0,
                    "load_s": None if v.load_s is None else round(v.load_s, 3),
                    "loads": v.loads,
                    "source": v.source,
                }
                for v in self._voices
            },
            "problems": [dataclasses.asdict(p) for p in self.problems],
        }

    def known(self) -> str:
        return "known: " + ", ".join(sorted(self.by_name))


# ---- building the library from the config -------------------------------------------------


def build_library(
    config: Config, engine: Engine | None = None, previous: VoiceLibrary | None = None
) -> VoiceLibrary:
    """The voices the config names; ``engine`` is the ``[engine]`` voice when already loaded, and
    a voice ``previous`` has loaded stays loaded (a reload). Broken voice files become
    ``problems``; a name clash or a bad default is a ConfigError."""
    engine_config = config.engine
    voices: list[Voice] = []
    problems: list[VoiceProblem] = []
    model = describe_engine(engine_config)
    if engine is not None and engine.bundle_id != model.bundle_id:
        model = engine  # an engine made some other way (the library API, tests): its own model
    # (else the description, not the engine: an unloaded [engine] voice frees its model)
    source = engine_config.bundle or EMBEDDED
    voices.append(Voice(model, source, lambda: load_engine(engine_config), engine=engine))
    if config.voices.embedded:
        for kind in KINDS.values():
            embedded = kind.embedded() if kind.embedded is not None else None
            if embedded is not None and embedded.bundle_id != model.bundle_id:
                voices.append(_voice(embedded, EMBEDDED, engine_config))
    for source, found in scan_dir(Path(config.voices.dir), engine_config):
        if isinstance(found, VoiceProblem):
            problems.append(found)
            log.error("voice %s left out: %s", found.source, found.error)
            continue
        if found.bundle_id in {v.model.bundle_id for v in voices}:
            continue  # the [engine] voice or the embedded one, also in the folder
        voices.append(_voice(found, source, engine_config))
    for i, voice in enumerate(voices):
        kept = previous.by_bundle.get(voice.model.bundle_id) if previous else None
        if kept is not None and voice.engine is None and kept.engine is not None:
            # the same model and its lock: a flight of the old library may still be running
            voices[i] = dataclasses.replace(kept, source=voice.source, loader=voice.loader, busy=0)
    library = VoiceLibrary(
        voices,
        default=config.voices.default or engine_config.voice.replace(DEFAULT_VOICE, ""),
        by_lang=config.voices.by_lang,
        max_loaded=config.limits.max_loaded_voices,
        max_bytes=config.limits.max_voice_bytes,
        problems=tuple(problems),
        sentence_silence_ms=config.audio.sentence_silence_ms,
        loudness=config.audio.loudness,
        default_speaker=config.voices.default_speaker,
    )
    for name in config.voices.preload:
        if name not in library.by_name:
            raise ConfigError(f"voices.preload: no voice named {name!r} ({library.known()})")
    return library


def scan_dir(
    folder: Path, engine_config: EngineConfig
) -> Iterator[tuple[str, VoiceModel | VoiceProblem]]:
    """Voices in ``voices.dir``, in name order: bare model files of the kinds that have them,
    and bundle folders (a ``NAME-int8`` sibling replaces ``NAME`` unless precision is exact)."""
    try:
        entries = sorted(folder.iterdir())
    except FileNotFoundError:
        return
    except OSError as e:
        yield str(folder), VoiceProblem(str(folder), f"cannot list the folder: {e.strerror}")
        return
    names = {p.name for p in entries}
    suffixes = {k.model_suffix: k for k in KINDS.values() if k.model_suffix}
    for path in entries:
        if path.is_dir():
            if not (path / "manifest.json").is_file():
                continue
            base = path.name.removesuffix(INT8_SUFFIX)
            if engine_config.precision == "exact":
                sibling_wins = base != path.name and base in names
            else:
                sibling_wins = base == path.name and f"{base}{INT8_SUFFIX}" in names
            if sibling_wins:
                continue
            yield str(path), _describe(path, _bundle_kind(path))
        elif path.suffix in suffixes:
            yield str(path), _describe(path, suffixes[path.suffix].name)


def _bundle_kind(path: Path) -> str:
    import json

    try:
        return str(json.loads((path / "manifest.json").read_text(encoding="utf-8"))["engine"])
    except (OSError, ValueError, KeyError, TypeError):
        return ""  # _describe names the problem


def _describe(path: Path, kind: str) -> VoiceModel | VoiceProblem:
    from speakd.engines.bundle import BundleError

    try:
        return kind_of(kind).describe(path)
    except (EngineError, BundleError, OSError, ValueError) as e:
        return VoiceProblem(str(path), str(e))


def _voice(model: VoiceModel, source: str, config: EngineConfig) -> Voice:
    """A voice of the folder or the embedded one; a bundle's voice runs on the NPU when
    ``engine.accelerator`` and its ``.rknn`` graphs allow, as the ``[engine]`` voice does (a
    bare Piper file has no ``.rknn`` graphs: nothing to decide, nothing logged)."""
    if getattr(model, "bundle_dir", None) is not None:
        model = accelerate(model, config)
    return Voice(model, source, lambda: load_model(model, config))
