"""A request's fields, the names every front-end maps its protocol onto: validated, then prepared
against the voices (``speakd.markup.plan.prepare_request``) into a ``SpeakRequest``; and a
prepared request explained part by part (``speakd say --explain``). ``Control.build_request``
is the door; this is what it checks.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from speakd.engines.base import SynthesisConfig
from speakd.markup.capitals import Capitals
from speakd.markup.lexicon import Lexicon
from speakd.markup.plan import prepare_request, with_chime
from speakd.markup.punctuation import Punctuation
from speakd.markup.ssml import is_ssml
from speakd.request.errors import InputWarning, RequestError
from speakd.request.messages import EventCallback, Priority, SpeakRequest, validate_text
from speakd.request.prepare import VOLUME_RANGE, Marker, Part, Silence, Sound, Speech, check_range
from speakd.request.sounds import CHIMES, Sounds
from speakd.request.voices import VoiceLibrary

MAX_ID_CHARS = 128
FORMATS = ("text", "ssml")


def build(
    fields: dict[str, Any],
    *,
    library: VoiceLibrary,
    lexicon: Lexicon,
    sounds: Sounds,
    max_text_chars: int,
    origin: str,
    client: str = "",
    on_event: EventCallback | None = None,
    strict_lang: bool = True,
    warn: Callable[[InputWarning], None],
) -> SpeakRequest:
    """Validate a request's fields (every front-end maps onto these names) and prepare it:
    ``text``, ``format`` (``text`` or ``ssml``; a text whose root is ``<speak>`` is SSML
    either way), ``id``, ``voice``, ``speaker``, ``lang``, ``priority``, ``speed``,
    ``volume``, ``pitch`` (semitones, ``speakd.audio.pitch``), ``seed``, ``params`` (the
    engine's options), ``cache_only``, ``words`` (word events, ``speakd.audio.Word``), ``chime``
    (a sound played first, ``speakd.request.sounds``),
    ``punctuation`` and ``punctuation_important`` (symbols said by name,
    ``speakd.markup.punctuation``), ``capitals`` (``none``, ``spell`` or ``icon``,
    ``speakd.markup.capitals``)."""
    text = validate_text(fields.get("text"), max_text_chars)
    text_format = fields.get("format") or "text"
    if text_format not in FORMATS:
        raise RequestError("bad_field", f"format must be one of {', '.join(FORMATS)}")
    voice, lang = _string(fields, "voice"), _string(fields, "lang")
    speaker = fields.get("speaker")
    if isinstance(speaker, int) and not isinstance(speaker, bool):
        speaker = str(speaker)  # a speaker id
    speaker = _string({"speaker": speaker}, "speaker")
    chime = _string(fields, "chime")
    speed, pitch, volume = fields.get("speed"), fields.get("pitch"), fields.get("volume")
    check_range("volume", volume, VOLUME_RANGE)  # speed and pitch: prepare_request's check
    seed = fields.get("seed")
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool) or seed < 0):
        raise RequestError("bad_field", "seed must be a non-negative integer")
    config = SynthesisConfig(
        voice=voice,
        speaker=speaker,
        speed=speed,
        seed=seed,
        lang=lang,
        pitch=pitch,
        extra=fields.get("params") or {},
    )
    prepared = prepare_request(
        library,
        text,
        config,
        ssml=text_format == "ssml" or is_ssml(text),
        lexicon=lexicon,
        punctuation=Punctuation.of(fields.get("punctuation"), fields.get("punctuation_important")),
        capitals=Capitals.of(fields.get("capitals")),
        strict_lang=strict_lang,
        sounds=sounds,
        warn=warn,
    )
    if chime is not None:
        prepared = with_chime(prepared, _chime(sounds, chime, prepared.bundle, prepared.config))
    request = SpeakRequest(
        text=text,
        priority=Priority.parse(fields.get("priority")),
        config=config,
        volume=1.0 if volume is None else volume,
        origin=origin,
        client=client,
        on_event=on_event,
        cache_only=bool(fields.get("cache_only", False)),
        words=bool(fields.get("words", False)),
        prepared=prepared,
    )
    request_id = fields.get("id")
    if request_id is not None:
        request.id = _request_id(request_id)
    return request


def _chime(sounds: Sounds, name: str, bundle: str, config: SynthesisConfig) -> Sound:
    sound = sounds.find(name, bundle, config.voice or "")
    if sound is None:
        raise RequestError(
            "unknown_chime",
            f"unknown chime {name!r} (built-in: {', '.join(CHIMES)}; or the text of a pinned clip)",
        )
    return sound


def explain(request: SpeakRequest) -> dict[str, Any]:
    """What a prepared request will say, part by part (``speakd say --explain``): each run of
    text as sent after the lexicon, as its engine reads it, with its voice and key; the
    silences and marks between them."""
    prepared = request.prepared
    assert prepared is not None
    return {
        "key": prepared.key,
        "parts": [_explained(part) for part in prepared.parts or (Speech(prepared),)],
    }


def _explained(part: Part) -> dict[str, Any]:
    if isinstance(part, Silence):
        return {"silence_ms": part.ms}
    if isinstance(part, Marker):
        return {"mark": part.name}
    if isinstance(part, Sound):
        return {"sound": part.name, "key": part.key}
    p = part.prepared
    return {
        "text": p.text,
        "reads": p.normalized,
        "voice": p.config.voice,
        "lang": p.config.lang,
        "speed": p.config.speed or 1.0,
        "pitch": p.config.pitch or 0.0,
        "volume": part.volume,
        "key": p.key,
        **({"marks": [list(m) for m in part.marks]} if part.marks else {}),
    }


def _request_id(value: Any) -> str:
    if not isinstance(value, str | int) or isinstance(value, bool):
        raise RequestError("bad_field", "id must be a string")
    value = str(value)
    if not 0 < len(value) <= MAX_ID_CHARS or not value.isprintable():
        raise RequestError("bad_field", f"id must be 1..{MAX_ID_CHARS} printable characters")
    return value


def _string(fields: dict[str, Any], key: str) -> str | None:
    value = fields.get(key)
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise RequestError("bad_field", f"{key} must be a string")
    return value
