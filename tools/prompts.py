"""The prompts a pack is made from (``speakd-tools precompute``): a file, or the daemon's key echo.

A text file (one prompt a line; blank lines and ``#`` comments skipped) or TOML::

    voice = "default"            # defaults for every prompt (optional)
    speed = 1.0

    [[prompt]]
    text = "The door is open."
    voice = "en_US-joe-medium"   # per-prompt overrides: voice, speaker, lang, speed, seed, params,
    pitch = 1.2                  # and pitch (semitones, as a request's)
    params = { noise_scale = 0.5 }

TOML rather than YAML: ``tomllib`` is in the standard library, so the tool needs no extra parser.
A wrong file is a ``PromptError`` that names the file and the prompt.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from speakd.engines.base import SynthesisConfig

PROMPT_FIELDS = {"text", "voice", "speaker", "lang", "speed", "pitch", "seed", "params"}


class PromptError(ValueError):
    """The prompts file is wrong; the message names the file and the prompt."""


@dataclass(frozen=True)
class Prompt:
    text: str
    voice: str | None = None
    speaker: str | None = None  # a multi-speaker voice's speaker (ChatTTS: an embedding)
    lang: str | None = None
    speed: float | None = None
    pitch: float | None = None  # semitones (speakd.audio.pitch), as a request's ``pitch``
    seed: int | None = None
    params: tuple[tuple[str, Any], ...] = ()  # sorted items: hashable, so duplicates collapse

    def config(self) -> SynthesisConfig:
        return SynthesisConfig(
            voice=self.voice,
            speaker=self.speaker,
            speed=self.speed,
            pitch=self.pitch,
            seed=self.seed,
            lang=self.lang,
            extra=dict(self.params),
        )


def read_prompts(path: Path, voice: str | None = None) -> list[Prompt]:
    """Prompts from a text or TOML file; ``voice`` is the default for prompts that name none."""
    try:
        raw = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise PromptError(f"{path}: cannot read the prompts: {e}") from None
    if path.suffix.lower() == ".toml":
        return _toml_prompts(path, raw, voice)
    return [
        Prompt(line.strip(), voice)
        for line in raw.splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]


def _toml_prompts(path: Path, raw: str, voice: str | None) -> list[Prompt]:
    try:
        data = tomllib.loads(raw)
    except tomllib.TOMLDecodeError as e:
        raise PromptError(f"{path}: not valid TOML: {e}") from None
    unknown = set(data) - (PROMPT_FIELDS - {"text"}) - {"prompt"}
    if unknown:
        raise PromptError(f"{path}: unknown top-level key {sorted(unknown)[0]!r}")
    items = data.get("prompt")
    if not isinstance(items, list) or not items:
        raise PromptError(f"{path}: expected [[prompt]] tables with a text each")
    defaults = {k: v for k, v in data.items() if k != "prompt"}
    if voice is not None:
        defaults.setdefault("voice", voice)
    return [_prompt(f"{path}: prompt[{i}]", {**defaults, **item}) for i, item in enumerate(items)]


def key_echo_prompts(voice: str | None = None) -> list[Prompt]:
    """The daemon's key-echo pack (``speakd.frontends.ssip.keys``, at ``[ssip]``'s default rates
    and pitches) as prompts, built from the same request fields: letters, digits and key names.
    Symbols are left to the daemon's own prewarm: it says them by name through its punctuation
    (``speakd.markup.punctuation``), which a prompt has no field for."""
    from speakd.config import SsipConfig
    from speakd.frontends.ssip.keys import pack_fields

    return [
        Prompt(text=f["text"], voice=voice, speed=f.get("speed"), pitch=f.get("pitch"))
        for f in pack_fields(SsipConfig())
        if len(f["text"]) > 1 or f["text"].isalnum()
    ]


def _prompt(where: str, item: Any) -> Prompt:
    if not isinstance(item, dict):
        raise PromptError(f"{where}: expected a table")
    unknown = set(item) - PROMPT_FIELDS
    if unknown:
        raise PromptError(
            f"{where}.{sorted(unknown)[0]}: unknown field"
            f" (known: {', '.join(sorted(PROMPT_FIELDS))})"
        )
    checks: dict[str, tuple[type, ...]] = {
        "text": (str,),
        "voice": (str,),
        "speaker": (str,),
        "lang": (str,),
        "speed": (int, float),
        "pitch": (int, float),
        "seed": (int,),
        "params": (dict,),
    }
    for key, types in checks.items():
        value = item.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, types)):
            raise PromptError(f"{where}.{key}: expected {types[0].__name__}, got {value!r}")
    text = (item.get("text") or "").strip()
    if not text:
        raise PromptError(f"{where}.text: missing or empty")
    speed, pitch = item.get("speed"), item.get("pitch")
    return Prompt(
        text=text,
        voice=item.get("voice"),
        speaker=item.get("speaker"),
        lang=item.get("lang"),
        speed=None if speed is None else float(speed),
        pitch=None if pitch is None else float(pitch),
        seed=item.get("seed"),
        params=tuple(sorted((item.get("params") or {}).items())),
    )
