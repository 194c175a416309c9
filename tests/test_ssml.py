"""The SSML subset (speakd.markup.ssml): segments, positions of errors, refused XML attacks,
canonical form, say-as in English and Chinese."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from speakd.markup.segments import Audio, Break, Mark, Phonemes, Style, Text, canonical
from speakd.markup.ssml import MAX_BREAK_MS, MAX_DEPTH, SsmlError, is_ssml, parse_ssml
from speakd.request.messages import RequestError


def texts(document: str, lang: str | None = None) -> list[str]:
    return [s.text for s in parse_ssml(document, lang) if isinstance(s, Text)]


def failure(document: str) -> SsmlError:
    with pytest.raises(SsmlError) as info:
        parse_ssml(document)
    assert info.value.code == "bad_ssml"
    return info.value


def test_the_issue_example_is_text_a_break_text_and_a_mark() -> None:
    segments = parse_ssml('<speak>Door <break time="700ms"/> open<mark name="m"/>.</speak>')
    assert segments == [Text("Door"), Break(700), Text("open"), Mark("m"), Text(".")]


def test_every_element_of_the_subset() -> None:
    segments = parse_ssml(
        """<speak xml:lang="en-US">
          <p><s>Floor <say-as interpret-as="cardinal">12</say-as></s><s>Mind the gap</s></p>
          <prosody rate="slow" volume="+6dB" pitch="+2st">slowly</prosody>
          <sub alias="World Wide Web">WWW</sub>
          <phoneme alphabet="ipa" ph="təˈmɑːtoʊ">tomato</phoneme>
          <voice name="amy">Hi</voice>
          <audio src="ding">ding dong</audio>
          <lang xml:lang="zh">你好</lang>
        </speak>"""
    )
    en = Style(lang="en-us")
    assert segments == [
        Text("Floor twelve. Mind the gap.", en),
        Text("slowly", Style(lang="en-us", rate=0.75, volume=1.995, pitch=2.0)),
        Text("World Wide Web", en),
        Phonemes("təˈmɑːtoʊ", "tomato", en),
        Text("Hi", Style(voice="amy", lang="en-us")),
        Audio("ding", (Text("ding dong", en),)),
        Text("你好", Style(lang="zh")),
    ]


# ---- errors with their position --------------------------------------------------------------


@pytest.mark.parametrize(
    ("document", "line", "column", "says"),
    [
        ("<speak>\n  <p>open\n</speak>", 3, 3, "mismatched tag"),
        ("<speak>Tom & Jerry</speak>", 1, 13, "not XML: not well-formed"),
        ("<speak>fine", 1, 12, "no element found"),
        ("plain text", 1, 1, "syntax error"),
        ('<speak>\n<break time="5 minutes"/></speak>', 2, 1, "<break>: time"),
        ('<speak>a<break time="11s"/></speak>', 1, 9, f"at most {MAX_BREAK_MS} ms"),
        ('<speak><break strength="huge"/></speak>', 1, 8, "strength must be one of"),
        ('<speak>\n\n   <prosody rate="warp">x</prosody></speak>', 3, 4, "rate must be"),
        ('<speak><prosody volume="50">x</prosody></speak>', 1, 8, "volume must be"),
        ('<speak><prosody pitch="2 octaves">x</prosody></speak>', 1, 8, "pitch must be"),
        ("<speak>a<mark/></speak>", 1, 9, "<mark>: name is required"),
        ('<speak><phoneme alphabet="ipa">x</phoneme></speak>', 1, 8, "<phoneme>: ph"),
        ("<html><speak>x</speak></html>", 1, 1, "not <speak>"),
    ],
)
def test_a_document_it_cannot_read_is_bad_ssml_with_line_and_column(
    document: str, line: int, column: int, says: str
) -> None:
    error = failure(document)
    assert (error.line, error.column) == (line, column), str(error)
    assert says in str(error) and f"(line {line}, column {column})" in str(error)


def test_a_document_with_nothing_to_say_is_empty_text() -> None:
    with pytest.raises(RequestError) as info:
        parse_ssml("<speak> <p> , </p> <mark name='x'/> </speak>".replace("<mark name='x'/>", ""))
    assert info.value.code == "empty_text"


# ---- XML attacks are refused where they start --------------------------------------------------

BILLION_LAUGHS = (
    '<?xml version="1.0"?>\n<!DOCTYPE speak [\n <!ENTITY lol "lol">\n'
    + "".join(
        f' <!ENTITY lol{i} "{("&lol" + str(i - 1 if i > 1 else "") + ";") * 10}">\n'
        for i in range(1, 10)
    )
    + "]>\n<speak>&lol9;</speak>"
)


def test_a_billion_laughs_is_refused_at_its_first_entity_declaration() -> None:
    """Refused where the first ``<!ENTITY`` stands (line 3), before any expansion: expanded, the
    document would be 10**9 "lol"s (3 GB), far past the test's timeout and memory."""
    error = failure(BILLION_LAUGHS)
    assert "entity declarations are not allowed (<!ENTITY lol>)" in str(error)
    assert error.line == 3


def test_a_single_entity_is_refused_too() -> None:
    error = failure('<!DOCTYPE speak [<!ENTITY a "aaaa">]><speak>&a;&a;</speak>')
    assert "entity declarations are not allowed" in str(error)


def test_an_external_entity_is_refused() -> None:
    error = failure('<!DOCTYPE speak SYSTEM "file:///etc/passwd"><speak>&x;</speak>')
    assert error.code == "bad_ssml"


def test_a_doctype_without_entities_is_read() -> None:
    assert texts("<!DOCTYPE speak><speak>Hello</speak>") == ["Hello"]


def test_nesting_is_limited_at_the_element_past_the_limit() -> None:
    ok = "<speak>" + "<p>" * (MAX_DEPTH - 1) + "x" + "</p>" * (MAX_DEPTH - 1) + "</speak>"
    assert texts(ok) == ["x."]
    deep = "<speak>" + "<p>" * MAX_DEPTH + "x" + "</p>" * MAX_DEPTH + "</speak>"
    error = failure(deep)
    assert "nested deeper" in str(error)
    assert error.column == len("<speak>") + 3 * (MAX_DEPTH - 1) + 1


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.sampled_from([*"<>/=\"'&;! ?xspeakbrm:#[]-", "é", "中"])))
def test_any_input_is_segments_or_a_request_error(document: str) -> None:
    try:
        parse_ssml("<speak>" + document)
    except RequestError as e:
        assert e.code in ("bad_ssml", "empty_text")


# ---- unknown elements, canonical form ------------------------------------------------------------


def test_unknown_elements_keep_their_text_and_the_subset_inside_them() -> None:
    segments = parse_ssml(
        '<speak>Hello <emphasis level="strong">big <break time="1s"/>wide</emphasis> '
        '<x:y xmlns:x="urn:other">world</x:y> <prosody rate="fast" foo="bar">now</prosody></speak>'
    )
    assert segments == [
        Text("Hello big"),
        Break(1000),
        Text("wide world"),
        Text("now", Style(rate=1.25)),
    ]


EQUIVALENT = [
    '<speak>Hello <break time="500ms"/> world <mark name="m"/>again</speak>',
    '<speak>\n  Hello\n  <break time="0.5s"/>\n  world<mark   name="m" />  again  </speak>',
    '<?xml version="1.0"?><speak version="1.1" xmlns="http://www.w3.org/2001/10/synthesis">'
    'Hello<break time=" 500 ms "/>world<mark name="m"/>again</speak>',
    '<speak>Hello<break time="200ms"/><break time="300ms"/>world<mark name="m"/>again</speak>',
]


def test_equivalent_markup_has_one_canonical_form() -> None:
    forms = {canonical(parse_ssml(doc)) for doc in EQUIVALENT}
    assert len(forms) == 1, forms


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ('<prosody rate="slow" volume="loud">x</prosody>',
         '<prosody volume="loud" rate="75%">x</prosody>'),
        ("<s>One</s><s>Two</s>", "<s>One.</s> <s>Two.</s>"),
        ('<voice name="amy" xml:lang="en-GB">x</voice>',
         '<voice xml:lang="en_gb" name="amy">x</voice>'),
        ('<prosody rate="1.5">x</prosody>', '<prosody rate="150%">x</prosody>'),
        ('<prosody pitch="+0st">x</prosody>', "x"),
    ],
)  # fmt: skip
def test_equal_meaning_gives_equal_canonical_form(a: str, b: str) -> None:
    assert canonical(parse_ssml(f"<speak>{a}</speak>")) == canonical(
        parse_ssml(f"<speak>{b}</speak>")
    )


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ('a<break time="500ms"/>b', 'a<break time="600ms"/>b'),
        ('a<mark name="m"/>b', 'a<mark name="n"/>b'),
        ('<prosody rate="slow">a</prosody>', "a"),
        ('<voice name="amy">a</voice>', "a"),
        ("a b", "a<break/>b"),
    ],
)
def test_different_meaning_gives_different_canonical_form(a: str, b: str) -> None:
    assert canonical(parse_ssml(f"<speak>{a}</speak>")) != canonical(
        parse_ssml(f"<speak>{b}</speak>")
    )


# ---- breaks and prosody --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("attrs", "ms"),
    [('time="1.5s"', 1500), ('time="250ms"', 250), ('strength="x-weak"', 100),
     ('strength="strong"', 700), ("", 400), ('time="80ms" strength="x-strong"', 80)],
)  # fmt: skip
def test_break_durations(attrs: str, ms: int) -> None:
    assert parse_ssml(f"<speak>a<break {attrs}/>b</speak>")[1] == Break(ms)


def test_a_break_of_strength_none_is_no_segment() -> None:
    assert parse_ssml('<speak>a<break strength="none"/>b</speak>') == [Text("a b")]


@pytest.mark.parametrize(
    ("pitch", "semitones"), [("240Hz", 12.0), ("60Hz", -12.0), ("+12Hz", 1.65), ("-12Hz", -1.82)]
)
def test_prosody_pitch_in_hz_is_semitones_against_a_typical_voice(
    pitch: str, semitones: float
) -> None:
    (run,) = parse_ssml(f'<speak><prosody pitch="{pitch}">a</prosody></speak>')
    assert run.style.pitch == semitones


def test_nested_prosody_multiplies_rate_and_volume_and_adds_pitch() -> None:
    [outer, inner, reset] = parse_ssml(
        '<speak><prosody rate="50%" volume="-6dB" pitch="-2st">a'
        '<prosody rate="+50%" volume="+6dB" pitch="x-high">b</prosody>'
        '<prosody rate="default" volume="default" pitch="default">c</prosody></prosody></speak>'
    )
    assert outer.style == Style(rate=0.5, volume=0.501, pitch=-2.0)
    assert inner.style == Style(rate=0.75, volume=1.0, pitch=6.0)
    assert reset.style == Style()


def test_prosody_is_clamped_to_what_the_daemon_can_play() -> None:
    [fast, loud] = parse_ssml(
        '<speak><prosody rate="10">a</prosody><prosody volume="+40dB">b</prosody></speak>'
    )
    assert fast.style.rate == 4.0 and loud.style.volume == 4.0


def test_silent_is_volume_zero() -> None:
    assert parse_ssml('<speak><prosody volume="silent">a</prosody></speak>')[0].style.volume == 0


# ---- say-as, sub, phoneme, voice -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "content", "fmt", "en", "zh"),
    [
        ("cardinal", "1,234", None, "one thousand two hundred and thirty-four", "一千二百三十四"),
        ("cardinal", "-3.25", None, "minus three point two five", "负三点二五"),
        ("cardinal", "12", None, "twelve", "十二"),
        ("ordinal", "21", None, "twenty-first", "第二十一"),
        ("ordinal", "3rd", None, "third", "第三"),
        ("digits", "2026", None, "two zero two six", "二零二六"),
        ("characters", "AB1", None, "A B one", "A B 一"),
        ("spell-out", "ok", None, "O K", "O K"),
        ("date", "2026-12-03", None, "December third twenty twenty-six", "二零二六年十二月三日"),
        ("date", "03/12/2026", "dmy", "the third of December twenty twenty-six",
         "二零二六年十二月三日"),
        ("date", "12/25", None, "December twenty-fifth", "十二月二十五日"),
        ("time", "14:30", None, "fourteen thirty", "十四点三十分"),
        ("time", "9:05pm", None, "nine oh five P M", "下午九点零五分"),
        ("time", "7:00", None, "seven o'clock", "七点整"),
        ("telephone", "+1 555-0100", None, "plus one, five five five, zero one zero zero",
         "加幺，五五五，零幺零零"),
    ],
)  # fmt: skip
def test_say_as_in_english_and_chinese(
    kind: str, content: str, fmt: str | None, en: str, zh: str
) -> None:
    attrs = f'interpret-as="{kind}"' + (f' format="{fmt}"' if fmt else "")
    document = f"<speak><say-as {attrs}>{content}</say-as></speak>"
    assert texts(document, "en") == [en]
    assert texts(document, "zh") == [zh]


def test_say_as_reads_in_the_language_of_its_xml_lang_or_the_documents() -> None:
    doc = '<speak>Floor <say-as interpret-as="ordinal">2</say-as></speak>'
    assert texts(doc) == ["Floor second"]  # guessed: English words
    assert texts("<speak>楼层<say-as interpret-as='cardinal'>12</say-as>到了</speak>") == [
        "楼层十二到了"
    ]
    mixed = (
        '<speak xml:lang="en"><s xml:lang="zh-CN">第<say-as interpret-as="cardinal">3</say-as>'
        "层</s></speak>"
    )
    assert texts(mixed) == ["第三层。"]


@pytest.mark.parametrize(
    "element",
    [
        '<say-as interpret-as="currency">$5</say-as>',  # not in the subset
        '<say-as interpret-as="cardinal">$5</say-as>',  # not a number
        '<say-as interpret-as="date">13/45/2026</say-as>',  # no such date
        '<say-as interpret-as="time">25:99</say-as>',
        "<say-as>$5</say-as>",
    ],
)
def test_say_as_it_cannot_read_keeps_the_text(element: str) -> None:
    content = element.split(">")[1].split("<")[0]
    assert texts(f"<speak>{element}</speak>", "en") == [content]


def test_say_as_in_a_language_it_does_not_read_keeps_the_text() -> None:
    assert texts('<speak><say-as interpret-as="cardinal">12</say-as></speak>', "de") == ["12"]


def test_sub_without_alias_keeps_its_text() -> None:
    assert texts("<speak><sub>WWW</sub></speak>") == ["WWW"]


def test_a_phoneme_in_another_alphabet_is_its_text() -> None:
    assert parse_ssml('<speak><phoneme alphabet="x-sampa" ph="t@">the</phoneme></speak>') == [
        Text("the")
    ]


def test_voice_switches_and_comes_back() -> None:
    segments = parse_ssml(
        '<speak>a <voice name="amy">b <voice name="bob">c</voice></voice> d</speak>'
    )
    assert [(s.text, s.style.voice) for s in segments if isinstance(s, Text)] == [
        ("a", None), ("b", "amy"), ("c", "bob"), ("d", None)
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("text", "ssml"),
    [
        ("<speak>hi</speak>", True),
        ('  \n<speak xmlns="http://www.w3.org/2001/10/synthesis">hi</speak>', True),
        ('<?xml version="1.0"?><speak>hi</speak>', True),
        ("<speak/>", True),
        ("<speaker>hi</speaker>", False),
        ("hello <speak>", False),
        ("a < b", False),
    ],
)
def test_is_ssml_is_a_text_whose_root_is_speak(text: str, ssml: bool) -> None:
    assert is_ssml(text) is ssml
