"""ChatTTS text front-end: numbers and symbols spoken as words, ChatTTS's charset, splitting."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from speakd.engines.chattts.text import (
    SplitPolicy,
    detect_language,
    normalize,
    split_sentences,
    units,
)

# What ChatTTS lets through (norm.py reject pattern) once tags are removed.
_ALLOWED = re.compile(r"[\u4e00-\u9fffA-Za-z，。、,. ]*")


def _allowed(text: str) -> bool:
    return bool(_ALLOWED.fullmatch(re.sub(r"\[(uv_break|laugh|lbreak)\]", "", text)))


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("今天是12月2日。", "今天是十二月二日。"),
        ("2026-12-02是星期三", "二零二六年十二月二日是星期三"),
        ("2026年", "二零二六年"),
        ("会议14:30开始", "会议十四点三十分开始"),
        ("9:05出发", "九点零五分出发"),
        ("价格是¥35，或者$20，或者€5", "价格是三十五元，或者二十美元，或者五欧元"),
        ("增长了25%", "增长了百分之二十五"),
        ("重3.5 kg，跑了10 km，气温25°C", "重三点五千克，跑了十公里，气温二十五摄氏度"),
        ("温度-5℃", "温度负五摄氏度"),
        ("电话13800138000", "电话一三八零零一三八零零零"),
        ("第3名", "第三名"),
        ("占3/4", "占四分之三"),
        ("你好吗?", "你好吗。"),
        ("太好了！真的？", "太好了。真的。"),
    ],
)
def test_chinese(text: str, expected: str) -> None:
    assert normalize(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("It weighs 3.5 kg.", "It weighs three point five kilograms."),
        ("It costs $20.", "It costs twenty dollars."),
        ("It costs $20.50 or €5 or ¥35.",
         "It costs twenty dollars and fifty cents or five euros or thirty five yuan."),
        ("Run 10 km at 25°C", "Run ten kilometers at twenty five degrees Celsius"),
        ("Meet at 14:30 on 2026-12-02",
         "Meet at fourteen thirty on December second twenty twenty six"),
        ("1 kg and 1,234 people",
         "one kilogram and one thousand two hundred and thirty four people"),
        ("A 25% rise in 2026", "A twenty five percent rise in twenty twenty six"),
        ("the 2nd of 3", "the second of three"),
        ("Is it 0.05? Yes!", "Is it zero point zero five. Yes."),
        ("Tom & Jerry: 3-5 (wins)", "Tom and Jerry, three to five, wins"),
        ("don't stop", "dont stop"),
    ],
)  # fmt: skip
def test_english(text: str, expected: str) -> None:
    assert normalize(text) == expected


def test_word_tags_pass_through_and_control_tags_are_dropped() -> None:
    assert normalize("A [uv_break] test [laugh] here [lbreak].") == (
        "A [uv_break] test [laugh] here [lbreak]."
    )
    assert normalize("你好[uv_break]世界[laugh]。") == "你好[uv_break]世界[laugh]。"
    assert normalize("[Stts][spk_emb]hello [speed_9]world[Ptts]") == "hello world"


def test_language_detection_follows_chattts() -> None:
    assert detect_language("今天天气很好 ok") == "zh"
    assert detect_language("hello world 你") == "en"


def test_each_sentence_speaks_its_numbers_in_its_language() -> None:
    assert normalize("今天是12月2日。It costs $20.") == "今天是十二月二日。It costs twenty dollars."
    assert normalize("I paid $20. 我付了$20。") == "I paid twenty dollars. 我付了二十美元。"
    assert normalize("12月2日，3.5 kg，$20") == "十二月二日，三点五千克，二十美元"


def test_newlines_end_sentences() -> None:
    assert normalize("第一行\n第二行") == "第一行。第二行"
    assert split_sentences(normalize("Hello\nworld")) == ["Hello.", "world"]


def test_split_sentences_and_long_ones_at_commas() -> None:
    assert split_sentences("一。二三，四。") == ["一。", "二三，四。"]
    assert split_sentences("First one. Second one.") == ["First one.", "Second one."]
    long = "，".join(["一二三四五"] * 10) + "。"
    parts = split_sentences(long, SplitPolicy(max_units=12))
    assert "".join(parts) == long
    assert all(units(p) <= 12 for p in parts)
    assert all(p.endswith(("，", "。")) for p in parts)
    no_commas = "字" * 30
    parts = split_sentences(no_commas, SplitPolicy(max_units=12))
    assert "".join(parts) == no_commas and [units(p) for p in parts] == [12, 12, 6]


_PIECES = [*"0123456789 .,:;!?%$€¥-/°Ckgm年月日点你好abcXYZ\n[]_'", "[laugh]", "[speed_1]"]
_TEXT = st.lists(st.sampled_from(_PIECES), max_size=40).map("".join)


@settings(max_examples=300, deadline=None)
@given(_TEXT)
def test_output_is_speakable_and_idempotent(text: str) -> None:
    out = normalize(text)
    assert not re.search(r"\d", out), out
    assert _allowed(out), out
    assert normalize(out) == out
