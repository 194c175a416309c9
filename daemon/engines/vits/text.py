"""Text to phonemes for Piper voices, as Piper makes them: espeak-ng through ``piper-tts``'s
phonemizer (global state: one caller at a time; the GIL released while espeak-ng works,
``speakd.engines.vits.espeak``), SSML's and a lexicon's raw ``[[ … ]]``
phonemes kept as written, and run-on sentences cut to what the voice's attention can take.
"""

from __future__ import annotations

import functools
import re
import threading
import unicodedata
from typing import Any

from speakd.engines.vits.espeak import install_releasing_bridge

_RAW_PHONEMES = re.compile(r"\[\[(.*?)\]\]", re.S)
_SENTENCE_STOP = re.compile(r"\s*([.!?])")
_espeak_lock = threading.Lock()  # espeak-ng keeps global state (voice, buffers)
_espeak: Any = None


def phonemize(
    espeak_voice: str, text: str, vowel_clusters: frozenset[tuple[str, ...]] | None
) -> list[list[str]]:
    """Phonemes per sentence, as Piper computes them (espeak-ng splits the sentences). As in
    Piper, ``[[ … ]]`` holds phonemes taken as written, inside the sentence around it: SSML's
    ``<phoneme>`` and a lexicon's IPA arrive so (``speakd.markup.plan``)."""
    global _espeak
    from piper.phonemize_espeak import EspeakPhonemizer

    parts = _RAW_PHONEMES.split(text)  # text, phonemes, text, …
    sentences: list[list[str]] = []
    with _espeak_lock:
        if _espeak is None:
            install_releasing_bridge()
            _espeak = EspeakPhonemizer()
        for i, part in enumerate(parts):
            if i % 2 == 0:
                stop = _SENTENCE_STOP.match(part) if i > 0 else None
                if stop:  # raw phonemes end their sentence: "… [[ ɪt ]]. Next"
                    sentences[-1].append(stop.group(1))
                    part = part[stop.end() :]
                said = _espeak.phonemize(espeak_voice, part, vowel_clusters=vowel_clusters)
                if i > 0 and not stop and said:  # the text after goes on with their sentence
                    sentences[-1].extend(said.pop(0))
                sentences.extend(said)
                continue
            if not sentences:
                sentences.append([])
            before = " " if parts[i - 1].endswith(" ") and sentences[-1] else ""
            after = " " if parts[i + 1].startswith(" ") else ""
            sentences[-1].extend([*before, *part.strip(), *after])
    return [sentence for sentence in sentences if sentence]


def speakable(phonemes: list[str]) -> bool:
    """True when a sentence holds a sound, not only stress marks, pauses and punctuation."""
    return any(unicodedata.category(p[0]) in ("Ll", "Lu", "Lo") for p in phonemes if p)


CLAUSE_WORDS = 4  # the fewest words a clause cut off a sentence has (``split_clauses``)


def split_clauses(phonemes: list[str], words: int = CLAUSE_WORDS) -> list[list[str]]:
    """Cut a sentence after its clause breaks (``, ; :`` + space) where the pieces on both
    sides have at least ``words`` words.

    The prior reads the whole of what it is given before the first window (its attention spans
    it), so a long sentence's first sound waits for all of it: say-all's 30-word first sentence
    starts some 50 ms later than its first clause would. Each piece ends at its punctuation, as
    the voice says it in the whole sentence; what changes is that a piece's intonation no longer
    sees the clauses after it (docs/vits-engine.md, "Clauses").
    """
    breaks = [
        i + 1
        for i in range(1, len(phonemes) - 1)
        if phonemes[i] in ",;:" and phonemes[i + 1] == " "
    ]
    pieces: list[list[str]] = []
    start = 0
    for cut in breaks:
        if _words(phonemes[start:cut]) >= words and _words(phonemes[cut:]) >= words:
            pieces.append(phonemes[start:cut])
            start = cut + 1  # the space after the break begins no piece
    pieces.append(phonemes[start:])
    return pieces


def _words(phonemes: list[str]) -> int:
    return len("".join(phonemes).split())


def split_long(phonemes: list[str], limit: int) -> list[list[str]]:
    """Cut a run-on sentence into pieces of at most ``limit`` phonemes.

    VITS's attention grows with the square of the input, so one 3000-character sentence takes
    minutes and gigabytes before its first sample. Cuts go after the last clause break
    (``, ; :`` + space) in the second half of the window, else after the last word, else at the
    limit.
    """
    pieces: list[list[str]] = []
    while len(phonemes) > limit:
        spaces = [i for i in range(limit - 1, 0, -1) if phonemes[i] == " "]
        clause = [i for i in spaces if i >= limit // 2 and phonemes[i - 1] in ",;:"]
        cut = (clause or spaces or [limit - 1])[0] + 1
        pieces.append(phonemes[:cut])
        phonemes = phonemes[cut:]
    pieces.append(phonemes)
    return pieces


CACHED_CHARS = 64  # a word; a client's text may hold 5 000 characters with no space


def phonemize_cached(
    espeak_voice: str, text: str, vowel_clusters: frozenset[tuple[str, ...]] | None
) -> list[list[str]]:
    """``phonemize``, remembered for texts of a word's length (4 096 of them, least recently used
    out): a token of thousands of characters was kept too, up to about a megabyte each."""
    if len(text) > CACHED_CHARS:
        return phonemize(espeak_voice, text, vowel_clusters)
    return _phonemize_word(espeak_voice, text, vowel_clusters)


@functools.lru_cache(maxsize=4096)
def _phonemize_word(
    espeak_voice: str, text: str, vowel_clusters: frozenset[tuple[str, ...]] | None
) -> list[list[str]]:
    return phonemize(espeak_voice, text, vowel_clusters)
