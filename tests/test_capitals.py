"""Capitals marked as espeak-ng marks them for Speech Dispatcher (``speakd.markup.capitals``)."""

from __future__ import annotations

import pytest

from speakd.markup.capitals import Capitals, spelled
from speakd.markup.segments import Audio, Mark, Style, Text
from speakd.request.errors import RequestError


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("T", "capital T"),
        ("Hello World", "capital Hello capital World"),
        ("NASA is big", "capital NASA is big"),
        ("McDonald", "capital Mc capital Donald"),
        ("no capitals, 42", "no capitals, 42"),
    ],
)
def test_spell_says_capital_before_each_capital_that_starts_a_run(text: str, said: str) -> None:
    assert spelled(text) == said


def test_spell_uses_the_runs_language() -> None:
    segments = [Text("A", Style(lang="zh-cn")), Mark("m"), Text("B")]
    assert Capitals.of("SPELL").apply_segments(segments, "en") == [
        Text("大写 A", Style(lang="zh-cn")),
        Mark("m"),
        Text("capital B"),
    ]


def test_icon_goes_before_each_capitalised_word_twice_for_one_in_capitals() -> None:
    segments = Capitals.of("icon").apply_segments([Text("say Hi to NASA, a T")], None)
    icon = Audio("capital")
    assert segments == [
        Text("say "),
        icon,
        Text("Hi to "),
        icon,
        icon,
        Text("NASA, a "),
        icon,
        Text("T"),
    ]


def test_none_and_bad_modes() -> None:
    segments = [Text("Hello")]
    assert Capitals.of(None).apply_segments(segments, None) == segments
    assert Capitals.of("none").apply_segments(segments, None) == segments
    with pytest.raises(RequestError, match="capitals must be one of none, spell, icon"):
        Capitals.of("loud")
