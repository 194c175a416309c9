"""Many voices in one real ``speakd serve``: the embedded Piper voice (22 050 Hz), a generated
two-speaker Piper voice and the tiny ChatTTS bundle (24 000 Hz) in ``voices.dir``, chosen by name,
language and speaker over every front-end — the JSON socket, ``spd-say`` (SSIP), MQTT, Wyoming
(Home Assistant's events, with and without a speaker) and the ``openai`` SDK — and played one after
another on the board's sink (WAV files here) at each voice's own rate. A reload adds a voice
dropped into the folder and names a broken one while the others keep speaking.
"""

from __future__ import annotations

import io
import json
import shutil
import wave
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from wyoming.client import AsyncUnixClient
from wyoming.tts import Synthesize, SynthesizeVoice

from tests.daemon_proc import DaemonProc
from tests.http_daemon import HttpDaemon, start_http_daemon
from tests.mosquitto import Mosquitto, Watcher
from tests.test_mqtt import finished, mqtt_toml
from tests.test_ssip import needs_spd_say, spd_say
from tests.test_wyoming import audio_of, describe, error_of, read_until
from tests.tiny_voices import tiny_multispeaker_voice

PIPER, DUO, CHAT = "en_US-joe-medium", "xx_XX-duo-low", "chattts-tiny"
SHORT = {"max_new_token": 16, "min_new_token": 16}  # random weights rarely stop by themselves


@pytest.fixture(scope="module")
def board(
    tmp_path_factory: pytest.TempPathFactory, tiny_bundle: Path, broker: Mosquitto
) -> Iterator[HttpDaemon]:
    tmp = tmp_path_factory.mktemp("voices-daemon")
    voices = tmp / "voices"
    voices.mkdir()
    tiny_multispeaker_voice(voices, DUO)
    chat = voices / CHAT
    shutil.copytree(tiny_bundle, chat)
    manifest = json.loads((chat / "manifest.json").read_text())
    manifest["defaults"] = {**manifest.get("defaults", {}), **SHORT}  # not a hashed file
    (chat / "manifest.json").write_text(json.dumps(manifest))
    extra = mqtt_toml(broker, "hall") + f'[wyoming]\nuri = "unix://{tmp / "wyoming.sock"}"\n'
    d = start_http_daemon(tmp, extra)
    yield d
    assert d.stop() == 0


def proc(board: HttpDaemon) -> DaemonProc:
    return board.proc


def played_rate(board: HttpDaemon, request_id: str) -> int:
    wav_dir = proc(board).config.parent / "wav"
    with wave.open(str(wav_dir / f"{request_id}.wav")) as w:
        assert w.getnframes() > 0
        return w.getframerate()


def say_events(board: HttpDaemon, rid: str, **fields) -> list[dict]:
    events = proc(board).say("Hello there.", id=rid, **fields)
    assert events[-1]["event"] == "finished" and events[-1]["status"] == "done", events
    return events


def say(board: HttpDaemon, rid: str, **fields) -> dict:
    return say_events(board, rid, **fields)[-1]


def test_every_front_end_lists_every_voice(board: HttpDaemon) -> None:
    with proc(board).client() as c:
        listed = {v["name"]: v for v in c.request({"op": "voices"})["voices"]}
    assert set(listed) == {PIPER, DUO, CHAT}
    assert (listed[CHAT]["sample_rate"], listed[PIPER]["sample_rate"]) == (24000, 22050)
    assert "CC BY-NC 4.0" in listed[CHAT]["licence"]
    http = httpx.get(f"{board.url}/v1/audio/voices", headers=board.auth, timeout=30).json()
    assert {v["id"] for v in http["voices"]} == {PIPER, DUO, CHAT}


def test_a_cold_voice_says_it_was_loaded_first(board: HttpDaemon) -> None:
    """The first request to a voice not in memory reports the load in its events (why its first
    audio came late); the next one does not."""
    with proc(board).client() as c:
        _, cold = c.synth({"text": "Cold start.", "voice": DUO})
        _, warm = c.synth({"text": "Warm now.", "voice": DUO})
    assert cold["voice_load_ms"] > 0 and "voice_load_ms" not in warm
    events = proc(board).say("Ni hao.", id="chat-cold", voice=CHAT)
    (started,) = [e for e in events if e["event"] == "started"]
    assert started["voice_load_ms"] > 0
    (started,) = [e for e in say_events(board, "chat-warm", voice=CHAT) if e["event"] == "started"]
    assert "voice_load_ms" not in started


def test_the_socket_chooses_by_language_name_and_speaker(board: HttpDaemon) -> None:
    say(board, "zh-1", lang="zh")
    say(board, "en-1", lang="en")
    say(board, "duo-anna", voice=DUO)
    say(board, "duo-bert", voice=DUO, speaker="bert")
    say(board, "chat-1", voice=CHAT)
    assert [played_rate(board, r) for r in ("zh-1", "en-1", "duo-anna", "chat-1")] == [
        24000,
        22050,
        22050,
        24000,
    ]
    wav_dir = proc(board).config.parent / "wav"
    assert (wav_dir / "duo-anna.wav").read_bytes() != (wav_dir / "duo-bert.wav").read_bytes()
    events = proc(board).say("Hello there.", voice=DUO, speaker="carl", id="duo-carl")
    warning, *_, done = events  # a speaker the voice lacks: its default one, and a warning
    assert warning["event"] == "warning" and warning["code"] == "unknown_speaker"
    assert "anna (0), bert (1)" in warning["message"] and done["status"] == "done"
    assert (wav_dir / "duo-carl.wav").read_bytes() == (wav_dir / "duo-anna.wav").read_bytes()
    assert board.metric("speakd_warnings_total", code="unknown_speaker", frontend="json") >= 1


@needs_spd_say
def test_spd_say_picks_a_voice_by_language_and_by_name(board: HttpDaemon) -> None:
    ssip = proc(board).config.parent / "ssip.sock"
    before = set((proc(board).config.parent / "wav").iterdir())
    assert spd_say(ssip, "-w", "-l", "zh", "Nihao.").returncode == 0
    assert spd_say(ssip, "-w", "-y", DUO, "Hello.").returncode == 0
    new = sorted(set((proc(board).config.parent / "wav").iterdir()) - before, key=_mtime)
    rates = [_rate(p) for p in new]
    assert rates == [24000, 22050]


def test_hermes_lang_over_mqtt(board: HttpDaemon, broker: Mosquitto) -> None:
    watcher = Watcher(broker, "hermes/#")
    try:
        since = watcher.mark()
        for rid, lang in (("m-zh", "zh"), ("m-en", "en")):
            say = {"text": "Hello.", "lang": lang, "id": rid, "siteId": "hall"}
            watcher.publish("hermes/tts/say", json.dumps(say))
            watcher.wait("hermes/tts/sayFinished", finished(rid, "hall"), since)
        assert not watcher.matching("hermes/error/tts", since=since)
    finally:
        watcher.close()
    assert (played_rate(board, "m-zh"), played_rate(board, "m-en")) == (24000, 22050)


async def test_wyoming_home_assistant_names_a_voice_and_a_speaker(board: HttpDaemon) -> None:
    sock = proc(board).config.parent / "wyoming.sock"
    async with AsyncUnixClient(sock, read_timeout=120) as client:
        info = await describe(client)
        voices = {v.name: v for v in info.tts[0].voices}
        assert set(voices) == {PIPER, DUO, CHAT}
        assert [s.name for s in voices[DUO].speakers or []] == ["anna", "bert"]
        assert all(v.installed for v in voices.values())

        async def rate_and_audio(**voice: str) -> tuple[int, bytes]:
            await client.write_event(Synthesize("Hello.", SynthesizeVoice(**voice)).event())
            events = await read_until(client, "audio-stop")
            assert error_of(events) is None, events
            start = next(e for e in events if e.type == "audio-start")
            return start.data["rate"], audio_of(events)

        assert (await rate_and_audio(name=CHAT))[0] == 24000
        assert (await rate_and_audio(language="zh"))[0] == 24000
        plain = await rate_and_audio(name=DUO)
        bert = await rate_and_audio(name=DUO, speaker="bert")
        assert plain[0] == bert[0] == 22050 and plain[1] != bert[1]
        # Home Assistant's shapes: speaker "0" or the voice's name on a single-speaker voice is
        # its one speaker; an unknown one on a multi-speaker voice is the default, and a warning
        # Home Assistant skips (it reads up to audio-stop) but a client can read.
        piper = await rate_and_audio(name=PIPER)
        assert await rate_and_audio(name=PIPER, speaker="0") == piper
        assert await rate_and_audio(name=PIPER, speaker=PIPER) == piper
        await client.write_event(
            Synthesize("Hello.", SynthesizeVoice(name=DUO, speaker="carl")).event()
        )
        events = await read_until(client, "audio-stop")
        assert error_of(events) is None and audio_of(events) == plain[1]
        [warning] = [e.data for e in events if e.type == "speakd-warning"]
        assert warning["code"] == "unknown_speaker" and "anna (0), bert (1)" in warning["message"]
        assert [e.type for e in events].index("speakd-warning") < [e.type for e in events].index(
            "audio-start"
        )


def test_the_openai_sdk_gets_each_voice_at_its_rate(board: HttpDaemon) -> None:
    sdk = openai.OpenAI(base_url=f"{board.url}/v1", api_key=board.token)
    for voice, rate in ((PIPER, 22050), (DUO, 22050), (CHAT, 24000)):
        audio = sdk.audio.speech.create(
            model="tts-1", voice=voice, input="Hi.", response_format="wav"
        )
        with wave.open(io.BytesIO(audio.content)) as w:
            assert w.getframerate() == rate, voice


def test_a_reload_adds_a_voice_and_names_a_broken_one(board: HttpDaemon) -> None:
    voices = proc(board).config.parent / "voices"
    tiny_multispeaker_voice(voices, "xx_XX-trio-low")
    (voices / "broken.onnx").write_bytes(b"junk")
    (voices / "broken.onnx.json").write_text("{")
    try:
        proc(board).reload()
        with proc(board).client() as c:
            names = {v["name"] for v in c.request({"op": "voices"})["voices"]}
            problems = c.request({"op": "status"})["voices"]["problems"]
        assert names == {PIPER, DUO, CHAT, "xx_XX-trio-low"}
        assert [p["source"].rsplit("/", 1)[-1] for p in problems] == ["broken.onnx"]
        say(board, "trio-1", voice="xx_XX-trio-low")
        say(board, "after-reload", voice=CHAT)  # the others keep speaking
    finally:
        for name in ("broken.onnx", "broken.onnx.json"):
            (voices / name).unlink()


def _mtime(path: Path) -> float:
    return path.stat().st_mtime


def _rate(path: Path) -> int:
    with wave.open(str(path)) as w:
        return w.getframerate()
