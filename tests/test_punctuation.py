"""Punctuation as speech-dispatcher reads it (speakd.markup.punctuation): the levels and the tables
in English and Chinese, then the stock ``spd-say -m`` and raw SSIP (``PUNCTUATION``,
``PUNCTUATION_IMPORTANT``) against the in-process SSIP ssip_server (tone engine: what the engine was
given), and the ``punctuation`` field on a real ``speakd serve``: its socket (audio, key, explain)
and HTTP (``/v1/say``, ``/v1/audio/speech``)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest

from speakd.markup.punctuation import LEVELS, Punctuation, table
from speakd.markup.segments import Break, Mark, Style, Text
from speakd.request.errors import RequestError
from tests.daemon_proc import DaemonProc
from tests.http_daemon import HttpDaemon, start_http_daemon, wav_samples
from tests.ssip_harness import SsipClient, SsipServer
from tests.test_ssip import needs_spd_say, spd_say

EN = "C# costs $5 (50% off), a/b; don't wait... Really?!"


def said(level: str, text: str, lang: str | None = "en", important: str | None = None) -> str:
    return Punctuation.of(level, important).apply(text, lang)


def test_none_leaves_the_text_as_written() -> None:
    assert said("none", EN) == EN
    assert said("none", "你好，世界。", "zh") == "你好，世界。"


def test_each_level_names_its_own_symbols_and_those_below() -> None:
    assert said("some", EN) == "C hash costs $5 (50 percent off), a slash b; don't wait... Really?!"
    assert said("most", EN) == (
        "C hash costs $5 left paren 50 percent off right paren, a slash b semicolon; don't wait... "
        "Really?!"
    )
    assert said("all", EN) == (
        "C hash costs dollar 5 left paren 50 percent off right paren comma, a slash b semicolon; "
        "don't wait ellipsis... Really question mark? exclamation mark!"
    )


def test_sentence_punctuation_stays_after_its_name_so_the_sentence_still_ends() -> None:
    assert said("all", "Hello, world.") == "Hello comma, world dot."


@pytest.mark.parametrize("text", ["3.14", "1,000", "don't", "12:30", "e-mail", "don’t"])
def test_symbols_inside_a_word_or_number_stay_as_written(text: str) -> None:
    assert said("all", text) == text


def test_a_run_of_one_symbol_is_named_once() -> None:
    assert said("all", "Stop!!!") == "Stop exclamation mark!!!"
    assert said("most", "a -- b") == "a dash b"


def test_chinese_names_go_in_without_spaces() -> None:
    text = "你好，世界。价格是50%（含税）！"
    assert said("some", text, "zh") == "你好，世界。价格是50百分号（含税）！"
    assert said("most", text, "zh") == "你好，世界。价格是50百分号左括号含税右括号！"
    assert said("all", text, "zh") == "你好逗号，世界句号。价格是50百分号左括号含税右括号感叹号！"


def test_the_language_picks_the_table() -> None:
    assert said("all", "Hi, 你好。", "zh-CN") == "Hi逗号, 你好句号。"
    assert said("all", "Hi.", "en-GB") == "Hi dot."
    assert said("all", "你好，世界。", None) == "你好逗号，世界句号。"  # the text looks Chinese
    assert said("all", "Hallo, Welt.", "de") == "Hallo, Welt."  # no German table: as written


def test_important_is_the_some_set() -> None:
    """SSIP's old PUNCTUATION_IMPORTANT: its characters are named from ``some`` on; the table's
    other ``some`` symbols (here %) wait for ``most``."""
    text = "Hello, world; 50% off."
    assert said("some", text, important=".,;") == "Hello comma, world semicolon; 50% off dot."
    assert said("most", text, important=".,;") == (
        "Hello comma, world semicolon; 50 percent off dot."
    )
    assert said("none", text, important=".,;") == text


def test_markup_keeps_breaks_and_marks_and_reads_each_run_in_its_language() -> None:
    segments = [Text("Hi, there."), Break(300), Mark("m"), Text("好。", Style(lang="zh"))]
    assert Punctuation("all").apply_segments(segments, "en") == [
        Text("Hi comma, there dot."),
        Break(300),
        Mark("m"),
        Text("好句号。", Style(lang="zh")),
    ]


@pytest.mark.parametrize(
    ("level", "important"), [("loud", None), (3, None), ("all", 5), ("all", "x" * 65)]
)
def test_bad_values_are_bad_field(level: Any, important: Any) -> None:
    with pytest.raises(RequestError) as e:
        Punctuation.of(level, important)
    assert e.value.code == "bad_field"


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_the_tables_use_known_levels_and_name_every_symbol(lang: str) -> None:
    symbols = table(lang).symbols
    assert len(symbols) > 40
    for key, symbol in symbols.items():
        assert key.strip() and symbol.name.strip() and 1 <= symbol.level < len(LEVELS), key
    assert [s for s in LEVELS[1:] if any(LEVELS[x.level] == s for x in symbols.values())] == [
        "some",
        "most",
        "all",
    ]


# ---- SSIP: spd-say and raw commands against the in-process ssip_server (tone engine) ------------


@needs_spd_say
@pytest.mark.parametrize(
    ("mode", "spoken"),
    [
        ("none", "Hello, world. 50% (off)"),
        ("some", "Hello, world. 50 percent (off)"),
        ("most", "Hello, world. 50 percent left paren off right paren"),
        ("all", "Hello comma, world dot. 50 percent left paren off right paren"),
    ],
)
def test_spd_say_punctuation_mode_changes_what_is_read(
    ssip_server: SsipServer, mode: str, spoken: str
) -> None:
    r = spd_say(ssip_server.path, "-w", "-m", mode, "Hello, world. 50% (off)")
    assert r.returncode == 0, r.stdout + r.stderr
    assert ssip_server.engine.calls == [spoken]


def test_ssip_punctuation_settings_and_replies(ssip_server: SsipServer) -> None:
    with SsipClient(ssip_server.path) as c:
        assert c.code("SET SELF NOTIFICATION end on") == 220
        assert c.code("SET SELF PRIORITY MESSAGE") == 202  # each said in turn
        assert c.command("SET SELF PUNCTUATION most") == ["205 OK PUNCTUATION SET"]
        assert c.command("GET PUNCTUATION") == ["251-most", "251 OK GET RETURNED"]
        assert c.command('SET SELF PUNCTUATION_IMPORTANT ".,;"') == ["205 OK PUNCTUATION SET"]
        assert c.code("SET SELF PUNCTUATION some") == 205
        first = c.speak("Hi, you; 5% off.")
        assert c.command('SET SELF PUNCTUATION_IMPORTANT ""') == ["205 OK PUNCTUATION SET"]
        second = c.speak("Hi, you; 5% off.")
        assert c.code("SET SELF PUNCTUATION_IMPORTANT") == 510
        assert c.command("SET 9999 PUNCTUATION_IMPORTANT ,") == ["305 ERR COULDNT SET PUNCT MODE"]
        for m in (first, second):
            c.wait_event(702, m)
    assert ssip_server.engine.calls == [
        "Hi comma, you semicolon; 5% off dot.",
        "Hi, you; 5 percent off.",
    ]


# ---- the socket's punctuation field on a real daemon (the embedded Piper voice) -------------


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HttpDaemon]:
    d = start_http_daemon(tmp_path_factory.mktemp("punctuation"), sink="null")
    yield d
    assert d.stop() == 0, d.proc.log_text()


@pytest.fixture
def daemon(served: HttpDaemon) -> DaemonProc:
    return served.proc


def synth(d: DaemonProc, **fields: Any) -> tuple[bytes, dict[str, Any]]:
    with d.client() as c:
        audio, end = c.synth(fields)
    assert audio is not None, end
    return audio.pcm, end


def explain(d: DaemonProc, **fields: Any) -> dict[str, Any]:
    with d.client() as c:
        return c.request({"op": "explain", **fields})


def test_the_socket_field_says_the_symbols_and_keys_the_clip_by_what_is_said(
    daemon: DaemonProc,
) -> None:
    named = explain(daemon, text="Turn left, now.", punctuation="all")
    as_said = explain(daemon, text="Turn left comma, now dot.")
    plain = explain(daemon, text="Turn left, now.")
    assert named["parts"][0]["text"] == "Turn left comma, now dot."
    assert named["key"] == as_said["key"] != plain["key"]
    assert explain(daemon, text="Turn left, now.", punctuation="none")["key"] == plain["key"]
    audio, end = synth(daemon, text="Turn left, now.", punctuation="all")
    assert end["event"] == "finished" and end["cached"] is False
    again, end = synth(daemon, text="Turn left comma, now dot.")
    assert end["cached"] is True and again == audio
    assert synth(daemon, text="Turn left, now.")[0] != audio


def test_ssml_runs_are_named_too_and_bad_levels_are_refused(daemon: DaemonProc) -> None:
    ssml = '<speak>Door, <break time="200ms"/> open!</speak>'
    parts = explain(daemon, text=ssml, punctuation="all")["parts"]
    assert [p.get("text", p.get("silence_ms")) for p in parts] == [
        "Door comma,",
        200,
        "open exclamation mark!",
    ]
    with daemon.client() as c:
        refused = c.request({"op": "explain", "text": "Hi.", "punctuation": "loud"})
    assert refused["event"] == "error" and refused["code"] == "bad_field"


def test_say_explain_shows_the_text_as_read(daemon: DaemonProc) -> None:
    r = daemon.cli("say", "Call me at 5 (today).", "--punctuation", "most", "--explain")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0].endswith("] Call me at 5 left paren today right paren.")


def test_http_takes_the_field_on_v1_say_and_v1_audio_speech(served: HttpDaemon) -> None:
    text = "Doors closing; stand clear!"
    named, _ = synth(served.proc, text="Doors closing semicolon; stand clear exclamation mark!")
    answer = httpx.post(
        f"{served.url}/v1/audio/speech",
        json={"model": "tts-1", "input": text, "response_format": "wav", "punctuation": "all"},
        headers=served.auth,
        timeout=60,
    )
    assert answer.status_code == 200, answer.text
    samples, _ = wav_samples(answer.content)
    assert np.array_equal(samples, np.frombuffer(named, dtype="<i2"))
    said = httpx.post(
        f"{served.url}/v1/say",
        json={"text": text, "punctuation": "most", "wait": True},
        headers=served.auth,
        timeout=60,
    )
    assert said.status_code == 200 and said.json()["status"] == "done", said.text
    refused = httpx.post(
        f"{served.url}/v1/say", json={"text": text, "punctuation": 1}, headers=served.auth
    )
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "bad_field"
