"""The sentence splitter the Wyoming server cuts streamed text with
(speakd.frontends.wyoming.sentences)."""

from __future__ import annotations

import itertools
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from speakd.frontends.wyoming.sentences import SentenceSplitter


def split(pieces: list[str], max_chars: int = 5000) -> tuple[list[list[str]], list[str]]:
    """What each piece completed, and what ``finish`` returned."""
    splitter = SentenceSplitter(max_chars)
    return [splitter.feed(p) for p in pieces], splitter.finish()


def test_a_sentence_is_out_once_the_character_after_its_end_arrives() -> None:
    fed, rest = split(["Hel", "lo there.", " How a", "re you? Fine", " thanks."])
    assert fed == [[], [], ["Hello there."], ["How are you?"], []]
    assert rest == ["Fine thanks."]


@pytest.mark.parametrize(
    ("text", "sentences"),
    [
        (
            "Dr. Smith is in. Mr. J. R. Tolkien too. ",
            ["Dr. Smith is in.", "Mr. J. R. Tolkien too."],
        ),
        ("Use e.g. this one. Or i.e. that. ", ["Use e.g. this one.", "Or i.e. that."]),
        ("It costs 3.5 euros. In 1990. Then ", ["It costs 3.5 euros.", "In 1990."]),
        ('He said "Hi." Then left! Ok ', ['He said "Hi."', "Then left!"]),
        ("Wait... what?! No ", ["Wait...", "what?!"]),
        ("1. First item\n2. Second item\n", ["1. First item", "2. Second item"]),
        ("... Hm. ", ["... Hm."]),  # nothing speakable before: kept for what follows
        ("他说“你好。”然后走了。好", ["他说“你好。”", "然后走了。"]),
        ("Title\n\nBody text. ", ["Title", "Body text."]),
    ],
)
def test_sentence_ends(text: str, sentences: list[str]) -> None:
    fed, _ = split([text])
    assert fed == [sentences]


def test_no_sentence_is_longer_than_max_chars() -> None:
    fed, rest = split(["word " * 30, "tail"], max_chars=22)
    out = [s for piece in fed for s in piece] + rest
    assert all(len(s) <= 22 for s in out)
    assert " ".join(out).split() == ["word"] * 30 + ["tail"]
    fed, rest = split(["x" * 50], max_chars=20)  # no space at all: a hard cut
    assert fed == [["x" * 20, "x" * 20]] and rest == ["x" * 10]


def test_finish_drops_what_cannot_be_spoken() -> None:
    assert split(["Done. ", "  \n "])[1] == []
    assert split(["Done. ", "..."])[1] == []


@given(st.text(alphabet="ab .!?\n", max_size=200), st.lists(st.integers(0, 200), max_size=8))
def test_any_chunking_gives_the_same_sentences_and_loses_no_word(
    text: str, cuts: list[int]
) -> None:
    whole, whole_rest = split([text])
    bounds = sorted({0, len(text), *(c for c in cuts if c <= len(text))})
    fed, rest = split([text[a:b] for a, b in itertools.pairwise(bounds)])
    sentences = [s for piece in fed for s in piece] + rest
    assert sentences == whole[0] + whole_rest
    assert re.findall(r"\w+", " ".join(sentences)) == re.findall(r"\w+", text)


def test_a_cjk_stop_ends_its_sentence_at_once_a_latin_one_is_held() -> None:
    splitter = SentenceSplitter(5000)
    assert splitter.feed("你好。") == ["你好。"]  # nothing after 。 can change it
    assert splitter.feed("It is 3.") == [] and splitter.held()  # may still become 3.5
    assert splitter.feed("5 degrees.") == [] and splitter.held()
    assert splitter.release() == ["It is 3.5 degrees."] and not splitter.held()
    assert splitter.feed("Dr.") == [] and not splitter.held()  # an abbreviation ends nothing
    assert splitter.release() == []
    assert splitter.feed(" Who? ") == ["Dr. Who?"]
