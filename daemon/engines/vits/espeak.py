"""espeak-ng's clauses for Piper's phonemizer, with the GIL released while espeak-ng works.

``piper-tts`` reaches espeak-ng through its bridge, ``piper.espeakbridge``, whose ``get_phonemes``
converts a whole text in one C call that holds the GIL: 1–3 ms for a screen reader's line, 9 ms
for a 5 000-character text, and for that long no other thread of the daemon runs Python (the
event loop's key echo, CANCEL and ``701 BEGIN``, the play thread's writes). The bridge links
espeak-ng in and exports its API, so :class:`ReleasingBridge` calls the same library's
``espeak_TextToPhonemesWithTerminator`` through ctypes, which releases the GIL for each clause,
and takes ``initialize`` and ``set_voice`` from the bridge as they are.
:func:`install_releasing_bridge` puts it in the bridge's place for Piper's ``EspeakPhonemizer``,
which imports the bridge at each call: the phonemes are Piper's own handling (language flags,
punctuation, NFD, sentences, vowel clusters) of the same clauses, and tests/test_espeak.py holds
them equal. Where the library has no such symbol the bridge stays, and that is logged once.
"""

from __future__ import annotations

import ctypes
import importlib
import logging
from types import ModuleType

log = logging.getLogger(__name__)

CHARS_AUTO = 0  # espeak-ng's speak_lib.h: espeakCHARS_AUTO (UTF-8)
PHONEMES_IPA = 0x02  # espeakPHONEMES_IPA
FLAGS = 0x000FFFFF  # a terminator's clause type, intonation and pause; the rest are other flags
SENTENCE = 0x00080000  # CLAUSE_TYPE_SENTENCE
_CLAUSE = 0x00040000  # CLAUSE_TYPE_CLAUSE
_COMMA, _QUESTION, _EXCLAMATION = 0x1000, 0x2000, 0x3000  # CLAUSE_INTONATION_*
PUNCTUATION = {  # a terminator's flags → the punctuation the bridge gives for it
    40 | SENTENCE: ".",
    40 | _QUESTION | SENTENCE: "?",
    45 | _EXCLAMATION | SENTENCE: "!",
    20 | _COMMA | _CLAUSE: ",",
    30 | _CLAUSE: ":",
    30 | _COMMA | _CLAUSE: ";",
}


class ReleasingBridge:
    """``piper.espeakbridge`` with ``get_phonemes`` through ctypes; ``initialize`` and
    ``set_voice`` are the bridge's own (they run once per text, and briefly)."""

    def __init__(self, bridge: ModuleType) -> None:
        to_phonemes = ctypes.CDLL(bridge.__file__).espeak_TextToPhonemesWithTerminator
        to_phonemes.restype = ctypes.c_char_p
        to_phonemes.argtypes = [
            ctypes.POINTER(ctypes.c_void_p),
            ctypes.c_int,
            ctypes.c_int,
            ctypes.POINTER(ctypes.c_int),
        ]
        self._to_phonemes = to_phonemes
        self.bridge = bridge
        self.initialize = bridge.initialize
        self.set_voice = bridge.set_voice

    def get_phonemes(self, text: str) -> list[tuple[str, str, bool]]:
        """(phonemes, terminator, end of sentence) per clause, as the bridge gives them."""
        if "\0" in text:  # as the bridge's argument parsing refuses it
            raise ValueError("embedded null character")
        buffer = ctypes.create_string_buffer(text.encode())
        at = ctypes.c_void_p(ctypes.addressof(buffer))  # espeak-ng moves it on, NULL at the end
        terminator = ctypes.c_int()
        clauses = []
        while at.value is not None:
            phonemes = self._to_phonemes(
                ctypes.byref(at), CHARS_AUTO, PHONEMES_IPA, ctypes.byref(terminator)
            )
            flags = terminator.value & FLAGS
            said = (phonemes or b"").decode()
            clauses.append((said, PUNCTUATION.get(flags, ""), flags & SENTENCE == SENTENCE))
        return clauses


def install_releasing_bridge() -> bool:
    """Put a :class:`ReleasingBridge` over the bridge module (``sys.modules``'s, whatever
    ``piper.espeakbridge`` holds now) in ``piper.espeakbridge``'s place, once; False, logged,
    where the bridge's library has no ``espeak_TextToPhonemesWithTerminator``."""
    import piper

    bridge = importlib.import_module("piper.espeakbridge")
    if getattr(piper, "espeakbridge", None) is not bridge:  # replaced already
        return True
    try:
        piper.espeakbridge = ReleasingBridge(bridge)  # type: ignore[attr-defined]
    except (OSError, AttributeError) as e:
        log.warning("phonemes hold the GIL while espeak-ng works (piper's own bridge): %s", e)
        return False
    return True
