"""Pronunciation lexicons: a user's words said their way, one TOML file per language.

```toml
lang = "en"                  # applies to en, en-GB, en_US…; "en-gb" would apply to en-GB only

[replace]                    # word or phrase → the text to say instead
"nginx" = "engine x"
"SQL" = "sequel"

[phonemes]                   # word or phrase → IPA
"Nguyen" = "ŋwiən"
```

The rules (docs/ssml.md, "Lexicons"):

* **whole words**: where an entry begins or ends with a letter or digit, the character next to
  it must not be one. Chinese and Japanese have no spaces, so an edge that is a CJK character
  matches anywhere;
* **case**: an entry written in lower case matches any case ("nginx" matches "NGINX"); an entry
  with a capital matches exactly that spelling ("US" does not match "us");
* the longest entry wins where several match at one place, whitespace inside a phrase matches
  any run of whitespace, and what a replacement says is not looked up again;
* a ``[phonemes]`` entry becomes a phoneme segment: Piper voices say the IPA, an engine without
  phoneme input (ChatTTS) says the word as written.

The lexicon is applied before a request is prepared (``speakd.markup.plan``), so the audio key is
that of the text as said: an edited entry changes the key of the texts it applies to, and of no
other. ``digest(lang)`` hashes a language's entries (not the file's bytes: comments and order do
not count), for ``speakd status`` to show what a reload read.
"""

from __future__ import annotations

import hashlib
import re
import tomllib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from speakd.engines.keys import canonical_json
from speakd.markup.segments import Phonemes, Segment, Style, Text, speakable

_CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff"
_CJK_CHAR = re.compile(f"[{_CJK}]")
_TABLES = ("replace", "phonemes")
_PLAIN = Style()


class LexiconError(ValueError):
    """A lexicon file that cannot be used; the message names the file."""


@dataclass(frozen=True)
class Entry:
    word: str
    say: str  # the replacement text, or the IPA when ``ipa``
    ipa: bool


@dataclass(frozen=True)
class LanguageLexicon:
    """One file's entries, compiled into one pattern."""

    lang: str
    path: str
    exact: dict[str, Entry]  # entries with a capital, by their spelling
    folded: dict[str, Entry]  # lower-case entries, matching any case
    pattern: re.Pattern[str]
    digest: str

    @classmethod
    def read(cls, path: str | Path) -> LanguageLexicon:
        try:
            data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
        except OSError as e:
            raise LexiconError(f"lexicon {path}: {e.strerror}") from None
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
            raise LexiconError(f"lexicon {path}: not TOML: {e}") from None
        unknown = sorted(set(data) - {"lang", *_TABLES})
        if unknown:
            raise LexiconError(f"lexicon {path}: unknown keys {unknown} (lang, replace, phonemes)")
        lang = data.get("lang")
        if not isinstance(lang, str) or not lang.strip():
            raise LexiconError(f'lexicon {path}: lang = "<language code>" is required')
        entries: dict[str, Entry] = {}
        for table in _TABLES:
            words = data.get(table, {})
            if not isinstance(words, dict):
                raise LexiconError(f"lexicon {path}: [{table}] must be a table")
            for word, say in words.items():
                entry = _entry(path, table, word, say)
                if entry.word in entries:
                    raise LexiconError(f"lexicon {path}: {entry.word!r} is listed twice")
                entries[entry.word] = entry
        return cls.compile(_code(lang), str(path), entries.values())

    @classmethod
    def compile(cls, lang: str, path: str, entries: Iterable[Entry]) -> LanguageLexicon:
        exact = {e.word: e for e in entries if e.word != e.word.lower()}
        folded = {e.word: e for e in entries if e.word == e.word.lower()}
        # longest first; at one length an exact spelling before a case-blind one (see _lookup)
        ordered = sorted(
            [*((w, False) for w in exact), *((w, True) for w in folded)],
            key=lambda item: (-len(item[0]), item[1], item[0]),
        )
        alternatives = [_pattern(word, blind) for word, blind in ordered]
        pattern = re.compile("|".join(alternatives) if alternatives else r"(?!)")
        listed = sorted([e.word, e.say, e.ipa] for e in (*exact.values(), *folded.values()))
        material = canonical_json({"lang": lang, "entries": listed})
        digest = hashlib.sha256(material.encode()).hexdigest()
        return cls(lang, path, exact, folded, pattern, digest)

    def _lookup(self, matched: str) -> Entry | None:
        """None only where the regex's case folding is wider than ``str.lower`` ("ſ" ~ "s")."""
        word = " ".join(matched.split())
        return self.exact.get(word) or self.folded.get(word.lower())

    def apply(self, text: str, style: Style = _PLAIN) -> list[Text | Phonemes]:
        out: list[Text | Phonemes] = []
        pos = 0
        for m in self.pattern.finditer(text):
            entry = self._lookup(m.group(0))
            if entry is None:
                continue
            before = text[pos : m.start()]
            if entry.ipa:
                out += [Text(before, style), Phonemes(entry.say, m.group(0), style)]
            else:
                out.append(Text(before + entry.say, style))
            pos = m.end()
        out.append(Text(text[pos:], style))
        return _join(out)


def _entry(path: str | Path, table: str, word: object, say: object) -> Entry:
    if not isinstance(say, str) or not say.strip():
        raise LexiconError(f"lexicon {path}: [{table}] {word!r} must map to a non-empty string")
    word = " ".join(str(word).split())
    if not speakable(word):
        raise LexiconError(f"lexicon {path}: [{table}] {word!r} has no letter or digit")
    return Entry(word, say.strip(), ipa=table == "phonemes")


def _pattern(word: str, case_blind: bool) -> str:
    body = r"\s+".join(re.escape(part) for part in word.split(" "))
    # "not right after a letter or digit", where a CJK neighbour does not count as one
    before = "" if _CJK_CHAR.match(word[0]) or not word[0].isalnum() else rf"(?<![^\W{_CJK}])"
    after = "" if _CJK_CHAR.match(word[-1]) or not word[-1].isalnum() else rf"(?![^\W{_CJK}])"
    return f"{before}(?i:{body}){after}" if case_blind else f"{before}{body}{after}"


def _join(pieces: list[Text | Phonemes]) -> list[Text | Phonemes]:
    out: list[Text | Phonemes] = []
    for piece in pieces:
        last = out[-1] if out else None
        if isinstance(piece, Text) and isinstance(last, Text):
            out[-1] = Text(last.text + piece.text, piece.style)
        elif not (isinstance(piece, Text) and not piece.text):
            out.append(piece)
    return out


def _code(lang: str) -> str:
    return lang.strip().replace("_", "-").lower()


@dataclass(frozen=True)
class Lexicon:
    """The configured lexicons, one per language (``[lexicon] files``)."""

    languages: tuple[LanguageLexicon, ...] = ()

    @classmethod
    def load(cls, paths: Sequence[str | Path]) -> Lexicon:
        """Read every file; LexiconError names the first that cannot be used."""
        languages = [LanguageLexicon.read(p) for p in paths]
        seen: dict[str, str] = {}
        for lex in languages:
            if lex.lang in seen:
                raise LexiconError(
                    f"lexicons {seen[lex.lang]} and {lex.path} are both for {lex.lang!r}: "
                    "one file per language"
                )
            seen[lex.lang] = lex.path
        return cls(tuple(languages))

    def for_lang(self, lang: str | None) -> LanguageLexicon | None:
        """The lexicon for ``lang``: one for exactly that code, else one for its base language
        (an "en" lexicon applies to en-GB)."""
        if not lang:
            return None
        code = _code(lang)
        by_code = {lex.lang: lex for lex in self.languages}
        return by_code.get(code) or by_code.get(code.split("-")[0])

    def apply(self, text: str, lang: str | None, style: Style = _PLAIN) -> list[Text | Phonemes]:
        """``text`` with the entries of ``lang``'s lexicon applied: runs of text, and phonemes
        where a ``[phonemes]`` entry matched."""
        lex = self.for_lang(lang)
        return [Text(text, style)] if lex is None else lex.apply(text, style)

    def apply_segments(self, segments: Iterable[Segment], lang: str | None) -> list[Segment]:
        """Each text segment rewritten in its own language (its ``xml:lang``, else ``lang``)."""
        out: list[Segment] = []
        for seg in segments:
            if isinstance(seg, Text):
                out += self.apply(seg.text, seg.style.lang or lang, seg.style)
            else:
                out.append(seg)
        return out
