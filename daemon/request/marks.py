"""SSML marks as positions in one utterance: a mark's character offset → the sample it plays at.

A run of marked text is one part (``speakd.markup.plan``), synthesized whole with its natural
prosody; each mark is carried as an offset into the part's text. The engine's word timings
(``AudioChunk.words``: VITS's duration predictor, ``speakd.engines.vits.words``) say where each
word starts and which text it says; a mark lands on the start of the first word whose text
reaches past the mark's offset. ``Placer`` does this as the part's chunks come (a synthesis, or a
cached clip with its stored words), splitting a chunk at the mark's sample, so the composed
stream notes the mark before the piece it precedes (``AudioStream.mark``) and playback emits it
when that sample is reached. An engine that times sentences, not words (ChatTTS), names a
sentence on an empty chunk after it: the marks inside that sentence, and one right after it,
land there, at its end (from the cache, where the sentence's start is known, at its start). A
mark no timing reaches (at the text's end, or an engine without timings) lands at the part's end.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

from speakd.audio import AudioChunk, Word

Marks = tuple[tuple[int, str], ...]  # (character offset into the part's text, name), in order
SKIP = 32  # characters of text a timing may lie beyond the last (said otherwise, or not at all)


class Placer:
    """The marks of one part's text, placed on its chunks in order."""

    def __init__(self, text: str, marks: Marks) -> None:
        self.text = text
        self.pending = list(marks)
        self.cursor = 0  # where the text no timing has covered yet begins

    def place(self, chunk: AudioChunk) -> Iterator[tuple[list[str], AudioChunk]]:
        """``chunk`` in pieces, each with the marks just before it."""
        cuts: list[tuple[int, str]] = []  # (sample in chunk, name)
        for word in chunk.words:
            end = self._end(word)
            # a mark before ``end`` precedes what this timing says; a sentence timed at its end
            # (the start is known only then) also takes a mark right after it: the next's start
            reach = end - 1
            if word.start < 0:
                after = self.text[end:]
                reach = end + len(after) - len(after.lstrip())
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

    def _end(self, word: Word) -> int:
        """Where in the text what ``word`` says ends: its first and last pieces found from the
        cursor (a Piper word is its tokens without their punctuation, ``5:30`` or ``on the``),
        else, when the engine wrote it otherwise, as long as it is from the cursor."""
        pieces = word.text.split() or [word.text]
        first = self.text.find(pieces[0], self.cursor, self.cursor + SKIP + len(pieces[0]))
        if first < 0:
            end = self.cursor + len(word.text)
        else:
            window = first + len(word.text) + SKIP
            last = self.text.find(pieces[-1], first, window) if len(pieces) > 1 else first
            end = max(first, last) + len(pieces[-1])
        self.cursor = max(self.cursor, end)
        return end


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
