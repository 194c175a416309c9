"""Pronunciation lexicons (speakd.markup.lexicon): whole words, the case rule, phrases, phonemes,
languages, the digest of the entries, and files it refuses."""

from __future__ import annotations

from pathlib import Path

import pytest

from speakd.markup.lexicon import Lexicon, LexiconError
from speakd.markup.segments import Break, Phonemes, Style, Text
from speakd.markup.ssml import parse_ssml

EN = """
lang = "en"

[replace]
"nginx" = "engine x"
"SQL" = "sequel"
"us" = "you and me"
"US" = "the United States"
"New York" = "the big apple"
"New" = "brand new"
"sequel" = "never looked up again"
"C++" = "C plus plus"

[phonemes]
"Nguyen" = "ŋwiən"
"""

ZH = """
lang = "zh"
[replace]
"长城" = "万里长城"
"GPU" = "显卡"
"""


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


@pytest.fixture
def lexicon(tmp_path: Path) -> Lexicon:
    return Lexicon.load([write(tmp_path, "en.toml", EN), write(tmp_path, "zh.toml", ZH)])


def said(lexicon: Lexicon, text: str, lang: str | None = "en") -> str:
    pieces = lexicon.apply(text, lang)
    assert all(isinstance(p, Text) for p in pieces), pieces
    return "".join(p.text for p in pieces)  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("I run nginx.", "I run engine x."),
        ("(nginx)", "(engine x)"),
        ("nginxy xnginx x_nginx 3nginx nginx2", "nginxy xnginx x_nginx 3nginx nginx2"),
        ("C++ and C++x", "C plus plus and C plus plusx"),  # only letter or digit edges are words
    ],
)
def test_entries_match_whole_words_only(lexicon: Lexicon, text: str, expected: str) -> None:
    assert said(lexicon, text) == expected


def test_a_lower_case_entry_matches_any_case(lexicon: Lexicon) -> None:
    assert said(lexicon, "NGINX, Nginx, nginx") == "engine x, engine x, engine x"


def test_an_entry_with_a_capital_matches_that_spelling_only(lexicon: Lexicon) -> None:
    assert said(lexicon, "SQL sql Sql") == "sequel sql Sql"
    assert said(lexicon, "US us Us") == "the United States you and me you and me"


def test_the_longest_entry_wins_and_a_phrase_spans_any_whitespace(lexicon: Lexicon) -> None:
    assert said(lexicon, "New York, New\n  York, new york, New car") == (
        "the big apple, the big apple, new york, brand new car"
    )


def test_a_replacement_is_not_looked_up_again(lexicon: Lexicon) -> None:
    assert said(lexicon, "SQL") == "sequel"  # "sequel" is an entry of its own


def test_phoneme_entries_become_phoneme_segments(lexicon: Lexicon) -> None:
    style = Style(rate=0.75)
    assert lexicon.apply("Mr Nguyen said nginx", "en", style) == [
        Text("Mr ", style),
        Phonemes("ŋwiən", "Nguyen", style),
        Text(" said engine x", style),
    ]


def test_cjk_entries_match_inside_text_without_spaces(lexicon: Lexicon) -> None:
    assert said(lexicon, "我们去长城吧，用GPU算", "zh") == "我们去万里长城吧，用显卡算"


def test_a_language_uses_its_own_file_or_its_base_languages(
    lexicon: Lexicon, tmp_path: Path
) -> None:
    assert said(lexicon, "nginx", "en-GB") == "engine x"
    assert said(lexicon, "nginx", "en_US") == "engine x"
    assert said(lexicon, "nginx", "zh") == "nginx"
    assert said(lexicon, "nginx", "de") == "nginx"
    assert said(lexicon, "nginx", None) == "nginx"
    gb = write(tmp_path, "gb.toml", 'lang = "en-GB"\n[replace]\n"nginx" = "engine ex"\n')
    both = Lexicon.load([write(tmp_path, "en.toml", EN), gb])
    assert said(both, "nginx", "en-gb") == "engine ex"
    assert said(both, "nginx", "en-us") == "engine x"


def test_segments_are_rewritten_in_their_own_language(lexicon: Lexicon) -> None:
    segments = parse_ssml(
        '<speak>nginx <break time="1s"/><lang xml:lang="zh">长城 nginx</lang> Nguyen</speak>'
    )
    assert lexicon.apply_segments(segments, "en") == [
        Text("engine x"),
        Break(1000),
        Text("万里长城 nginx", Style(lang="zh")),
        Phonemes("ŋwiən", "Nguyen"),
    ]


# ---- the digest status shows ----------------------------------------------------------------


def _digest(lexicon: Lexicon, lang: str) -> str:
    lex = lexicon.for_lang(lang)
    assert lex is not None
    return lex.digest


def test_the_digest_follows_the_entries_not_the_file(tmp_path: Path) -> None:
    def digest(text: str) -> str:
        return _digest(Lexicon.load([write(tmp_path, "en.toml", text)]), "en-GB")

    base = digest(EN)
    assert base is not None and len(base) == 64
    assert digest(EN.replace("[replace]", "[replace]\n# why\n")) == base
    assert digest(EN.replace('"engine x"', '"engine ex"')) != base
    assert digest(EN.replace('"Nguyen" = "ŋwiən"', '"Nguyen" = "ŋujən"')) != base
    assert digest(EN.replace('lang = "en"', 'lang = "en-gb"')) != base


def test_the_digest_ignores_the_order_of_entries(tmp_path: Path) -> None:
    a = Lexicon.load([write(tmp_path, "a.toml", 'lang="en"\n[replace]\na="x"\nb="y"\n')])
    b = Lexicon.load([write(tmp_path, "b.toml", 'lang="en"\n[replace]\nb="y"\na="x"\n')])
    assert _digest(a, "en") == _digest(b, "en")


def test_a_language_without_a_file_has_no_lexicon(lexicon: Lexicon) -> None:
    assert lexicon.for_lang("de") is None and lexicon.for_lang(None) is None
    assert Lexicon().for_lang("en") is None
    assert _digest(lexicon, "en") != _digest(lexicon, "zh")


def test_loading_again_picks_up_an_edit(tmp_path: Path) -> None:
    path = write(tmp_path, "en.toml", EN)
    before = Lexicon.load([path])
    path.write_text(EN.replace('"engine x"', '"engine ex"'), encoding="utf-8")
    after = Lexicon.load([path])
    assert said(after, "nginx") == "engine ex" and _digest(after, "en") != _digest(before, "en")


# ---- files it refuses ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ('[replace]\n"a" = "b"\n', "lang = "),
        ('lang = "en"\n[replace\n', "not TOML"),
        ('lang = "en"\n[words]\n"a" = "b"\n', "unknown keys ['words']"),
        ('lang = "en"\n[replace]\n"a" = ""\n', "non-empty string"),
        ('lang = "en"\n[replace]\n"a" = 3\n', "non-empty string"),
        ('lang = "en"\n[replace]\n"..." = "dots"\n', "no letter or digit"),
        ('lang = "en"\n[replace]\n"Ada" = "x"\n[phonemes]\n"Ada" = "ˈeɪdə"\n', "listed twice"),
        ('lang = "en"\n[replace]\n"new york" = "x"\n"new  york" = "y"\n', "listed twice"),
        ('lang = "en"\nreplace = "x"\n', "must be a table"),
    ],
)
def test_a_file_it_cannot_use_is_refused_with_its_name(
    tmp_path: Path, text: str, says: str
) -> None:
    path = write(tmp_path, "bad.toml", text)
    with pytest.raises(LexiconError) as info:
        Lexicon.load([path])
    assert says in str(info.value) and str(path) in str(info.value)


def test_a_missing_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(LexiconError, match=r"missing\.toml"):
        Lexicon.load([tmp_path / "missing.toml"])


def test_two_files_for_one_language_are_refused(tmp_path: Path) -> None:
    a, b = write(tmp_path, "a.toml", EN), write(tmp_path, "b.toml", 'lang = "EN"\n')
    with pytest.raises(LexiconError, match="one file per language"):
        Lexicon.load([a, b])
