"""The Wyoming wire for untrusted clients, and the ``info`` speakd answers ``describe`` with.

A Wyoming event is a JSON header line, then ``data_length`` bytes of JSON data and
``payload_length`` bytes of payload. The ``wyoming`` package's own reader ends the connection on
any line that is not JSON and raises out of the handler on a header of the wrong shape (a string
``data_length``, a list instead of an object); it also trusts the lengths it is told. ``read_event``
reads the same format but says what is wrong instead: a bad header line or bad data is an error
the connection survives (the bytes were consumed, the next line is the next event), while a
length that is not a small non-negative integer leaves no way to find the next event, so the
connection is closed after the error (``WireError.fatal``).
"""

from __future__ import annotations

import asyncio
from typing import Any

from wyoming.event import Event
from wyoming.info import Attribution, Info, TtsProgram, TtsVoice, TtsVoiceSpeaker
from wyoming.tts import SynthesizeVoice

import speakd
from speakd.request.errors import RequestError
from speakd.request.messages import parse_json

PROGRAM = "speakd"
SPEAKD = Attribution(name="speakd", url="")
# The header of an event whose data never comes: sent before closing a refused stream, it is
# the one answer Wyoming's reader (asyncio's readexactly) raises on, not a normal end of audio.
CUT_OFF = b'{"type": "speakd-refused", "data_length": 1}\n'


class WireError(RequestError):
    """A malformed event; ``fatal`` when the stream cannot be followed past it."""

    def __init__(self, message: str, *, code: str = "bad_event", fatal: bool = False) -> None:
        super().__init__(code, message)
        self.fatal = fatal


async def read_event(reader: asyncio.StreamReader, max_bytes: int) -> Event | None:
    """The next event, or None at the end of the stream (also one cut off mid-event)."""
    try:
        line = await reader.readline()
    except ValueError:  # asyncio's LimitOverrunError: a header line past the reader's limit
        raise WireError("event header line too long", code="event_too_large", fatal=True) from None
    if not line:
        return None
    try:
        header = parse_json(line.decode("utf-8"))
    except UnicodeDecodeError:
        raise WireError("event header is not UTF-8") from None
    except RequestError as e:
        raise WireError(f"event header: {e}") from None
    if not isinstance(header, dict):
        raise WireError("event header must be a JSON object")
    data_length = _length(header, "data_length", max_bytes)
    payload_length = _length(header, "payload_length", max_bytes)
    try:
        raw_data = await reader.readexactly(data_length) if data_length else b""
        payload = await reader.readexactly(payload_length) if payload_length else None
    except asyncio.IncompleteReadError:
        return None
    event_type, data = header.get("type"), header.get("data", {})
    if raw_data:
        try:
            extra = parse_json(raw_data.decode("utf-8"))
        except (UnicodeDecodeError, RequestError):
            raise WireError("event data is not JSON") from None
        if not isinstance(extra, dict) or not isinstance(data, dict):
            raise WireError("event data must be a JSON object")
        data = {**data, **extra}
    if not isinstance(event_type, str) or not event_type:
        raise WireError("event has no type")
    if not isinstance(data, dict):
        raise WireError("event data must be a JSON object")
    return Event(type=event_type, data=data, payload=payload)


def _length(header: dict[str, Any], key: str, max_bytes: int) -> int:
    value = header.get(key)
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= max_bytes:
        raise WireError(
            f"{key} must be 0..{max_bytes} (limits.max_line_bytes), got {value!r}",
            code="event_too_large" if isinstance(value, int) and value > 0 else "bad_event",
            fatal=True,
        )
    return value


def build_info(voices: list[dict[str, Any]]) -> Info:
    """One TTS program with every voice of every engine (``Control.voices``), installed, with the
    languages each speaks and its speakers (Home Assistant's speaker option)."""
    program = TtsProgram(
        name=PROGRAM,
        description="speakd offline speech daemon",
        attribution=SPEAKD,
        installed=True,
        version=speakd.__version__,
        voices=[_voice(v) for v in voices],
        supports_synthesize_streaming=True,
    )
    return Info(tts=[program])


def _voice(voice: dict[str, Any]) -> TtsVoice:
    """Home Assistant shows a voice's ``description`` as its name in the voice picker: the name
    it is, then (the engine and licence are in ``speakd voices``)."""
    made_by = Attribution(name=voice["made_by"], url=voice["url"]) if voice["made_by"] else SPEAKD
    return TtsVoice(
        name=voice["name"],
        description=voice["name"],
        attribution=made_by,
        installed=True,
        version=voice["bundle"],
        languages=spellings(voice["languages"]),
        speakers=[TtsVoiceSpeaker(name=s) for s in voice["speakers"]] or None,
    )


def spellings(languages: list[str]) -> list[str]:
    """Each language as users write it: ``en-US``, ``en_US`` and ``en``. Home Assistant checks a
    service call's language by exact match against these, so each spelling speaks; the voice's
    own tag stays first for clients that keep the order (HA does not: docs/wyoming.md)."""
    out: dict[str, None] = {}
    for tag in languages:
        dashed = tag.replace("_", "-")
        out |= dict.fromkeys([tag, dashed, dashed.replace("-", "_"), dashed.split("-")[0]])
    return list(out)


# ---- a synthesis event's fields as a request's ---------------------------------------------


def parse(parser: Any, event: Event) -> Any:
    """The library's ``from_event``, with a malformed event as a ``bad_event`` error (the library
    takes a voice that is not an object, ``"voice": "x"``, as no voice: refused here)."""
    if not isinstance(event.data.get("voice") or {}, dict):
        raise RequestError("bad_event", f"{event.type}: voice must be an object")
    try:
        return parser(event)
    except (KeyError, TypeError, AttributeError, ValueError) as e:
        raise RequestError("bad_event", f"malformed {event.type} event: {e!r}") from None


def text_format(text_format: str | None) -> dict[str, str]:
    """``text_format: "ssml"`` makes the text SSML (docs/ssml.md); any other is plain text."""
    return {"format": "ssml"} if text_format == "ssml" else {}


def chime(event: Event) -> dict[str, Any]:
    """speakd's ``speakd_chime`` field as the request's ``chime``."""
    chime = event.data.get("speakd_chime")
    return {} if chime is None else {"chime": chime}


def pitch(event: Event) -> dict[str, Any]:
    """speakd's ``speakd_pitch`` field as the request's ``pitch`` (semitones)."""
    pitch = event.data.get("speakd_pitch")
    return {} if pitch is None else {"pitch": pitch}


def voice_fields(voice: SynthesizeVoice | None) -> dict[str, str]:
    """A Wyoming voice as request fields: ``name`` names the voice, ``speaker`` (Home
    Assistant's speaker option) a speaker inside it, and a language picks the voice by language
    (``Control.select_voice``)."""
    if voice is None:
        return {}
    fields: dict[str, Any] = {}
    if voice.name is not None:
        fields["voice"] = voice.name
    if voice.speaker is not None:
        fields["speaker"] = voice.speaker
    if voice.language is not None:
        fields["lang"] = voice.language
    return fields
