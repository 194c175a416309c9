"""Which phonemes of a Piper sentence say which word of the text, and when (word timings).

espeak-ng marks its word boundaries with ``" "`` phonemes, but its words are not always the
text's: it expands numbers, symbols and abbreviations into several words (``5:30`` → *five
thirty*, ``$20`` → *twenty dollars*), joins some function words (``on the`` → ``ɔnðə``), and
starts a new sentence after an abbreviation's stop (``Dr. Smith``). So each text token is
phonemized alone too (cached), and the two phoneme strings, stress marks and punctuation
removed, are aligned character by character (``difflib``), one sentence at a time
(``WordAligner``). A phoneme word belongs to the tokens its matched characters come from; runs
of phoneme words that share tokens make one ``WordSpan`` (``5:30`` is one word spanning *five
thirty*; ``on the`` one spanning ``ɔnðə``). A phoneme word with no matched character (said
otherwise alone: *a* is ``ɐ`` in a sentence, ``eɪ`` alone) takes the next token not yet spoken
when the word after it does not claim that token, else it joins the word before it. A span
never crosses a sentence, whose durations come from its own run; a token espeak left unsaid
(``—``) has no span.

The duration predictor gives frames per phoneme id (``speakd.engines.vits.split.Latents``);
Piper's ids are ``^ _ (phoneme _)* $``, so phoneme ``j`` is id ``2 + 2j`` and a word runs from
its first phoneme's id to the pad after its last. ``length_scale`` (the speed) is already in
the frames.
"""

from __future__ import annotations

import difflib
import re
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from speakd.audio import Word

WORD_BREAK = " "
_RAW_PHONEMES = re.compile(r"(\[\[.*?\]\])", re.S)
_PUNCTUATION = "".join(
    chr(c) for c in range(0x2100) if unicodedata.category(chr(c)).startswith("P")
)

Phonemize = Callable[[str], list[list[str]]]


@dataclass(frozen=True)
class WordSpan:
    """A text word and the phonemes [first, end) of its sentence that say it."""

    text: str
    first: int
    end: int


def _sounds(phonemes: str) -> str:
    """The letters of a phoneme string: no stress marks, length marks or punctuation."""
    return "".join(p for p in phonemes if unicodedata.category(p) in ("Ll", "Lu", "Lo"))


def _tokens(text: str) -> list[tuple[str, str | None]]:
    """(word as written, its phonemes when written as ``[[ … ]]``, else None)."""
    tokens: list[tuple[str, str | None]] = []
    for i, part in enumerate(_RAW_PHONEMES.split(text)):
        if i % 2:
            tokens.extend((group, group) for group in part[2:-2].split())
        else:
            tokens.extend((token, None) for token in part.split())
    return tokens


class WordAligner:
    """The words of one text, sentence by sentence as the engine runs them (``spans``, in order):
    each sentence is aligned with the tokens after those already spoken, a window of twice its
    phoneme words and a few more, so the work grows with the text, not with its square."""

    def __init__(self, text: str, phonemize: Phonemize) -> None:
        self.tokens = _tokens(text)
        self._phonemize = phonemize  # one token alone
        self._said: dict[int, str] = {}
        self.done = -1  # tokens up to here are spoken by earlier spans

    def spans(self, phonemes: list[str]) -> list[WordSpan]:
        """The words of the next sentence, as phonemes espeak made of it."""
        pieces: list[tuple[int, int, str]] = []  # phoneme words: first, end, sounds
        start = 0
        for j in range(len(phonemes) + 1):
            if j == len(phonemes) or phonemes[j] == WORD_BREAK:
                sounds = _sounds("".join(phonemes[start:j]))
                if sounds:
                    pieces.append((start, j, sounds))
                start = j + 1
        if not pieces:
            return []
        first_token = self.done + 1
        window = range(first_token, min(len(self.tokens), first_token + 2 * len(pieces) + 8))
        said, owner_said = _concat([self._sounds_of(t) for t in window])
        heard, owner_heard = _concat([sounds for *_, sounds in pieces])
        owners: list[set[int]] = [set() for _ in pieces]
        matcher = difflib.SequenceMatcher(None, said, heard, autojunk=False)
        for a, b, size in matcher.get_matching_blocks():
            for k in range(size):
                owners[owner_heard[b + k]].add(first_token + owner_said[a + k])
        spans: list[WordSpan] = []
        group: list[int] = []  # [first phoneme, end phoneme, lo token, hi token]
        done = self.done
        for k, (first, end, _) in enumerate(pieces):
            tok = {t for t in owners[k] if t > done}
            lo, hi = (min(tok), max(tok)) if tok else (-1, -1)
            if not owners[k]:  # nothing matched: the next token, unless the next word says it
                ahead = min(owners[k + 1], default=len(self.tokens)) if k + 1 < len(pieces) else -1
                nxt = max(done, group[3] if group else -1) + 1
                if nxt < len(self.tokens) and (ahead < 0 or ahead > nxt):
                    lo = hi = nxt
            if group and (lo < 0 or lo <= group[3]):
                group[1], group[3] = end, max(group[3], hi)
                continue
            if group:
                spans.append(self._span(group))
                done = max(done, group[3])
            if lo < 0:  # already spoken, yet in a sentence of its own: said again
                lo = hi = max(0, done)
            group = [first, end, lo, hi]
        spans.append(self._span(group))
        self.done = max(done, group[3])
        return spans

    def _sounds_of(self, t: int) -> str:
        if t not in self._said:
            token, raw = self.tokens[t]
            self._said[t] = raw if raw is not None else _alone(self._phonemize, token)
        return self._said[t]

    def _span(self, group: list[int]) -> WordSpan:
        first, end, lo, hi = group
        words = [token.strip(_PUNCTUATION) or token for token, _ in self.tokens[lo : hi + 1]]
        return WordSpan(" ".join(words), first, end)


def _concat(parts: list[str]) -> tuple[str, list[int]]:
    """The parts joined, and which part each character came from."""
    return "".join(parts), [i for i, part in enumerate(parts) for _ in part]


def _alone(phonemize: Phonemize, token: str) -> str:
    return _sounds("".join("".join(s) for s in phonemize(token)))


def timings(spans: list[WordSpan], id_samples: np.ndarray) -> list[Word]:
    """The spans in samples from the sentence's start, from the samples per phoneme id."""
    edges = np.concatenate([[0], np.cumsum(id_samples)])
    return [
        Word(span.text, int(edges[2 + 2 * span.first]), int(edges[2 + 2 * span.end]))
        for span in spans
    ]
