"""SSML and lexicons end to end: a real ``speakd serve`` with the embedded Piper voice, driven over
its JSON socket (``synth``: audio, marks, errors), a reload that picks up a lexicon edit, and
SSIP's ``SSML_MODE`` on the in-process SSIP server (tone engine, WAV sink)."""

from __future__ import annotations

import base64
import json
import socket
import subprocess
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from speakd.audio import read_wav
from tests.daemon_proc import DaemonProc
from tests.daemon_proc import synth as synth_wav
from tests.http_daemon import HttpDaemon, start_http_daemon, wav_samples
from tests.ssip_harness import SsipClient, wav_server

RATE = 22050  # the embedded voice's
LEXICON = 'lang = "en"\n[replace]\n"nginx" = "engine x"\n'


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("ssml")
    lexicon = tmp / "en.toml"
    lexicon.write_text(LEXICON, encoding="utf-8")
    d = start_http_daemon(tmp, f'[lexicon]\nfiles = ["{lexicon}"]')
    yield d
    assert d.stop() == 0, d.proc.log_text()


@pytest.fixture
def daemon(served: HttpDaemon) -> DaemonProc:
    return served.proc


def synth(
    d: DaemonProc, rate: int = RATE, **fields: Any
) -> tuple[np.ndarray, list[dict[str, Any]]]:
    """A socket ``synth`` (its audio at ``rate``): its PCM and every event but the audio ones."""
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(60)
        s.connect(d.socket)
        s.sendall(json.dumps({"op": "synth", "id": "s", **fields}).encode() + b"\n")
        pcm, events = [], []
        for line in s.makefile("rb"):
            event = json.loads(line)
            if event["event"] == "audio":
                assert event["format"]["rate"] == rate
                pcm.append(np.frombuffer(base64.b64decode(event["data"]), dtype="<i2"))
            else:
                events.append(event)
            if event["event"] in ("finished", "error"):
                break
    return (np.concatenate(pcm) if pcm else np.zeros(0, dtype="<i2")), events


def longest_zero_run(pcm: np.ndarray) -> int:
    runs = np.diff(np.flatnonzero(np.concatenate([[1], pcm != 0, [1]]))) - 1
    return int(runs.max())


def test_a_break_is_silence_and_a_mark_is_a_position_in_its_text(daemon: DaemonProc) -> None:
    """The issue's example. Its parts are the plain texts' own clips: the audio is exactly
    "Door", 700 ms of zeros, then "open Floor twelve." as one utterance (a mark is not a cut),
    the mark on the onset of "Floor"; equivalent markup plays the same."""
    pcm, events = synth(
        daemon,
        text='<speak>Door <break time="700ms"/> open<mark name="m"/> '
        'Floor <say-as interpret-as="cardinal">12</say-as>.</speak>',
    )
    door, _ = synth(daemon, text="Door")
    rest, timed = synth(daemon, text="open Floor twelve.", words=True)
    gap = np.zeros(700 * RATE // 1000, dtype="<i2")
    assert np.array_equal(pcm, np.concatenate([door, gap, rest]))
    assert longest_zero_run(pcm) >= 0.65 * RATE
    floor = next(e["start"] for e in timed if e["event"] == "word" and e["word"] == "Floor")
    mark, finished = events
    assert mark == {"event": "mark", "id": "s", "name": "m", "sample": len(door) + len(gap) + floor}
    assert finished["event"] == "finished" and finished["status"] == "done"
    assert finished["cached"] is False  # its parts were synthesised (and stored) then
    equivalent = (
        '<speak>Door<break time="0.7s"/>open<mark name="m"/>Floor '
        '<say-as interpret-as="cardinal">12</say-as>.</speak>'
    )
    again, events = synth(daemon, text=equivalent, format="ssml")
    assert np.array_equal(again, pcm) and events[0] == mark


def test_a_played_say_reports_each_mark_as_playback_reaches_it(daemon: DaemonProc) -> None:
    _, door = synth(daemon, text="Door", words=True)
    open_, timed = synth(daemon, text="open", words=True)
    onset = {e["word"]: e["start"] for e in [*door, *timed] if e["event"] == "word"}
    events = daemon.say(
        '<speak><mark name="start"/>Door <break time="300ms"/><mark name="gap-end"/>open'
        '<mark name="end"/></speak>',
        id="marks",
    )
    kinds = [e["event"] for e in events]
    assert kinds == ["queued", "started", "mark", "mark", "mark", "finished"], events  # BEGIN first
    marks = {e["name"]: e["sample"] for e in events if e["event"] == "mark"}
    played = read_wav(daemon.config.parent / "wav" / "marks.wav").samples()
    before_open = len(played) - len(open_)  # "Door" and the 300 ms gap
    assert marks["start"] == onset["Door"]  # on the word it precedes
    assert marks["gap-end"] == before_open + onset["open"]
    assert marks["end"] == len(played)


def test_http_say_and_speech_read_ssml(served: HttpDaemon) -> None:
    ssml = '<speak>Door <break time="200ms"/> open<mark name="m"/></speak>'
    said = httpx.post(
        f"{served.url}/v1/say",
        json={"text": ssml, "format": "ssml", "wait": True, "id": "h1"},
        headers=served.auth,
        timeout=60,
    ).json()
    assert [e["event"] for e in said["events"]] == ["queued", "started", "mark", "finished"]
    fetched = httpx.post(
        f"{served.url}/v1/audio/speech",
        json={"model": "tts-1", "input": ssml, "voice": "alloy", "response_format": "wav"},
        headers=served.auth,
        timeout=60,
    )
    pcm, rate = wav_samples(fetched.content)
    composed, _ = synth(served.proc, text=ssml)
    assert rate == RATE and np.array_equal(pcm, composed)
    assert said["events"][2]["sample"] == len(composed)


def test_a_phoneme_is_said_as_written_by_the_piper_voice(daemon: DaemonProc) -> None:
    ssml = '<speak>Say <phoneme alphabet="ipa" ph="təˈmɑːtoʊ">tomato</phoneme>.</speak>'
    said, _ = synth(daemon, text=ssml)
    as_written, _ = synth(daemon, text="Say [[ təˈmɑːtoʊ ]].")  # Piper's own phoneme syntax
    as_espeak_reads_it, _ = synth(daemon, text="Say tomato.")
    assert np.array_equal(said, as_written)
    assert not np.array_equal(said, as_espeak_reads_it)


def test_prosody_pitch_and_the_pitch_field_are_one_shift_that_keeps_about_the_length(
    daemon: DaemonProc,
) -> None:
    plain, _ = synth(daemon, text="Door open.")
    by_field, _ = synth(daemon, text="Door open.", pitch=3)
    by_ssml, _ = synth(daemon, text='<speak><prosody pitch="+3st">Door open.</prosody></speak>')
    assert np.array_equal(by_field, by_ssml)
    # a Piper voice resamples its pitch: the length within a few per cent (docs/ssml.md#pitch)
    assert abs(by_field.size / plain.size - 1) < 0.08, (by_field.size, plain.size)
    assert not np.array_equal(by_field, plain)
    r = daemon.cli("say", "Door open.", "--pitch", "3", "--explain")
    assert r.returncode == 0 and ", pitch +3 st]" in r.stdout, r.stdout + r.stderr


def test_explain_shows_what_each_voice_will_read(daemon: DaemonProc) -> None:
    r = daemon.cli("say", '<speak>Restart nginx <break time="500ms"/> now</speak>', "--explain")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[1:] == ["(silence 500 ms)", lines[2]] and lines[0].endswith("] Restart engine x")
    assert lines[2].endswith("] now") and ", -, speed 1]" in lines[0]  # no lang asked
    with daemon.client() as c:
        explained = c.request({"op": "explain", "text": "nginx", "lang": "en"})
    [part] = explained["parts"]
    assert part["text"] == "engine x" and explained["key"] == part["key"]


def test_voices_say_what_ssml_each_voice_honours(daemon: DaemonProc) -> None:
    with daemon.client() as c:
        [piper] = c.request({"op": "voices"})["voices"]
    assert piper["ssml"] == {"pitch": True, "phonemes": True}


def test_speakd_synth_reads_ssml_as_the_daemon_does(daemon: DaemonProc) -> None:
    ssml = '<speak>Door <break time="250ms"/> open</speak>'
    offline = read_wav(synth_wav(ssml, daemon.config.parent / "offline.wav")).samples()
    served, _ = synth(daemon, text=ssml)
    assert np.array_equal(offline, served)


def test_markup_of_one_run_of_text_is_that_text(daemon: DaemonProc) -> None:
    plain, _ = synth(daemon, text="Mind the gap.")
    marked, events = synth(daemon, text="<speak><s>Mind the gap</s></speak>")
    assert np.array_equal(marked, plain) and [e["event"] for e in events] == ["finished"]


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"text": "<speak>\n  <p>open</speak>"}, "mismatched tag (line 2, column 12)"),
        ({"text": "Door open", "format": "ssml"}, "(line 1, column 1)"),
        ({"text": '<speak>a<break time="forever"/></speak>'}, "<break>: time"),
    ],
)
def test_a_document_it_cannot_read_is_bad_ssml_with_its_place(
    daemon: DaemonProc, fields: dict[str, Any], says: str
) -> None:
    _, [error] = synth(daemon, **fields)
    assert error["event"] == "error" and error["code"] == "bad_ssml", error
    assert says in error["message"]


def test_a_billion_laughs_is_refused_and_the_daemon_keeps_serving(daemon: DaemonProc) -> None:
    laughs = '<!DOCTYPE speak [<!ENTITY a "aaaaaaaaaa">' + "".join(
        f'<!ENTITY {"b" * i}a "{("&" + "b" * (i - 1) + "a;") * 10}">' for i in range(1, 10)
    )
    _, [error] = synth(daemon, text=laughs + "]><speak>&bbbbbbbbba;</speak>")
    assert error["code"] == "bad_ssml" and "entity declarations are not allowed" in error["message"]
    pcm, _ = synth(daemon, text="Still here.")
    assert len(pcm) > 0


def test_a_bad_format_is_a_bad_field(daemon: DaemonProc) -> None:
    _, [error] = synth(daemon, text="hi", format="html")
    assert error["code"] == "bad_field"


def test_the_lexicon_changes_what_is_said_and_a_reload_applies_an_edit(
    daemon: DaemonProc,
) -> None:
    said, _ = synth(daemon, text="I run nginx.")
    meant, _ = synth(daemon, text="I run engine x.")
    assert np.array_equal(said, meant)  # one text as said, one key
    with daemon.client() as c:
        before = c.request({"op": "status"})["lexicon"]["en"]
    lexicon = Path(before["file"])
    lexicon.write_text(LEXICON.replace("engine x", "engine ex"), encoding="utf-8")
    daemon.reload()
    with daemon.client() as c:
        after = c.request({"op": "status"})["lexicon"]["en"]
    assert after["digest"] != before["digest"]
    edited, _ = synth(daemon, text="I run nginx.")
    expected, _ = synth(daemon, text="I run engine ex.")
    assert np.array_equal(edited, expected) and not np.array_equal(edited, said)


# ---- SSIP ----------------------------------------------------------------------------------------


def test_ssip_ssml_mode_reads_the_markup(tmp_path: Path) -> None:
    with (
        wav_server(tmp_path / "ssip.sock", tmp_path / "wav") as server,
        SsipClient(server.path) as c,
    ):
        assert c.code("SET SELF SSML_MODE on") == 219
        assert c.code("SET SELF PRIORITY message") == 202  # queued, not the newest text wins
        door = c.speak('<speak>Door <break time="700ms"/> open</speak>')
        c.speak('a fragment <sub alias="without">sans</sub> speak')  # read as if in <speak>
        server.wait_idle()
        assert c.command("SPEAK") == ["230 OK RECEIVING DATA"]
        c.send(b"<speak>\r\n<p>open</speak>\r\n.\r\n")
        [refused] = c.reply()
        assert refused.startswith("400 ERR not XML: mismatched tag (line 2, column")
    assert server.engine.calls == ["Door", "open", "a fragment without speak"]
    audio = read_wav(tmp_path / "wav" / f"ssip-{door}.wav")
    assert longest_zero_run(audio.samples()) >= 0.7 * audio.sample_rate - 1


SPEECHD = Path("/usr/bin/python3")  # Debian's, where python3-speechd (libspeechd's client) lives
SPEECHD_CLIENT = r"""
import json, sys, threading
import speechd

marks, done = [], threading.Event()


def heard(kind, index_mark=None):
    if kind == speechd.CallbackType.INDEX_MARK:
        marks.append(index_mark)
    elif kind in (speechd.CallbackType.END, speechd.CallbackType.CANCEL):
        done.set()


client = speechd.SSIPClient("test", address="unix_socket:" + sys.argv[1], autospawn=False)
client.set_data_mode(speechd.DataMode.SSML)
kinds = (speechd.CallbackType.INDEX_MARK, speechd.CallbackType.END, speechd.CallbackType.CANCEL)
client.speak(sys.argv[2], callback=heard, event_types=kinds)
done.wait(20)
client.close()
print(json.dumps({"marks": marks, "ended": done.is_set()}))
"""


def _has_speechd() -> bool:
    r = subprocess.run([str(SPEECHD), "-c", "import speechd"], capture_output=True)
    return SPEECHD.exists() and r.returncode == 0


@pytest.mark.skipif(not _has_speechd(), reason="python3-speechd (Debian) is not installed")
def test_ssip_index_marks_reach_a_libspeechd_client(tmp_path: Path) -> None:
    """speech-dispatcher's own Python client: SSML mode, index-mark callbacks in order, then END."""
    with wav_server(tmp_path / "ssip.sock", tmp_path / "wav") as server:
        # The first mark comes after a word: libspeechd registers a message's callback when the
        # SPEAK reply arrives, so an event at offset 0 can beat it (as with speech-dispatcher).
        ssml = (
            '<speak>The <mark name="one"/>door <break time="100ms"/><mark name="two"/>open</speak>'
        )
        r = subprocess.run(
            [str(SPEECHD), "-c", SPEECHD_CLIENT, str(server.path), ssml],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {"marks": ["one", "two"], "ended": True}
