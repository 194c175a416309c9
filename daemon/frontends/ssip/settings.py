"""One SSIP client's settings (``SET SELF …``): their speechd defaults, validation and replies,
and how the ones speakd has a notion of become request fields (rate → speed, volume → gain,
language → ``lang``). The command handlers are in ``commands.py``, the framing in ``parser.py``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from speakd.audio.pitch import ssip_semitones
from speakd.frontends.ssip.parser import parse_int, reply
from speakd.request.messages import Priority

ERR_NOT_A_NUMBER = reply(511, "ERR PARAMETER NOT A NUMBER")
ERR_NOT_ON_OFF = reply(513, "ERR PARAMETER NOT ON OR OFF")
ERR_PARAMETER_INVALID = reply(514, "ERR PARAMETER INVALID")

VOICE_TYPES = (
    "male1",
    "male2",
    "male3",
    "female1",
    "female2",
    "female3",
    "child_male",
    "child_female",
)
# SET parameters: (reply code, reply text, "couldn't set" code and text for an unknown client id),
# as speech-dispatcher's msg.h words them.
SET_REPLIES: dict[str, tuple[int, str, int, str]] = {
    "language": (201, "OK LANGUAGE SET", 302, "ERR COULDNT SET LANGUAGE"),
    "rate": (203, "OK RATE SET", 303, "ERR COULDNT SET RATE"),
    "pitch": (204, "OK PITCH SET", 304, "ERR COULDNT SET PITCH"),
    "punctuation": (205, "OK PUNCTUATION SET", 305, "ERR COULDNT SET PUNCT MODE"),
    # libspeechd before 0.2 (and speechd's own punctuation.test) sent the "some" set; today's
    # speech-dispatcher answers 500: speakd takes it, with the PUNCTUATION replies
    "punctuation_important": (205, "OK PUNCTUATION SET", 305, "ERR COULDNT SET PUNCT MODE"),
    "cap_let_recogn": (
        206,
        "OK CAP LET RECOGNITION SET",
        306,
        "ERR COULDNT SET CAP LET RECOGNITION",
    ),
    "spelling": (207, "OK SPELLING SET", 308, "ERR COULDNT SET SPELLING"),
    "voice_type": (209, "OK VOICE SET", 309, "ERR COULDNT SET VOICE"),
    "synthesis_voice": (209, "OK VOICE SET", 309, "ERR COULDNT SET VOICE"),
    "output_module": (216, "OK OUTPUT MODULE SET", 312, "ERR COULDNT SET OUTPUT MODULE"),
    "pause_context": (217, "OK PAUSE CONTEXT SET", 313, "ERR COULDNT SET PAUSE CONTEXT"),
    "volume": (218, "OK VOLUME SET", 314, "ERR COULDNT SET VOLUME"),
    "ssml_mode": (219, "OK SSML MODE SET", 315, "ERR COULDNT SET SSML MODE"),
    "pitch_range": (263, "OK PITCH RANGE SET", 340, "ERR COULDNT SET PITCH RANGE"),
    # speakd's own: a sound before each SPEAK
    "chime": (280, "OK CHIME SET", 341, "ERR COULDNT SET CHIME"),
}
# Settings older libspeechd clients still send. Before speech-dispatcher 0.10 the voice type was
# ``SET … VOICE`` (and ``GET VOICE``); before 0.2 a client could load character, key, sound,
# spelling and punctuation tables, answered 215 (TEXT_TABLE: 299, accepted but inert). speakd
# answers as those releases did; the tables change nothing.
OBSOLETE_NAMES = {"voice": "voice_type"}
OBSOLETE_TABLES = {
    "spelling_table": (215, "OK TABLE SET"),
    "punctuation_table": (215, "OK TABLE SET"),
    "character_table": (215, "OK TABLE SET"),
    "key_table": (215, "OK TABLE SET"),
    "sound_table": (215, "OK TABLE SET"),
    "cap_let_recogn_table": (215, "OK TABLE SET"),
    "text_table": (299, "OK BUT NOT IMPLEMENTED -- DOES NOTHING"),
}
# −100..100 settings: (error code too high, too low, name in the error).
RANGES = {
    "rate": (409, 410, "RATE"),
    "pitch": (411, 412, "PITCH"),
    "volume": (413, 414, "VOLUME"),
    "pitch_range": (415, 416, "PITCH RANGE"),
}
ENUMS = {
    "punctuation": ("all", "most", "some", "none"),
    "cap_let_recogn": ("none", "spell", "icon"),
}


def rate_to_speed(rate: int) -> float | None:
    """SSIP rate −100..100 → speakd speed 0.25..4 (None at 0 keeps the bundle default)."""
    return None if rate == 0 else 2.0 ** (rate / 50)


def volume_to_gain(volume: int) -> float | None:
    """SSIP volume −100..100 → gain 0..1; 100 (speechd's default) is speakd's normal level."""
    return None if volume == 100 else (volume + 100) / 200


@dataclass
class Settings:
    """One client's ``SET`` state, with speechd's defaults."""

    priority: Priority = Priority.TEXT
    client_name: str = ""
    language: str = ""
    rate: int = 0
    pitch: int = 0
    pitch_range: int = 0
    volume: int = 100
    voice_type: str = "male1"
    synthesis_voice: str = ""
    output_module: str = ""
    punctuation: str = "none"
    punctuation_important: str | None = None  # the characters named at "some"; None: the table's
    cap_let_recogn: str = "none"
    spelling: bool = False
    ssml_mode: bool = False
    chime: str = ""  # a sound's name (speakd.request.sounds); "" none
    pause_context: int = 0
    notify: set[str] = field(default_factory=set)


def setting_value(sub: str, value: str) -> Any:
    """Validate a SET value → the value to store, or the error reply (bytes)."""
    if sub in RANGES or sub == "pause_context":
        number = parse_int(value)
        if number is None:
            return ERR_NOT_A_NUMBER
        if sub in RANGES:
            high, low, name = RANGES[sub]
            if number > 100:
                return reply(high, f"ERR {name} TOO HIGH")
            if number < -100:
                return reply(low, f"ERR {name} TOO LOW")
        return number
    if sub in ENUMS:
        value = value.lower()
        return value if value in ENUMS[sub] else ERR_PARAMETER_INVALID
    if sub in ("spelling", "ssml_mode"):
        value = value.lower()
        return ERR_NOT_ON_OFF if value not in ("on", "off") else value == "on"
    if sub == "voice_type":
        value = value.lower()
        return value if value in VOICE_TYPES else reply(309, "ERR COULDNT SET VOICE")
    if sub == "punctuation_important":  # SET SELF PUNCTUATION_IMPORTANT ".,;"; "" the table's
        chars = value[1:-1] if len(value) >= 2 and value[0] == value[-1] == '"' else value
        return chars or None
    if sub in ("language", "output_module"):
        return value.lower()
    if sub == "chime" and value.lower() == "none":
        return ""
    return value  # synthesis_voice and chime keep their case


def apply_setting(settings: Settings, sub: str, value: Any) -> None:
    if sub == "voice_type":  # as in speechd, a voice type replaces a synthesis voice
        settings.synthesis_voice = ""
    setattr(settings, sub, value)


def request_lang(language: str) -> str | None:
    """SSIP's LANGUAGE as a request's ``lang``; "C"/"POSIX" (no language) and unset are None."""
    value = language.strip()
    return None if value.lower() in ("", "c", "posix") else value


def request_fields(
    settings: Settings, text: str, voice: str | None, *, char: bool = False
) -> dict[str, Any]:
    """The request fields an SSIP message's ``text`` becomes under ``settings`` (``voice``: the
    SYNTHESIS_VOICE speakd knows, else None). SPEAK, CHAR and KEY go through here, and so does
    the key-echo prewarm (``keys``): its clips have the keys real messages ask for. A
    ``char`` (CHAR) names a symbol at every PUNCTUATION level, as speechd's CHAR does: a caret
    on a "." says "dot", not nothing."""
    fields = {
        "text": text,
        "priority": settings.priority.name.lower(),
        "voice": voice,
        "lang": request_lang(settings.language),
        "speed": rate_to_speed(settings.rate),
        "pitch": ssip_semitones(settings.pitch),
        "volume": volume_to_gain(settings.volume),
        "punctuation": "all" if char else settings.punctuation,
        "punctuation_important": settings.punctuation_important,
        "capitals": settings.cap_let_recogn,
    }
    return {k: v for k, v in fields.items() if v is not None}
