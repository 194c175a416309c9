"""Prepare once: what a request *means*, decided in one place for every caller.

``prepare`` turns the text and knobs a client sent into a ``Prepared`` request: the voice resolved
(by name, or by language), the language, the engine's options validated against its declarations
(``Engine.options``), the audio key and the seed derived from it. The daemon (``Control``),
``speakd synth`` and ``speakd-tools precompute`` all call it, so the same request gives the same
key, and so the same bytes, everywhere.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from speakd.audio.pitch import PITCH_RANGE, neutral, resolved, unavailable
from speakd.engines.base import EngineError, SynthesisConfig, VoiceInfo, VoiceModel
from speakd.engines.keys import key_of, seed_from_key
from speakd.engines.options import OptionError, validate
from speakd.request.errors import RequestError
from speakd.request.loudness import CALIBRATION

DEFAULT_VOICE = "default"
SPEED_RANGE = (0.25, 4.0)  # a request's speed (1.0 = the voice's own)
VOLUME_RANGE = (0.0, 4.0)  # a request's gain (1.0 = unchanged)


@dataclass(frozen=True)
class Prepared:
    """A request ready for the cache or the engine. ``config`` has the voice resolved and the seed
    pinned; ``params`` is what the engine says changes the audio (stored beside each clip).
    Marked-up text (SSML, ``speakd.markup.plan``) has ``parts``: its audio is composed of them
    (``speakd.request.compose``), and ``key`` hashes them. ``asked`` is ``config`` before its seed
    was pinned: ``text`` prepared with it again has the same key (stored with the clip, so a
    re-synthesis keeps every parameter: ``Resolver.remade``)."""

    text: str
    normalized: str
    config: SynthesisConfig
    key: str
    bundle: str
    params: dict[str, Any]
    parts: tuple[Part, ...] = ()
    asked: SynthesisConfig | None = None


@dataclass(frozen=True)
class Speech:
    """A run of marked-up text, prepared like plain text, and its ``<prosody volume>``; its SSML
    marks are positions in it, not cuts: (character offset into ``prepared.text``, name), placed
    on the audio by the engine's word timings (``speakd.request.marks``). The audio, and so its
    key, is the unmarked text's."""

    prepared: Prepared
    volume: float = 1.0
    marks: tuple[tuple[int, str], ...] = ()


@dataclass(frozen=True)
class Silence:
    ms: int


@dataclass(frozen=True)
class Marker:
    name: str


@dataclass(frozen=True)
class Sound:
    """A sound played as it is (``speakd.request.sounds``): a built-in chime or a pinned clip, by
    ``name``; ``key`` says which audio, ``loudness`` the LUFS it plays at (None: as stored)."""

    name: str
    key: str
    loudness: float | None = None


Part = Speech | Silence | Marker | Sound


def check_range(name: str, value: object, bounds: tuple[float, float]) -> None:
    """RequestError ``bad_field`` unless ``value`` is None or a finite number within ``bounds``:
    what a request may ask for is refused outside them, never clamped, whichever way it came in
    (the daemon's front-ends through ``Control``, ``speakd synth``, the Python API)."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise RequestError("bad_field", f"{name} must be a number")
    if isinstance(value, float) and not math.isfinite(value):  # (a huge int overflows isfinite)
        raise RequestError("bad_field", f"{name} must be a finite number")
    lo, hi = bounds
    if not lo <= value <= hi:
        raise RequestError("bad_field", f"{name} must be within {lo}..{hi}, got {value}")


def check_config(config: SynthesisConfig) -> None:
    """A request's ``speed`` and ``pitch`` (``check_range``); ``prepare`` and ``prepare_request``
    both start with it, so no caller of either gets past it."""
    check_range("speed", config.speed, SPEED_RANGE)
    check_range("pitch", config.pitch, PITCH_RANGE)


def prepare(
    engine: VoiceModel,
    text: str,
    config: SynthesisConfig,
    *,
    strict_lang: bool = True,
    loudness: float | None = None,
) -> Prepared:
    """Resolve and validate ``config`` for ``engine``; RequestError says what is wrong.

    ``strict_lang`` False (SSIP's LANGUAGE setting) lets a language no voice speaks fall back to
    the default voice, as speech-dispatcher does, instead of failing the request.

    ``loudness`` is the LUFS the clip is normalised to (``speakd.request.loudness``; None: as the
    engine makes it; the daemon's is audio.loudness_lufs). It is in ``params`` and so in the key,
    since it changes the clip's bytes, but not in the seed: the same request at another level is the
    same speech, louder. ``config.pitch`` (semitones, ``speakd.audio.pitch``, rounded to its
    ``PITCH_STEP``: ``resolved``) is keyed the same way;
    a neutral pitch adds nothing, so its key and audio are those of a request without one, and so
    does any pitch where this machine cannot shift one (``unavailable``: the caller warns).
    """
    check_config(config)
    try:
        extra = validate(engine.options, config.extra)
    except OptionError as e:
        raise RequestError("bad_field", str(e)) from None
    voice, lang = select_voice(
        engine.voices(), engine.default_voice(), config.voice, config.lang, strict=strict_lang
    )
    pitch = resolved(config.pitch)
    if pitch is not None and unavailable():
        pitch = None
    config = dataclasses.replace(config, voice=voice, lang=lang, extra=extra, pitch=pitch)
    try:
        normalized = engine.normalize_text(text, lang)
        params = engine.audio_params(config)
    except EngineError as e:
        raise RequestError(getattr(e, "code", "bad_request"), str(e)) from None
    seed, asked = config.seed, config
    key = key_of(normalized, params, engine.bundle_id, seed)
    if seed is None:  # the same request always yields the same audio
        config = dataclasses.replace(config, seed=seed_from_key(key))
    after: dict[str, Any] = {}  # what is done to the engine's PCM: not in the seed, in the key
    if loudness is not None:
        after["loudness"] = {"lufs": loudness, "calibration": CALIBRATION}
    if not neutral(config.pitch):
        after["pitch"] = config.pitch
    if after:
        params = {**params, **after}
        key = key_of(normalized, params, engine.bundle_id, seed)
    return Prepared(text, normalized, config, key, engine.bundle_id, params, asked=asked)


def select_voice(
    voices: list[VoiceInfo],
    default: str,
    voice: str | None,
    lang: str | None,
    *,
    strict: bool = True,
) -> tuple[str | None, str | None]:
    """(voice, language) for a request: a named voice must exist; without one, a language picks
    the default voice when it speaks it, else the first voice that does. The language returned is
    the code the chosen voice lists (``en`` for a request's ``en-GB`` when the voice says ``en``).
    """
    names = {v.name: v for v in voices}
    if voice is not None and voice != DEFAULT_VOICE and voice not in names:
        known = ", ".join(sorted([*names, DEFAULT_VOICE]))
        raise RequestError("unknown_voice", f"unknown voice {voice!r} (known: {known})")
    if not lang:
        return voice, None
    chosen = names.get(voice or default) if voice not in (None, DEFAULT_VOICE) else None
    candidates = [chosen] if chosen is not None else [names.get(default), *voices]
    for candidate in candidates:
        if candidate is None:
            continue
        match = match_language(candidate.languages, lang)
        if match is not None:
            picked = voice if chosen is not None or candidate.name == default else candidate.name
            return picked, match
    if strict:
        spoken = sorted({code for v in voices for code in v.languages})
        who = f"voice {voice!r}" if chosen is not None else "no voice"
        raise RequestError(
            "unknown_language",
            f"{who} speaks {lang!r} (languages: {', '.join(spoken) or 'none listed'})",
        )
    return voice, None


def bcp47(code: str) -> str:
    """A voice's language code as clients read it, BCP 47: ``en_US`` → ``en-US``, ``zh`` →
    ``zh``, ``sr_latn_rs`` → ``sr-Latn-RS``. Listings show this; requests may use either
    spelling (``match_language``), and the code the voice lists stays what keys its audio."""
    first, *rest = code.strip().replace("_", "-").split("-")
    subtags = [first.lower()]
    for tag in rest:
        if len(tag) == 4 and tag.isalpha():
            subtags.append(tag.title())  # script
        elif (len(tag) == 2 and tag.isalpha()) or (len(tag) == 3 and tag.isdigit()):
            subtags.append(tag.upper())  # region
        else:
            subtags.append(tag.lower())
    return "-".join(subtags)


def _code(lang: str) -> str:
    return lang.strip().replace("_", "-").lower()


def match_language(spoken: tuple[str, ...], wanted: str) -> str | None:
    """The voice's code for ``wanted``: exact first, then by base language (en-GB ~ en_US)."""
    codes = {_code(c): c for c in spoken}
    wanted = _code(wanted)
    if wanted in codes:
        return codes[wanted]
    base = wanted.split("-")[0]
    for code, original in codes.items():
        if code.split("-")[0] == base:
            return original
    return None
