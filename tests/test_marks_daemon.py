"""SSML marks are positions, not cuts (issue 35): a real ``speakd serve`` with the embedded Piper
voice speaks a marked text as the unmarked text's one utterance, and each mark lands on the word
it precedes, over the JSON socket (``synth`` and a played ``say``) and over SSIP (Orca's shape:
``SSML_MODE on``, a mark before every word), with Speech Dispatcher's event order."""

from __future__ import annotations

import re
import string
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from speakd.audio import read_wav
from tests.daemon_proc import DaemonProc
from tests.http_daemon import HttpDaemon, start_http_daemon
from tests.ssip_harness import SsipClient
from tests.test_ssml_daemon import synth

RATE = 22050  # the embedded voice's
ORCA = '<speak><mark name="0:4"/>Name: <mark name="6:10"/>text</speak>'
SENTENCE = "The quick brown fox jumps over the lazy dog, then naps in the sun."
PUNCTUATION = string.punctuation + "—"
HARDER = (
    "Dr. Smith came at 5:30 on the dot — then left. It's $20, isn't it?"  # espeak's words differ
)


def every_word_marked(text: str) -> str:
    """Orca's say-all shape: a mark named ``start:end`` before each word."""
    marked = "".join(
        f'<mark name="{m.start()}:{m.end()}"/>{m.group()}{text[m.end() : m.end() + 1]}'
        for m in re.finditer(r"\S+", text)
    )
    return f"<speak>{marked}</speak>"


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory):
    d = start_http_daemon(tmp_path_factory.mktemp("marks"))
    yield d
    assert d.stop() == 0, d.proc.log_text()


@pytest.fixture
def daemon(served: HttpDaemon) -> DaemonProc:
    return served.proc


def snr_db(reference: np.ndarray, pcm: np.ndarray) -> float:
    assert len(pcm) == len(reference), (len(pcm), len(reference))
    ref, err = reference.astype(np.float64), reference.astype(np.float64) - pcm
    return float("inf") if not err.any() else 10 * np.log10((ref**2).sum() / (err**2).sum())


def assert_marks_on_words(text: str, marks: list[dict[str, Any]], words: list[dict[str, Any]]):
    """Each mark ``start:end`` within 50 ms of the onset of the word (timing) that says the
    token at text[start:end]; a token no word says (a dash) is the next word's."""
    k = 0
    for mark in marks:
        start, end = map(int, mark["name"].split(":"))
        token = text[start:end].strip(PUNCTUATION)
        if token:
            while token not in [w.strip(PUNCTUATION) for w in words[k]["word"].split()]:
                k += 1
        onset = words[k if token else k + 1]["start"]
        assert abs(mark["sample"] - onset) <= 0.05 * RATE, (mark, words[k])


@pytest.mark.parametrize("text", ["Name: text", SENTENCE, HARDER])
def test_a_marked_text_is_the_unmarked_audio_with_marks_on_its_words(
    daemon: DaemonProc, text: str
) -> None:
    document = ORCA if text == "Name: text" else every_word_marked(text)
    plain, plain_events = synth(daemon, text=text, words=True)
    marked, events = synth(daemon, text=document, format="ssml")
    assert snr_db(plain, marked) >= 40  # one utterance, not a list of words
    words = [e for e in plain_events if e["event"] == "word"]
    marks = [e for e in events if e["event"] == "mark"]
    assert_marks_on_words(text, marks, words)
    assert events[-1]["event"] == "finished"
    again, cached = synth(daemon, text=document, format="ssml")  # its clip from the cache
    assert np.array_equal(again, marked) and cached == [*events[:-1], cached[-1]]
    assert cached[-1]["cached"] is True
    with daemon.client() as c:  # what it will say: one run of text, the marks positions in it
        (part,) = c.request({"op": "explain", "text": document})["parts"]
    assert part["text"] == text and len(part["marks"]) == len(text.split())


def test_a_played_say_sends_started_then_marks_then_finished(daemon: DaemonProc) -> None:
    document = every_word_marked(SENTENCE)
    _, synthesized = synth(daemon, text=document, format="ssml")
    events = daemon.say(document, format="ssml", id="played")
    kinds = [e["event"] for e in events]
    marks = len(SENTENCE.split())
    assert kinds == ["queued", "started", *["mark"] * marks, "finished"], kinds
    assert [e["sample"] for e in events if e["event"] == "mark"] == [
        e["sample"] for e in synthesized if e["event"] == "mark"
    ]


@pytest.mark.parametrize("text", ["Name: text", SENTENCE])
def test_ssip_orca_marks_arrive_between_begin_and_end_on_the_words(
    served: HttpDaemon, text: str
) -> None:
    document = ORCA if text == "Name: text" else every_word_marked(text)
    plain, timed = synth(served.proc, text=text, words=True)
    _, synthesized = synth(served.proc, text=document, format="ssml")
    wav_dir = served.proc.config.parent / "wav"
    with SsipClient(served.proc.config.parent / "ssip.sock", timeout=30) as c:
        assert c.code("SET SELF NOTIFICATION all on") == 220
        assert c.code("SET SELF SSML_MODE on") == 219
        msg = c.speak(document)
        c.wait_event(702, msg, timeout=60)
        codes = c.event_codes(msg)
        names = [ev[2][4:] for ev in c.events if ev[0] == f"700-{msg}"]
    assert codes == [701, *[700] * len(text.split()), 702], codes
    marks = [e for e in synthesized if e["event"] == "mark"]
    assert names == [m["name"] for m in marks]
    assert_marks_on_words(text, marks, [e for e in timed if e["event"] == "word"])
    played = read_wav(Path(wav_dir) / f"ssip-{msg}.wav").samples()
    assert snr_db(plain, played) >= 40
