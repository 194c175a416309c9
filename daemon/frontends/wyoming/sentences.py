"""Sentences out of text that arrives in pieces (an LLM's answer streamed to the Wyoming server).

Each complete sentence becomes its own request, so the first is spoken while the rest is still
being written. A sentence ends at ``.``, ``!``, ``?`` or ``…`` (with any closing quotes or brackets)
followed by white space, at a CJK full stop (at once: nothing after it can change it), or at a line
break. After a Latin mark the next character must have arrived before the mark counts (``3.`` may
still become ``3.5``); a text that stops right after one is ``held``, and the front-end that fed it
``release``s it after a short hold when no more text came (an LLM pausing after a sentence). A
period after a common abbreviation (``Dr.``, ``e.g.``), an initial (``J.``) or a list number at the
start (``2.``) does not end a sentence, and a piece with no letter or digit in it (``...``) is kept
for the next one.

The engine splits a request's text into sentences again (``daemon/engines/chattts/text.py``
``split_sentences`` for ChatTTS, Piper's own for VITS); this module only decides what can be sent
before the rest of the text exists. No sentence is longer than ``max_chars``: a run of text without
an end is cut at the last space that fits (``limits.max_text_chars``, which every request obeys).
"""

from __future__ import annotations

import re

_CLOSERS = "\"'”’»)]}」』）"
_CLOSER = f"[{re.escape(_CLOSERS)}]*"
_END = re.compile(
    rf"[.!?…]+{_CLOSER}(?=\s)"  # Latin: the mark, then white space must have arrived
    rf"|[。！？]+{_CLOSER}"  # CJK: no space follows, and nothing after it changes it
    r"|\n",
    re.S,
)
_HELD = re.compile(rf"[.!?…]+{_CLOSER}$")  # a Latin end waiting for what comes after it
_SPEAKABLE = re.compile(r"\w")
_LIST_NUMBER = re.compile(r"\d{1,3}")
ABBREVIATIONS = frozenset(
    {"mr", "mrs", "ms", "dr", "prof", "sr", "jr", "st", "mt", "vs", "e.g", "i.e", "approx"}
    | {"fig", "inc", "ltd", "co", "vol", "ca", "cf"}
)


class SentenceSplitter:
    """Feed text as it comes; get back the sentences it completed, then the rest at ``finish``."""

    def __init__(self, max_chars: int) -> None:
        self.max_chars = max_chars
        self._buffer = ""

    def feed(self, text: str) -> list[str]:
        self._buffer += text
        out: list[str] = []
        start = 0
        for m in _END.finditer(self._buffer):
            head = self._buffer[start : m.start()]
            if not _ends_sentence(head, m.group()):
                continue
            sentence = self._buffer[start : m.end()].strip()
            if not _SPEAKABLE.search(sentence):
                continue  # "..." or a blank line: it goes with what follows
            out.extend(_cut(sentence, self.max_chars))
            start = m.end()
        self._buffer = self._buffer[start:]
        if len(self._buffer) > self.max_chars:  # no end in sight: speak what fits
            *done, self._buffer = _cut(self._buffer, self.max_chars, keep_tail=True)
            out.extend(done)
        return out

    def held(self) -> bool:
        """The text so far ends in a sentence mark that only waits for the next character."""
        m = _HELD.search(self._buffer)
        return (
            m is not None
            and _ends_sentence(self._buffer[: m.start()], m.group())
            and _SPEAKABLE.search(self._buffer) is not None
        )

    def release(self) -> list[str]:
        """A held end taken as the end, as if white space had come after it."""
        return self.feed(" ") if self.held() else []

    def finish(self) -> list[str]:
        """What is left when the text ends (its last sentence may lack a stop)."""
        rest, self._buffer = self._buffer.strip(), ""
        return _cut(rest, self.max_chars) if _SPEAKABLE.search(rest) else []


def _ends_sentence(head: str, mark: str) -> bool:
    """Whether ``mark`` after ``head`` (the text since the last sentence) ends a sentence."""
    if mark.rstrip(_CLOSERS) != ".":
        return True  # "!", "?", "...", a CJK stop, a line break
    words = head.split()
    word = words[-1].lstrip(_CLOSERS + "\"'“‘«([{") if words else ""
    if word.lower() in ABBREVIATIONS or (len(word) == 1 and word.isupper()):
        return False
    return not (len(words) == 1 and _LIST_NUMBER.fullmatch(word))


def _cut(text: str, max_chars: int, keep_tail: bool = False) -> list[str]:
    """``text`` in pieces of at most ``max_chars``, cut at spaces where there are any. With
    ``keep_tail`` the last piece is returned as it is (unstripped, possibly short): more may
    follow it."""
    pieces: list[str] = []
    while len(text) > max_chars:
        cut = text.rfind(" ", 1, max_chars + 1)
        if cut <= 0:
            cut = max_chars
        piece, text = text[:cut].strip(), text[cut:]
        if piece:
            pieces.append(piece)
    if keep_tail:
        return [*pieces, text]
    text = text.strip()
    return [*pieces, text] if text else pieces
