"""Segments → parts and the request's key (speakd.markup.plan), prepared against a real engine
protocol (the tone engine) through the voice library, as the daemon prepares requests."""

from __future__ import annotations

from pathlib import Path

import pytest

from speakd.engines.base import SynthesisConfig
from speakd.markup.lexicon import Lexicon
from speakd.markup.plan import plan, plan_key, prepare_request, with_chime
from speakd.markup.ssml import parse_ssml
from speakd.request.errors import InputWarning
from speakd.request.messages import RequestError
from speakd.request.prepare import Marker, Part, Prepared, Silence, Sound, Speech
from speakd.request.sounds import Sounds, chime_key
from speakd.request.voices import VoiceLibrary
from tests.tone_engine import ToneEngine

LIBRARY = VoiceLibrary.of(ToneEngine())


def prepare_text(text: str, config: SynthesisConfig) -> Prepared:
    return LIBRARY.prepare(text, config)


def parts_of(document: str, config: SynthesisConfig | None = None) -> list[Part]:
    return plan(parse_ssml(document), config or SynthesisConfig(), prepare_text)


def key_of(document: str) -> str:
    return plan_key(parts_of(document))


def speech(parts: list[Part]) -> list[Speech]:
    return [p for p in parts if isinstance(p, Speech)]


def test_the_issue_example_is_speech_a_silence_and_speech_with_its_mark() -> None:
    parts = parts_of('<speak>Door <break time="700ms"/> open<mark name="m"/>.</speak>')
    assert [type(p) for p in parts] == [Speech, Silence, Speech]
    assert parts[1] == Silence(700)
    door, open_ = speech(parts)
    # each run of text is keyed as the same text sent plain: they share one clip
    assert door.prepared.key == prepare_text("Door", SynthesisConfig()).key
    assert open_.prepared.key == prepare_text("open.", SynthesisConfig()).key
    assert open_.marks == ((4, "m"),)  # a position in "open.", not a cut


def test_a_mark_before_every_word_is_one_part_with_the_unmarked_audio() -> None:
    orca = '<speak><mark name="0:4"/>Name: <mark name="6:10"/>text</speak>'
    (part,) = parts_of(orca)
    assert part.prepared.text == "Name: text"  # type: ignore[union-attr]
    assert part.marks == ((0, "0:4"), (5, "6:10"))  # type: ignore[union-attr]
    plain = prepare_request(LIBRARY, "Name: text", SynthesisConfig())
    marked = prepare_request(LIBRARY, orca, SynthesisConfig(), ssml=True)
    assert marked.parts == (part,) and marked.parts[0].prepared == plain  # type: ignore[union-attr]
    assert marked.key != plain.key  # the request's key hashes the marks and their offsets
    moved = '<speak><mark name="0:4"/>Name: text<mark name="6:10"/></speak>'
    assert key_of(moved) != key_of(orca)


def test_marks_at_a_break_or_a_voice_change_end_one_part_or_lead_the_next() -> None:
    parts = parts_of(
        '<speak>a<mark name="x"/><break time="100ms"/><mark name="y"/>'
        '<voice name="high">b</voice><mark name="z"/><prosody rate="slow">c</prosody></speak>'
    )
    assert [type(p) for p in parts] == [Speech, Silence, Speech, Speech]
    assert [p.marks for p in speech(parts)] == [((1, "x"),), ((0, "y"),), ((0, "z"),)]
    assert parts_of('<speak><mark name="x"/><break time="1s"/></speak>') == [
        Marker("x"),
        Silence(1000),
    ]


def test_prosody_and_voice_become_each_parts_config_and_volume() -> None:
    parts = speech(
        parts_of(
            '<speak>a <prosody rate="slow" volume="-6dB">b</prosody> <voice name="high">c</voice>'
            "</speak>",
            SynthesisConfig(speed=2.0),
        )
    )
    assert [p.prepared.config.speed for p in parts] == [2.0, 1.5, 2.0]
    assert [p.prepared.config.voice for p in parts] == ["low", "low", "high"]
    assert [p.volume for p in parts] == [1.0, 0.501, 1.0]


def test_a_voice_that_does_not_exist_is_refused() -> None:
    with pytest.raises(RequestError) as info:
        parts_of('<speak><voice name="nobody">x</voice></speak>')
    assert info.value.code == "unknown_voice"


def test_phonemes_go_inline_to_a_voice_that_takes_them_else_the_word() -> None:
    segments = parse_ssml('<speak>say <phoneme ph="təˈmɑːtoʊ">tomato</phoneme> now</speak>')
    config = SynthesisConfig()
    [inline] = speech(plan(segments, config, prepare_text, lambda c: c.voice != "high"))
    [word] = speech(plan(segments, SynthesisConfig(voice="high"), prepare_text, lambda c: False))
    assert inline.prepared.text == "say [[ təˈmɑːtoʊ ]] now"
    assert word.prepared.text == "say tomato now"


def test_equal_markup_has_one_key_and_any_change_changes_it() -> None:
    base = key_of('<speak>Hello <break time="500ms"/> world<mark name="m"/></speak>')
    assert key_of('<speak>Hello<break time="0.5s"/>world <mark name="m"/> </speak>') == base
    for other in (
        '<speak>Hello <break time="600ms"/> world<mark name="m"/></speak>',
        '<speak>Hello <break time="500ms"/> world<mark name="n"/></speak>',
        '<speak>Hello <break time="500ms"/> world</speak>',
        '<speak>Hello <break time="500ms"/> <prosody volume="loud">world</prosody>'
        '<mark name="m"/></speak>',
        '<speak>Hello <break time="500ms"/> <voice name="high">world</voice><mark name="m"/>'
        "</speak>",
    ):
        assert key_of(other) != base, other


def test_audio_is_its_sound_else_its_content_else_nothing_with_a_warning() -> None:
    """SSML's rule: the alternate content is said when the source cannot be played; with none,
    the clip is skipped and the rest spoken. Either way the client is warned (unknown_clip)."""
    sounds = Sounds(loudness=-20.0)
    warnings: list[InputWarning] = []

    def parts(document: str) -> list[Part]:
        return plan(
            parse_ssml(document),
            SynthesisConfig(),
            prepare_text,
            find_sound=sounds.find,
            warn=warnings.append,
        )

    said = parts('<speak>Doors <audio src="ding">ding dong</audio> closing</speak>')
    assert [type(p) for p in said] == [Speech, Sound, Speech]
    assert said[1] == Sound("ding", chime_key("ding"), -20.0)
    assert not warnings
    [alt] = speech(parts('<speak><audio src="no such clip">ding dong</audio></speak>'))
    assert alt.prepared.text == "ding dong"
    [said] = speech(parts('<speak>Doors <audio src="no such clip"/></speak>'))
    assert said.prepared.text == "Doors"
    assert [w.code for w in warnings] == ["unknown_clip", "unknown_clip"]
    assert "content is said instead" in warnings[0].message and "skipped" in warnings[1].message


def test_a_sound_is_in_the_key() -> None:
    def key(src: str, loudness: float | None = -20.0) -> str:
        sounds = Sounds(loudness=loudness)
        document = f'<speak>Doors <audio src="{src}"/></speak>'
        return plan_key(
            plan(parse_ssml(document), SynthesisConfig(), prepare_text, find_sound=sounds.find)
        )

    assert key("ding") == key("ding")
    assert len({key("ding"), key("ding-dong"), key("ding", -23.0), key("ding", None)}) == 4


def test_a_chime_goes_before_the_request_and_changes_its_key() -> None:
    prepared = LIBRARY.prepare("Doors closing", SynthesisConfig())
    chime = Sounds().find("ding")
    assert chime is not None
    chimed = with_chime(prepared, chime)
    assert chimed.parts == (chime, Speech(prepared)) and chimed.key != prepared.key
    marked = prepare_request(
        LIBRARY, "<speak>a<break time='1s'/>b</speak>", SynthesisConfig(), ssml=True
    )
    assert with_chime(marked, chime).parts == (chime, *marked.parts)


# ---- a whole request -------------------------------------------------------------------------


def lexicon(tmp_path: Path) -> Lexicon:
    path = tmp_path / "en.toml"
    path.write_text('lang = "en"\n[replace]\n"nginx" = "engine x"\n', encoding="utf-8")
    return Lexicon.load([path])


def test_plain_text_is_prepared_as_it_always_was() -> None:
    text = "Line one\nline two"  # a line break ends a sentence for some engines: kept
    assert prepare_request(LIBRARY, text, SynthesisConfig()) == prepare_text(
        text, SynthesisConfig()
    )


def test_a_lexicon_rewrites_plain_text_and_so_its_key(tmp_path: Path) -> None:
    prepared = prepare_request(
        LIBRARY, "run nginx\nnow", SynthesisConfig(), lexicon=lexicon(tmp_path)
    )
    assert prepared.text == "run engine x\nnow" and not prepared.parts
    assert prepared.key == prepare_text("run engine x\nnow", SynthesisConfig()).key
    assert prepared.key != prepare_text("run nginx\nnow", SynthesisConfig()).key


def test_markup_that_is_one_run_of_text_is_that_text() -> None:
    prepared = prepare_request(LIBRARY, "<speak><s>Hello</s></speak>", SynthesisConfig(), ssml=True)
    assert prepared == prepare_text("Hello.", SynthesisConfig())


def test_markup_with_a_break_has_parts_and_their_key(tmp_path: Path) -> None:
    doc = '<speak>nginx <break time="250ms"/> up<mark name="m"/></speak>'
    prepared = prepare_request(
        LIBRARY, doc, SynthesisConfig(), ssml=True, lexicon=lexicon(tmp_path)
    )
    assert [type(p) for p in prepared.parts] == [Speech, Silence, Speech]
    assert prepared.parts[2].marks == ((2, "m"),)  # type: ignore[union-attr]
    assert prepared.parts[0].prepared.text == "engine x"  # type: ignore[union-attr]
    assert prepared.key == plan_key(prepared.parts)
    assert prepared.bundle == ToneEngine.bundle_id


def test_markup_of_breaks_only_is_a_request_of_the_default_voice() -> None:
    prepared = prepare_request(
        LIBRARY, '<speak><break time="1s"/></speak>', SynthesisConfig(), ssml=True
    )
    assert prepared.parts == (Silence(1000),) and prepared.bundle == ToneEngine.bundle_id


def test_bad_markup_is_bad_ssml() -> None:
    with pytest.raises(RequestError) as info:
        prepare_request(LIBRARY, "<speak>open", SynthesisConfig(), ssml=True)
    assert info.value.code == "bad_ssml"


def test_a_document_of_nothing_but_clips_speakd_lacks_is_refused() -> None:
    with pytest.raises(RequestError) as info:
        prepare_request(
            LIBRARY, '<speak><audio src="yo.wav"/></speak>', SynthesisConfig(), ssml=True
        )
    assert info.value.code == "unknown_clip"


@pytest.mark.parametrize(
    "document",
    [
        '<speak><amazon:effect name="whispered">quietly</amazon:effect> said</speak>',
        '<speak xmlns:amazon="http://amazon.com/ssml"><amazon:effect>quietly</amazon:effect>'
        " said</speak>",
        '<speak><amazon:effect xmlns:amazon="x">quietly</amazon:effect> <b amazon:x="1">said'
        "</b></speak>",
    ],
)
def test_an_element_of_any_prefix_declared_or_not_keeps_its_text(document: str) -> None:
    """Alexa-style content: the prefixed element is unknown, so ignored, and its text said."""
    [text] = parse_ssml(document)
    assert text.text.split() == ["quietly", "said"]


def test_a_bad_document_with_an_undeclared_prefix_is_placed_in_the_clients_text() -> None:
    """The declarations speakd adds for the prefix do not move the column it reports."""
    with pytest.raises(RequestError) as with_prefix:
        parse_ssml("<speak><a:b>x</a:b><p>open</speak>")
    with pytest.raises(RequestError) as without:
        parse_ssml("<speak><abb>x</abb><p>open</speak>")
    assert with_prefix.value.code == "bad_ssml"
    assert str(with_prefix.value) == str(without.value)
