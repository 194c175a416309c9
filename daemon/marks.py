"""SSML marks as positions in one utterance: a mark's character offset → the sample it plays at.

A run of marked text is one part (``speakd.markup.plan``), synthesized whole with its natural
prosody; each mark is carried as an offset into the part's text. The engine's word timings
(``AudioChunk.words``: VITS's duration predictor, ``speakd.engines.vits_words``) say where each
word starts; a mark lands on the start of the first word whose text reaches the token the mark
precedes. ``Placer`` does this as the part's chunks come (a synthesis, or a cached clip with its
stored words), splitting a chunk at the mark's sample, so the composed stream notes the mark
before the piece it precedes (``AudioStream.mark``) and playback emits it when that sample is
reached. An engine that times sentences, not words (ChatTTS), names a sentence on an empty chunk
after it: the marks inside that sentence, and those before the next one, land there, at its end.
A mark no timing reaches (at the text's end, or an engine without timings) lands at the part's
end.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

from speakd.audio import AudioChunk, Word
from speakd.engines.vits_words import said_as, text_tokens

Marks = tuple[tuple[int, str], ...]  # (character offset into the part's text, name), in order
LOOKAHEAD = 4  # tokens a timing may skip (a dash espeak leaves unsaid) and still be found


class Placer:
    """The marks of one part's text, placed on its chunks in order."""

    def __init__(self, text: str, marks: Marks) -> None:
        self.tokens = [said_as(token) for token, _ in text_tokens(text)]
        # the index of the token each mark precedes
        self.pending = [(len(text_tokens(text[:offset])), name) for offset, name in marks]
        self.next_token = 0  # the first token no timing has covered yet

    def place(self, chunk: AudioChunk) -> Iterator[tuple[list[str], AudioChunk]]:
        """``chunk`` in pieces, each with the marks just before it."""
        cuts: list[tuple[int, str]] = []  # (sample in chunk, name)
        for word in chunk.words:
            # a sentence timed at its end reaches the next sentence's first token too
            reach = self._covers(word) + (word.start < 0)
            while self.pending and self.pending[0][0] <= reach:
                cuts.append((max(word.start, 0), self.pending.pop(0)[1]))
        start = 0
        names: list[str] = []
        for at, name in cuts:
            at = min(at, chunk.frames)
            if at > start:
                yield names, _slice(chunk, start, at)
                start, names = at, []
            names.append(name)
        if names or start < chunk.frames or not start:
            yield names, _slice(chunk, start, chunk.frames)

    def rest(self) -> list[str]:
        """The marks no timing reached: they go at the part's end."""
        names = [name for _, name in self.pending]
        self.pending.clear()
        return names

    def _covers(self, word: Word) -> int:
        """The last token of the text ``word`` says; its first is found from its first word
        (a few tokens on, when the engine left one unsaid), else taken as the next."""
        said = word.text.split() or [word.text]
        first = self.next_token
        window = self.tokens[first : first + LOOKAHEAD]
        if said[0] in window:
            first += window.index(said[0])
        last = first + len(said) - 1
        self.next_token = max(self.next_token, last + 1)
        return last


def _slice(chunk: AudioChunk, start: int, end: int) -> AudioChunk:
    """Samples [start, end) of ``chunk`` with the timings that start in them (a sentence's,
    timed back from the end of an empty chunk, with the last piece)."""
    width = chunk.sample_width * chunk.channels
    last = end == chunk.frames
    words = tuple(
        w.shifted(-start)
        for w in chunk.words
        if (w.start >= start or (last and w.start < 0)) and (w.start < end or last)
    )
    return dataclasses.replace(chunk, pcm=chunk.pcm[start * width : end * width], words=words)
