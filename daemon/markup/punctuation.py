"""Punctuation as speech-dispatcher reads it: symbols said by their names, per language.

A request's ``punctuation`` level (SSIP's ``SET SELF PUNCTUATION``) is ``none``, ``some``,
``most`` or ``all``; each symbol of a language's table (``daemon/data/symbols-<lang>.toml``,
English and Chinese) has one of the last three, and is said by its name when the request's level
is at least its own. At ``none`` (SSIP's default) nothing is named and the text goes to the voice
as written. ``important`` (the old ``SET SELF PUNCTUATION_IMPORTANT ".,;"``, which
speech-dispatcher's clients sent when the server let them choose the "some" set) replaces the
table's ``some`` symbols: those characters are named from ``some`` on, and the table's other
``some`` symbols from ``most`` on.

The text changes before the request is prepared (``speakd.markup.plan``, after the lexicon), so
the audio key is that of the text as said: "Hello, world." at ``all`` is the clip of "Hello
comma, world dot.", and a level that names nothing in a text keeps its clip. docs/ssml.md
("Punctuation") has the rules.
"""

from __future__ import annotations

import functools
import importlib.resources
import re
import tomllib
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass, replace

from speakd.engines.sayas import guess_language, language
from speakd.markup.segments import Segment, Text
from speakd.request.errors import RequestError

LEVELS = ("none", "some", "most", "all")
MAX_IMPORTANT = 64  # characters in ``important``


@dataclass(frozen=True)
class Symbol:
    name: str
    level: int  # index in LEVELS, 1..3
    keep: bool  # the symbol stays after its name (a full stop still ends the sentence)
    inword: bool  # named between two letters or digits too ("3.14" is not "3 dot 14")


@dataclass(frozen=True)
class SymbolTable:
    """One language's symbols (a TOML file in ``speakd/data``), compiled into one pattern."""

    spaced: bool  # names are set apart from words by spaces (English; not Chinese)
    symbols: dict[str, Symbol]
    pattern: re.Pattern[str]

    @classmethod
    def parse(cls, text: str) -> SymbolTable:
        data = tomllib.loads(text)
        symbols = {
            key: Symbol(
                entry["name"],
                LEVELS.index(entry["level"]),
                entry.get("keep", False),
                entry.get("inword", True),
            )
            for key, entry in data["symbols"].items()
        }
        longer = sorted((k for k in symbols if len(k) > 1), key=len, reverse=True)
        single = "".join(re.escape(k) for k in symbols if len(k) == 1)
        # a key of several characters, else a run of one symbol ("!!!" is named once)
        pattern = "|".join([*map(re.escape, longer), f"([{single}])\\1*"])
        return cls(bool(data["spaced"]), symbols, re.compile(pattern))


@functools.cache
def table(lang: str) -> SymbolTable:
    path = importlib.resources.files("speakd") / "data" / f"symbols-{lang}.toml"
    return SymbolTable.parse(path.read_text(encoding="utf-8"))


@dataclass(frozen=True)
class Punctuation:
    """A request's punctuation level and, optionally, its own ``some`` set."""

    level: str = "none"
    important: str | None = None

    @classmethod
    def of(cls, level: object, important: object = None) -> Punctuation:
        """The request fields ``punctuation`` and ``punctuation_important``, validated."""
        if level is None:
            level = "none"
        if not isinstance(level, str) or level.lower() not in LEVELS:
            raise RequestError("bad_field", f"punctuation must be one of {', '.join(LEVELS)}")
        if important is not None and (
            not isinstance(important, str) or len(important) > MAX_IMPORTANT
        ):
            raise RequestError(
                "bad_field",
                f"punctuation_important must be a string of at most {MAX_IMPORTANT} characters",
            )
        return cls(level.lower(), important)

    def _level_of(self, key: str, symbol: Symbol) -> int:
        if self.important is None:
            return symbol.level
        if key in self.important:
            return min(symbol.level, 1)
        return max(symbol.level, 2)

    def apply(self, text: str, lang: str | None) -> str:
        """``text`` with the symbols of this level said by name, in the table of ``lang`` (its
        base language: en-GB reads English; no language: the one the text looks like). A
        language without a table is left as written."""
        rank = LEVELS.index(self.level)
        if rank == 0:
            return text
        code = language(lang) if lang else guess_language(text)
        if code is None:
            return text
        symbols = table(code)
        gap = " " if symbols.spaced else ""
        out: list[str] = []
        pos = 0
        for m in symbols.pattern.finditer(text):
            key = m.group(0) if m.group(0) in symbols.symbols else m.group(0)[0]
            symbol = symbols.symbols[key]
            if self._level_of(key, symbol) > rank or (
                not symbol.inword and _in_word(text, m.start(), m.end())
            ):
                continue
            out.append(text[pos : m.start()])
            if not next((piece[-1] for piece in reversed(out) if piece), " ").isspace():
                out.append(gap)  # "Hello," → "Hello comma,"
            out += [symbol.name, m.group(0) if symbol.keep else ""]
            if m.end() < len(text) and text[m.end()].isalnum():
                out.append(gap)  # "#1" → "hash 1"
            pos = m.end()
        return "".join([*out, text[pos:]]).strip() if out else text

    def apply_segments(self, segments: Iterable[Segment], lang: str | None) -> list[Segment]:
        """Each run of text in its own language (its ``xml:lang``, else ``lang``); phonemes,
        breaks and marks as they are."""
        if self.level == "none":
            return list(segments)
        return [
            replace(seg, text=self.apply(seg.text, seg.style.lang or lang))
            if isinstance(seg, Text)
            else seg
            for seg in segments
        ]


NO_PUNCTUATION = Punctuation()


def _in_word(text: str, start: int, end: int) -> bool:
    """Between two letters or digits of a word (not CJK characters, which have no spaces)."""
    return start > 0 and end < len(text) and _word_char(text[start - 1]) and _word_char(text[end])


def _word_char(c: str) -> bool:
    return c.isalnum() and unicodedata.east_asian_width(c) not in ("W", "F")
