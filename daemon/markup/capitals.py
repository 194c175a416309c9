"""Capital letters as Speech Dispatcher's ``CAP_LET_RECOGN`` marks them (a request's ``capitals``).

Speech Dispatcher leaves this to its output module; its reference, espeak-ng (``espeakCAPITALS``),
does it over all the text a message says, a ``CHAR`` included:

- ``spell``: the word "capital" before each capital letter that does not follow another one
  ("capital Hello capital World", "capital NASA", "capital T");
- ``icon``: a sound before each word that starts with a capital, twice before a word of two or
  more letters in capitals. speakd's sound is the built-in ``capital`` (``speakd.request.sounds``);
- ``none`` (the default): the letters go to the voice as written.

The text changes before the request is prepared (``speakd.markup.plan``, after the punctuation),
so a capital said by name shares its clip with the same words typed out.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace

from speakd.markup.segments import Audio, Segment, Text
from speakd.request.errors import RequestError

MODES = ("none", "spell", "icon")
ICON = "capital"  # the built-in sound (speakd.request.sounds.ICONS)
SPOKEN = {"zh": "大写"}  # the word for "capital" by base language; English otherwise
_WORD = re.compile(r"[^\W\d_]+")


@dataclass(frozen=True)
class Capitals:
    mode: str = "none"

    @classmethod
    def of(cls, mode: object) -> Capitals:
        """A request's ``capitals`` (None: ``none``); ``bad_field`` names the modes."""
        if mode is None:
            return cls()
        if not isinstance(mode, str) or mode.lower() not in MODES:
            raise RequestError("bad_field", f"capitals must be one of {', '.join(MODES)}")
        return cls(mode.lower())

    def apply_segments(self, segments: Iterable[Segment], lang: str | None) -> list[Segment]:
        """Each run of text marked in its own language; other segments as they are."""
        if self.mode == "none":
            return list(segments)
        out: list[Segment] = []
        for seg in segments:
            if not isinstance(seg, Text):
                out.append(seg)
            elif self.mode == "spell":
                word = SPOKEN.get((seg.style.lang or lang or "en")[:2].lower(), "capital")
                out.append(replace(seg, text=spelled(seg.text, word)))
            else:
                out.extend(_with_icons(seg))
        return out


def spelled(text: str, word: str = "capital") -> str:
    """``word`` before each capital letter that does not follow another capital."""
    out: list[str] = []
    previous = ""
    for c in text:
        if c.isupper() and not previous.isupper():
            out.append(f"{word} " if not out or out[-1].isspace() else f" {word} ")
        out.append(c)
        previous = c
    return "".join(out)


def _with_icons(seg: Text) -> Iterator[Segment]:
    """The text cut before each word that starts with a capital, the icon in the cut."""
    start = 0
    for m in _WORD.finditer(seg.text):
        word = m.group()
        if not word[0].isupper():
            continue
        if m.start() > start:
            yield replace(seg, text=seg.text[start : m.start()])
        yield Audio(ICON)
        if len(word) > 1 and word.isupper():
            yield Audio(ICON)
        start = m.start()
    if start < len(seg.text):
        yield replace(seg, text=seg.text[start:])


NO_CAPITALS = Capitals()
