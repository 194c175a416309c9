"""speakd under a real Home Assistant Core (tests/ha_core.py), both releases its users run:
2025.4.4 sends a text whole (``synthesize``), 2026.2.3 streams it (``synthesize-start``, one
chunk, the whole text again as ``synthesize``, ``synthesize-stop``). What HA serves, what it keeps
in its TTS cache (its ``tts/`` folder), what its UI's options do, and the MQTT entities, against
a real ``speakd serve`` with its embedded Piper voice and a real mosquitto."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pytest
from wyoming.client import AsyncTcpClient
from wyoming.tts import Synthesize, SynthesizeVoice

from tests.daemon_proc import DaemonProc, start_daemon, write_config
from tests.ha_core import HomeAssistant, venv_or_skip
from tests.ha_venv import RELEASES, HaUnavailable, HaVenv, build_all
from tests.mosquitto import Mosquitto, free_port
from tests.tiny_voices import tiny_multispeaker_voice
from tests.waits import wait_until

pytestmark = pytest.mark.timeout(600)

MAX_TEXT_CHARS = 200  # a "long" text is one over this: the same path as 5 000, quicker to say
TINY = "xx_XX-tiny-low"  # a second voice, with speakers anna and bert
SSML = (
    '<speak>Hello <break time="800ms"/> world. '
    '<say-as interpret-as="characters">HA</say-as></speak>'
)


@dataclass
class Stack:
    ha: HomeAssistant
    daemon: DaemonProc
    wyoming: int
    site: str

    def restart_daemon(self) -> None:
        self.daemon = start_daemon(self.daemon.config)

    def pcm(self, text: str, text_format: str | None = None, **voice: str) -> bytes:
        """The audio speakd's Wyoming server gives this text, asked directly."""
        synthesize = Synthesize(text, SynthesizeVoice(**voice) if voice else None, text_format)

        async def ask() -> bytes:
            audio = b""
            async with AsyncTcpClient("127.0.0.1", self.wyoming) as client:
                await client.write_event(synthesize.event())
                while (event := await client.read_event()) and event.type != "audio-stop":
                    audio += event.payload or b"" if event.type == "audio-chunk" else b""
            return audio

        return asyncio.run(ask())


@pytest.fixture(scope="module")
def venvs() -> dict[str, HaVenv | HaUnavailable]:
    """Both releases' venvs, built together on a machine that has none (cached after)."""
    return build_all()


@pytest.fixture(scope="module", params=list(RELEASES))
def stack(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    broker: Mosquitto,
    venvs: dict[str, HaVenv | HaUnavailable],
) -> Iterator[Stack]:
    """speakd (Wyoming, MQTT, one stream at a time: a second is ``busy`` at once) and HA,
    onboarded, with the Wyoming integration added through its config flow."""
    release = request.param
    venv = venv_or_skip(release, venvs[release])
    tmp = tmp_path_factory.mktemp(f"ha-{release}")
    (tmp / "speakd").mkdir()
    port, site = free_port(), f"ha{release.replace('.', '')}"
    extra = (
        f'[wyoming]\nuri = "tcp://127.0.0.1:{port}"\n'
        f'[mqtt]\nenabled = true\nhost = "{broker.host}"\nport = {broker.port}\n'
        f'site_id = "{site}"\ndiscovery_delay_s = 0.2\n'
        f"[limits]\nmax_text_chars = {MAX_TEXT_CHARS}\nmax_streams = 1\nstream_wait_s = 0\n"
    )
    config = write_config(tmp / "speakd", extra, sink="null", realtime=True)
    tiny_multispeaker_voice(tmp / "speakd" / "voices", TINY)
    s = Stack(HomeAssistant(venv, tmp / "ha"), start_daemon(config), port, site)
    try:
        s.ha.start()
        s.ha.onboard()
        entry = s.ha.flow("wyoming", {"host": "127.0.0.1", "port": port})
        assert entry["type"] == "create_entry", entry
        yield s
    finally:
        s.ha.stop()
        s.daemon.stop()


def pcm_of(body: bytes) -> bytes:
    """A WAV's samples; HA 2026's streamed WAV says 0 frames in its header, so read to the end."""
    assert body[:4] == b"RIFF", body[:64]
    at = body.index(b"data") + 8
    return body[at:]


def seconds(body: bytes) -> float:
    return len(pcm_of(body)) / 2 / 22050


def longest_silence_s(pcm: bytes) -> float:
    quiet = np.abs(np.frombuffer(pcm, dtype="<i2").astype(np.int32)) < 64
    best = run = 0
    for q in quiet:
        run = run + 1 if q else 0
        best = max(best, run)
    return best / 22050


@pytest.mark.parametrize("language", [None, "en", "en_US", "en-US"])
def test_every_language_spelling_speaks(stack: Stack, language: str | None) -> None:
    got = stack.ha.speak(f"The kitchen lights are on, {language}.", language)
    assert got.status == 200 and seconds(got.body) > 1.0


@pytest.mark.parametrize(
    "text",
    [
        "Zoë’s café — naïve 🙂 ½ → “quoted”",  # odd Unicode
        "\n\t  Spaces   around\u00a0and\u2003inside.  \n",  # white space, no-break and em spaces
    ],
)
def test_odd_text_is_spoken_as_speakd_says_it(stack: Stack, text: str) -> None:
    got = stack.ha.speak(text)
    assert got.status == 200 and pcm_of(got.body) == stack.pcm(text)


def test_ssml_is_one_document_with_its_break_and_spelling(stack: Stack) -> None:
    """2025.4 sends it whole, 2026 in one chunk of a stream: the same audio as the document
    sent whole with text_format ssml, 800 ms of silence in it, "HA" spelled (longer than "ha")."""
    got = stack.ha.speak(SSML)
    assert got.status == 200, got
    reference = stack.pcm(SSML, text_format="ssml")
    assert pcm_of(got.body) == reference
    assert longest_silence_s(reference) >= 0.75
    spelled = stack.pcm('<speak><say-as interpret-as="characters">HA</say-as></speak>')
    assert len(spelled) > len(stack.pcm("ha"))


def test_a_long_text_is_spoken_whole(stack: Stack) -> None:
    text = " ".join(f"Line {i} of the long announcement is read." for i in range(10))
    assert len(text) > 2 * MAX_TEXT_CHARS
    got = stack.ha.speak(text)
    assert got.status == 200 and seconds(got.body) > 10


def test_the_voice_picker_shows_names_and_the_options_work(stack: Stack) -> None:
    ha = stack.ha
    (engine,) = ha.ws({"type": "tts/engine/get", "engine_id": "tts.speakd"})
    assert {"en-US", "en_US", "en"} <= set(engine["provider"]["supported_languages"])
    (listed,) = ha.ws({"type": "tts/engine/voices", "engine_id": "tts.speakd", "language": "en"})
    names = {v["voice_id"]: v["name"] for v in listed["voices"]}
    assert TINY in names and all(name == vid for vid, name in names.items())
    anna = ha.speak("Hello there.", voice=TINY, speaker="anna")
    bert = ha.speak("Hello there.", voice=TINY, speaker="bert")
    assert anna.status == bert.status == 200
    assert pcm_of(anna.body) == stack.pcm("Hello there.", name=TINY, speaker="anna")
    assert pcm_of(anna.body) != pcm_of(bert.body)


def cached(ha: HomeAssistant) -> dict[str, int]:
    return ha.tts_files()


@pytest.mark.parametrize(
    ("text", "options"),
    [
        ("   \n ", {}),  # white space only: empty_text
        ("Never said.", {"voice": "nobody"}),  # unknown_voice
        (f"<speak>{'word ' * MAX_TEXT_CHARS}</speak>", {}),  # an SSML document too long to cut
    ],
)
def test_a_refusal_is_a_failure_home_assistant_does_not_keep(
    stack: Stack, text: str, options: dict[str, str]
) -> None:
    """Shown where HA can show it: its log says why (2025.4: "No TTS from"), the fetch fails."""
    ha, before = stack.ha, cached(stack.ha)
    said = "No TTS from" if ha.venv.release == "2025.4.4" else "Error getting audio for"
    logged = ha.log_text().count(said)
    got = ha.speak(text, **options)
    assert got.status == 500 and got.body != b"RIFF", got
    assert cached(ha) == before  # nothing kept: asked again, it is asked of speakd again
    wait_until(lambda: ha.log_text().count(said) > logged, f"{said!r} in HA's log", 30)


def test_busy_then_free_is_spoken_not_silence_kept(stack: Stack) -> None:
    """The passing cause: the one stream speakd allows is taken (a client reading slowly), so
    HA's request is ``busy``; once it is free, the same request is spoken, not HA's old answer."""
    text = "The washing machine has finished."
    before = cached(stack.ha)
    holder = socket.create_connection(("127.0.0.1", stack.wyoming))
    holder.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    long_text = " ".join(f"Sentence {i} keeps the stream busy." for i in range(5))
    assert len(long_text) <= MAX_TEXT_CHARS  # one request: its stream is held throughout
    holder.sendall(_event(Synthesize(long_text)))
    holder.recv(1)  # audio-start has come: the stream is taken, and nothing more is read
    try:
        refused = stack.ha.speak(text)
        assert refused.status == 500 and cached(stack.ha) == before
    finally:
        holder.close()
    wait_until(lambda: "the client left" in stack.daemon.log_text(), "the slot freed", 30)
    got = stack.ha.speak(text)
    assert got.status == 200 and pcm_of(got.body) == stack.pcm(text)
    assert len(cached(stack.ha)) == len(before) + 1


def _event(synthesize: Synthesize) -> bytes:
    event = synthesize.event()
    data = json.dumps(event.data).encode()
    return json.dumps({"type": event.type, "data_length": len(data)}).encode() + b"\n" + data


def test_speakd_restarting_under_home_assistant(stack: Stack) -> None:
    text = "Back after a restart."
    stack.daemon.stop()
    before = cached(stack.ha)
    assert stack.ha.speak(text).status == 500 and cached(stack.ha) == before
    stack.restart_daemon()
    got = stack.ha.speak(text)
    assert got.status == 200 and pcm_of(got.body) == stack.pcm(text)


def test_an_assist_pipeline_speaks_through_speakd(stack: Stack) -> None:
    """The pipeline HA's voice assistants run (its text-to-speech stage), MP3 by ffmpeg."""
    if shutil.which("ffmpeg") is None:
        reason = "Home Assistant's pipelines convert to MP3 with ffmpeg: apt-get install ffmpeg"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(reason)
        pytest.skip(reason)
    ha = stack.ha
    (pipeline,) = ha.ws(
        {
            "type": "assist_pipeline/pipeline/create",
            "name": "speakd",
            "language": "en",
            "conversation_engine": "conversation.home_assistant",
            "conversation_language": "en",
            "stt_engine": None,
            "stt_language": None,
            "tts_engine": "tts.speakd",
            "tts_language": "en-US",
            "tts_voice": None,
            "wake_word_entity": None,
            "wake_word_id": None,
        }
    )
    run = {"type": "assist_pipeline/run", "start_stage": "tts", "end_stage": "tts"}
    events = ha.ws(
        {**run, "input": {"text": "The pipeline speaks."}, "pipeline": pipeline["id"]},
        until="run-end",
    )
    (end,) = [e for e in events if isinstance(e, dict) and e.get("type") == "tts-end"]
    got = ha.fetch(ha.url + end["data"]["tts_output"]["url"].removeprefix(ha.url))
    assert got.status == 200 and len(got.body) > 4000 and got.body[:3] in (b"ID3", b"\xff\xfb")


def test_the_mqtt_entities_do_what_their_names_say(stack: Stack, broker: Mosquitto) -> None:
    ha, site = stack.ha, stack.site
    entry = ha.flow("mqtt", {"broker": broker.host, "port": broker.port})
    assert entry["type"] == "create_entry", entry
    ids = {
        kind: f"{kind}.speakd_{site}_{name}"
        for kind, name in [
            ("notify", "say"),
            ("button", "stop_speaking"),
            ("sensor", "state"),
            ("select", "voice"),
        ]
    }
    wait_until(lambda: all(ha.state(i) for i in ids.values()), "the discovered entities", 60)
    wait_until(lambda: ha.state(ids["sensor"])["state"] == "idle", "State idle", 30)

    long_text = " ".join(f"Notification sentence {i} is long enough to stop." for i in range(3))
    ha.call("notify", "send_message", entity_id=ids["notify"], message=long_text)
    wait_until(lambda: ha.state(ids["sensor"])["state"] == "speaking", "State speaking", 60)
    ha.call("button", "press", entity_id=ids["button"])
    wait_until(lambda: ha.state(ids["sensor"])["state"] == "idle", "Stop to stop it", 30)
    with stack.daemon.client() as c:
        assert c.request({"op": "status"})["counters"]["cancelled"] >= 1

    ha.call("select", "select_option", entity_id=ids["select"], option=TINY)
    wait_until(lambda: ha.state(ids["select"])["state"] == TINY, "the voice selected", 30)
    with stack.daemon.client() as c:
        assert c.request({"op": "status"})["voices"]["default"] == TINY
    ha.call("select", "select_option", entity_id=ids["select"], option="en_US-joe-medium")
