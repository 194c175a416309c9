"""Segments → the parts a request's audio is composed of (``speakd.request.compose``), and their
key.

Neighbouring text and phonemes of one voice, language and prosody are one part, prepared and keyed
like any plain request (so the same sentence in other markup, or sent as plain text, shares its
clip). Phonemes go inline as Piper's ``[[ … ]]`` to a voice that takes them (``phoneme_input``), and
as the word they stand for to one that does not. A mark is not a cut: inside a run of text it is
a position in that part (``Speech.marks``, placed by ``speakd.request.marks``), so a text with a
mark before every word is still one utterance with its own prosody, and its audio is the unmarked
text's; only a mark with no text around it is a marker part. A break is a silence, an
``<audio src>`` the sound of that name (``speakd.request.sounds``: a built-in chime or a pinned
clip), or, when there is none, its content (SSML's alternate text) or nothing, with an
``unknown_clip`` warning: the rest is spoken (docs/reliability.md, "Lenient input"). A request's
``chime`` is a sound before its parts (``with_chime``). The request's key hashes the parts' keys,
their marks and offsets, silences, markers and sounds in order: equal markup gives an equal key,
and any change of a part, a pause, a mark or a sound changes it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from speakd.audio.pitch import PITCH_RANGE, neutral, unavailable
from speakd.engines.base import SynthesisConfig
from speakd.engines.keys import canonical_json
from speakd.engines.sayas import guess_language
from speakd.markup.capitals import NO_CAPITALS, Capitals
from speakd.markup.lexicon import Lexicon
from speakd.markup.punctuation import NO_PUNCTUATION, Punctuation
from speakd.markup.segments import (
    Audio,
    Break,
    Mark,
    Phonemes,
    Segment,
    Style,
    Text,
    canonical,
    clean,
    speakable,
)
from speakd.markup.ssml import parse_ssml
from speakd.request.errors import InputWarning, RequestError
from speakd.request.prepare import (
    SPEED_RANGE,
    Marker,
    Part,
    Prepared,
    Silence,
    Sound,
    Speech,
    check_config,
)
from speakd.request.sounds import Sounds

if TYPE_CHECKING:
    from speakd.request.voices import VoiceLibrary

log = logging.getLogger(__name__)

PLAN_VERSION = 1
NO_LEXICON = Lexicon()

PrepareText = Callable[[str, SynthesisConfig], Prepared]
TakesPhonemes = Callable[[SynthesisConfig], bool]
FindSound = Callable[[str], Sound | None]
Warn = Callable[[InputWarning], None]


def _log_warning(warning: InputWarning) -> None:
    """Where no client listens (``speakd synth``, precompute), a warning is a log line."""
    log.warning("%s: %s", warning.code, warning.message)


def prepare_request(
    library: VoiceLibrary,
    text: str,
    config: SynthesisConfig,
    *,
    ssml: bool = False,
    lexicon: Lexicon = NO_LEXICON,
    punctuation: Punctuation = NO_PUNCTUATION,
    capitals: Capitals = NO_CAPITALS,
    strict_lang: bool = True,
    sounds: Sounds | None = None,
    warn: Warn = _log_warning,
) -> Prepared:
    """What a request means with its markup and the lexicon: SSML is parsed (``bad_ssml``), the
    lexicon applied to each run of text in its language, then the symbols of ``punctuation``
    said by name (``speakd.markup.punctuation``) and capitals marked (``speakd.markup.capitals``),
    an ``<audio src>`` found in ``sounds``
    (None: the built-in chimes only), the request's voice's clip first. Plain text whose lexicon
    entries only
    replace words stays plain text (its whitespace and line breaks kept), and markup that comes
    down to one run of plain text (``<speak>Hello</speak>``) is prepared as that text, with its
    key; anything else has parts. What is skipped (a speaker the voice lacks, a clip that does
    not exist, a pitch this machine cannot shift) goes to ``warn``."""
    check_config(config)  # before SSML's prosody is added to (and clamped with) its values
    voice, name, lang = library.select(config.voice, config.lang, strict=strict_lang)

    def prepare_text(said: str, c: SynthesisConfig) -> Prepared:
        if not neutral(c.pitch) and (why := unavailable()) is not None:  # prepare drops it
            warn(InputWarning("pitch_unavailable", f"spoken at the voice's own pitch ({why})"))
        return library.prepare(said, c, strict_lang=strict_lang)

    speaker, warning = library.speaker(voice, name, config.speaker)
    if warning is not None:
        warn(warning)
    config = dataclasses.replace(config, speaker=speaker)
    spoken = next(i for i in voice.model.voices() if i.name == name).languages
    lang = lang or _text_lang(spoken, text)
    if ssml:
        segments: list[Segment] = lexicon.apply_segments(parse_ssml(text, config.lang), lang)
    else:
        segments = list(lexicon.apply(text, lang))
    segments = punctuation.apply_segments(segments, lang)
    segments = capitals.apply_segments(segments, lang)
    if not ssml and all(isinstance(p, Text) for p in segments):
        said = "".join(p.text for p in segments if isinstance(p, Text))
        return prepare_text(said, config)
    sounds = sounds or Sounds(loudness=library.loudness)
    parts = plan(
        segments,
        config,
        prepare_text,
        lambda c: getattr(
            library.select(c.voice, c.lang, strict=False)[0].model, "phoneme_input", False
        ),
        lambda src: sounds.find(src, voice.model.bundle_id, name),
        warn,
    )
    if not parts:  # only clips that do not exist: nothing at all to say
        raise RequestError("unknown_clip", "the document has nothing to say but clips speakd lacks")
    speech = [p.prepared for p in parts if isinstance(p, Speech)]
    if len(parts) == 1 and speech and parts[0] == Speech(speech[0]):
        return speech[0]
    first = speech[0] if speech else None
    return Prepared(
        text,
        canonical(segments),
        first.config if first else config,
        plan_key(parts),
        first.bundle if first else voice.model.bundle_id,
        first.params if first else {},
        tuple(parts),
    )


def _text_lang(spoken: tuple[str, ...], text: str) -> str | None:
    """The language of a text for a voice that speaks ``spoken``: its one language, or of
    several the one the text looks like (CJK or not), else the first."""
    if len(spoken) <= 1:
        return spoken[0] if spoken else None
    looks = guess_language(text)
    return next((code for code in spoken if code.lower().startswith(looks)), spoken[0])


def plan(
    segments: Iterable[Segment],
    config: SynthesisConfig,
    prepare_text: PrepareText,
    takes_phonemes: TakesPhonemes = lambda config: False,
    find_sound: FindSound = lambda src: None,
    warn: Warn = _log_warning,
) -> list[Part]:
    """The parts of ``segments`` for a request of ``config``; ``prepare_text`` prepares one run
    of text (RequestError for a voice or language that does not exist), ``takes_phonemes`` says
    whether the voice a config chooses reads ``[[ phonemes ]]``, ``find_sound`` finds an
    ``<audio src>``'s sound by name, ``warn`` hears of one it does not find."""
    parts: list[Part] = []
    run: list[Text | Phonemes] = []
    marks: list[tuple[int, str]] = []  # the run's marks: (segments of the run before it, name)

    def flush() -> None:
        if run:
            style = run[0].style
            run_config = _config(config, style)
            inline = takes_phonemes(run_config)
            said = [_words(seg, inline) for seg in run]
            text = clean(" ".join(said))
            if speakable(text):
                at = tuple((len(clean(" ".join(said[:n]))), name) for n, name in marks)
                parts.append(Speech(prepare_text(text, run_config), style.volume, at))
                marks.clear()
            run.clear()
        parts.extend(Marker(name) for _, name in marks)  # no text to be a position in
        marks.clear()

    for seg in _flat(segments, find_sound, warn):
        if isinstance(seg, Text | Phonemes):
            if run and run[0].style != seg.style:
                ahead = [name for n, name in marks if n == len(run)]  # they precede this text
                del marks[len(marks) - len(ahead) :]
                flush()
                marks.extend((0, name) for name in ahead)
            run.append(seg)
        elif isinstance(seg, Mark):  # a position in the run, not a cut
            marks.append((len(run), seg.name))
        else:
            flush()
            parts.append(seg if isinstance(seg, Sound) else Silence(seg.ms))
    flush()
    return parts


def with_chime(prepared: Prepared, chime: Sound) -> Prepared:
    """The request with ``chime`` played before it: one composed stream
    (``speakd.request.compose``), gapless, keyed by its parts as marked-up text is; its text parts
    keep their own clips."""
    parts = (chime, *(prepared.parts or (Speech(prepared),)))
    return dataclasses.replace(prepared, parts=parts, key=plan_key(parts))


def plan_key(parts: Iterable[Part]) -> str:
    """The request's audio key: its parts' keys and volumes, silences, marks and sounds (their
    audio and loudness), in order."""
    material = [_material(p) for p in parts]
    return hashlib.sha256(
        canonical_json({"v": PLAN_VERSION, "parts": material}).encode()
    ).hexdigest()


def _material(part: Part) -> dict[str, object]:
    if isinstance(part, Speech):
        marks = {"marks": [list(m) for m in part.marks]} if part.marks else {}
        return {"key": part.prepared.key, "volume": part.volume, **marks}
    if isinstance(part, Silence):
        return {"silence": part.ms}
    if isinstance(part, Sound):
        return {"sound": part.key, "loudness": part.loudness}
    return {"mark": part.name}


def _flat(
    segments: Iterable[Segment], find_sound: FindSound, warn: Warn
) -> Iterable[Text | Phonemes | Break | Mark | Sound]:
    """An ``<audio>`` is its sound, or (told to ``warn``) its content when there is no such
    sound, or nothing."""
    for seg in segments:
        if not isinstance(seg, Audio):
            yield seg
            continue
        sound = find_sound(seg.src)
        if sound is not None:
            yield sound
            continue
        what = (
            f"<audio src={seg.src!r}>: no built-in chime or pinned clip has that name"
            if seg.src
            else "<audio> has no src"
        )
        instead = "its content is said instead" if seg.alt else "skipped"
        warn(InputWarning("unknown_clip", f"{what}; {instead}"))
        yield from _flat(seg.alt, find_sound, warn)


def _words(seg: Text | Phonemes, inline: bool) -> str:
    if isinstance(seg, Text):
        return seg.text
    return f"[[ {seg.ph} ]]" if inline and seg.ph else seg.text


def _config(config: SynthesisConfig, style: Style) -> SynthesisConfig:
    speed = (config.speed or 1.0) * style.rate
    return dataclasses.replace(
        config,
        voice=style.voice or config.voice,
        lang=style.lang or config.lang,
        speed=None if speed == 1.0 else min(max(speed, SPEED_RANGE[0]), SPEED_RANGE[1]),
        pitch=min(max((config.pitch or 0.0) + style.pitch, PITCH_RANGE[0]), PITCH_RANGE[1]),
    )
