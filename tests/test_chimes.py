"""Chimes and ``<audio src>`` end to end: a real ``speakd serve`` (embedded Piper voice, realtime
WAV sink) whose cache holds a prompt pack made by ``speakd-tools precompute`` and imported, driven
over its JSON socket, HTTP and SSIP sockets. A chime and the text are one stream with no gap, at
the loudness target; a cancel during the chime ends all of it; unknown names are coded errors."""

from __future__ import annotations

import json
from typing import Any

import httpx
import numpy as np
import pytest
import soxr

from speakd.audio import AudioChunk, read_wav, scale_volume
from speakd.cache.packs import import_pack
from speakd.cache.store import CacheStore
from speakd.request.loudness import integrated_loudness
from speakd.request.sounds import Sounds, chime_key
from tests.http_daemon import HttpDaemon, start_http_daemon, wav_samples
from tests.ssip_harness import SsipClient
from tests.test_ssml_daemon import synth as socket_synth
from tests.tiny_voices import tiny_multispeaker_voice

RATE = 22050  # the embedded voice's, and the built-in chimes'
PROMPT = "Mind the gap."
TINY, TINY_RATE = "xx_XX-tiny-low", 16000  # a generated voice (tests/tiny_voices.py)
TEXT = "Doors closing."


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory):
    from speakd_tools.precompute import main as precompute_main

    tmp = tmp_path_factory.mktemp("chimes")
    prompts, pack = tmp / "prompts.txt", tmp / "pack.db"
    prompts.write_text(PROMPT + "\n")
    assert precompute_main([str(prompts), "--out", str(pack), "--no-progress"]) == 0
    with CacheStore(tmp / "daemon" / "cache.db") as store:
        assert import_pack(store, pack) == (1, 1)
    (tmp / "daemon" / "voices").mkdir(parents=True)
    tiny = tiny_multispeaker_voice(tmp / "daemon" / "voices", TINY)
    config = json.loads(tiny.with_suffix(".onnx.json").read_text())
    config["audio"]["sample_rate"] = TINY_RATE  # a voice at another rate than the chimes'
    tiny.with_suffix(".onnx.json").write_text(json.dumps(config))
    d = start_http_daemon(tmp / "daemon", realtime=True)
    yield d
    assert d.stop() == 0, d.proc.log_text()


@pytest.fixture(scope="module")
def clip(served: HttpDaemon) -> np.ndarray:
    """The pinned clip's samples as the pack stored them (made at the daemon's -20 LUFS)."""
    with CacheStore(served.proc.config.parent / "cache.db") as store:
        [pinned] = [c for c in store.clips(pinned_only=True) if c.text == PROMPT]
    assert pinned.sample_rate == RATE and pinned.params["loudness"]["lufs"] == -20.0
    return np.frombuffer(pinned.audio, dtype="<i2")


def chime(name: str) -> np.ndarray:
    """A built-in chime at the daemon's loudness target (-20 LUFS, the default)."""
    sounds = Sounds(loudness=-20.0)
    sound = sounds.find(name)
    assert sound is not None
    return sounds.audio(sound, lambda key: None).samples()


def synth(
    d: HttpDaemon, rate: int = RATE, **fields: Any
) -> tuple[np.ndarray, list[dict[str, Any]]]:
    return socket_synth(d.proc, rate, **fields)


def played(d: HttpDaemon, request_id: str) -> np.ndarray:
    return read_wav(d.proc.config.parent / "wav" / f"{request_id}.wav").samples()


def zeros_at_end(pcm: np.ndarray) -> int:
    return len(pcm) - (np.flatnonzero(pcm)[-1] + 1)


def zeros_at_start(pcm: np.ndarray) -> int:
    return int(np.flatnonzero(pcm)[0])


def test_a_chime_and_the_text_are_one_gapless_stream_at_the_target(served: HttpDaemon) -> None:
    """The chime's samples, then the text's own clip from its first sample: no gap but the
    chime's own fade and the voice's leading silence."""
    pcm, events = synth(served, text=TEXT, chime="ding")
    text, _ = synth(served, text=TEXT)
    ding = chime("ding")
    assert events[-1]["event"] == "finished" and events[-1]["status"] == "done"
    assert np.array_equal(pcm, np.concatenate([ding, text]))
    junction = pcm[len(ding) - zeros_at_end(ding) : len(ding) + zeros_at_start(text)]
    assert not junction[1:-1].any() and len(junction) < 0.05 * RATE
    measured = integrated_loudness(pcm[: len(ding)] / 32768.0, RATE)
    assert measured == pytest.approx(-20.0, abs=1.0)


def test_a_chime_is_resampled_whole_to_a_voice_of_another_rate(served: HttpDaemon) -> None:
    pcm, events = synth(served, TINY_RATE, text=TEXT, chime="ding", voice=TINY)
    text, _ = synth(served, TINY_RATE, text=TEXT, voice=TINY)
    assert events[-1]["status"] == "done"
    ding = soxr.resample(chime("ding"), RATE, TINY_RATE)  # one call: no delay, no tail held
    assert len(ding) == round(len(chime("ding")) * TINY_RATE / RATE)
    assert np.array_equal(pcm, np.concatenate([ding, text]))


def test_explain_shows_the_chime_before_the_text(served: HttpDaemon) -> None:
    with served.proc.client() as c:
        explained = c.request({"op": "explain", "text": TEXT, "chime": "ding"})
    sound, text = explained["parts"]
    assert sound == {"sound": "ding", "key": chime_key("ding")}
    assert text["text"] == TEXT


def test_speakd_say_takes_a_chime_and_explains_it(served: HttpDaemon) -> None:
    r = served.proc.cli("say", TEXT, "--chime", "ding-dong", "--explain")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0] == "(sound ding-dong)"
    r = served.proc.cli("say", TEXT, "--chime", "ding", "--id", "cli-chime", "--wait")
    assert r.returncode == 0, r.stderr
    text, _ = synth(served, text=TEXT)
    assert np.array_equal(played(served, "cli-chime"), np.concatenate([chime("ding"), text]))


def test_the_requests_volume_applies_to_the_chime_too(served: HttpDaemon) -> None:
    events = served.proc.say(TEXT, chime="ding", volume=0.5, priority="important", id="soft")
    assert events[-1]["status"] == "done"
    text, _ = synth(served, text=TEXT)
    whole = AudioChunk(np.concatenate([chime("ding"), text]).tobytes(), RATE)
    assert np.array_equal(played(served, "soft"), scale_volume(whole, 0.5).samples())


def test_a_pinned_clip_is_a_chime_by_its_text_on_http_say(served: HttpDaemon, clip) -> None:
    said = httpx.post(
        f"{served.url}/v1/say",
        json={"text": TEXT, "chime": PROMPT, "wait": True, "id": "h-chime"},
        headers=served.auth,
        timeout=60,
    ).json()
    assert said["status"] == "done", said
    text, _ = synth(served, text=TEXT)
    assert np.array_equal(played(served, "h-chime"), np.concatenate([clip, text]))


def test_openai_speech_takes_a_chime_as_speakd_field(served: HttpDaemon) -> None:
    """``chime`` rides along ``/v1/audio/speech`` as the SDK's ``extra_body`` would send it."""
    r = httpx.post(
        f"{served.url}/v1/audio/speech",
        json={
            "model": "tts-1",
            "input": TEXT,
            "voice": "alloy",
            "response_format": "wav",
            "chime": "ding",
        },
        headers=served.auth,
        timeout=60,
    )
    assert r.status_code == 200, r.text
    pcm, rate = wav_samples(r.content)
    text, _ = synth(served, text=TEXT)
    assert rate == RATE and np.array_equal(pcm, np.concatenate([chime("ding"), text]))


def test_audio_src_plays_the_pinned_clip_else_its_content(served: HttpDaemon, clip) -> None:
    text, _ = synth(served, text=TEXT)
    pcm, events = synth(served, text=f'<speak><audio src="{PROMPT}"/> {TEXT}</speak>')
    assert events[-1]["status"] == "done"
    assert np.array_equal(pcm, np.concatenate([clip, text]))
    alt, events = synth(served, text=f'<speak><audio src="Not a clip.">{TEXT}</audio></speak>')
    assert np.array_equal(alt, text)  # SSML's alternate content, said instead
    assert [e.get("code") for e in events if e["event"] == "warning"] == ["unknown_clip"]
    pcm, events = synth(served, text=f'<speak>{TEXT} <audio src="Not a clip."/></speak>')
    assert np.array_equal(pcm, text)  # no content: the clip is skipped, the rest spoken
    warning, *_, done = events
    assert (warning["event"], warning["code"]) == ("warning", "unknown_clip")
    assert done["status"] == "done"


def test_http_says_a_skipped_clip_in_a_header_and_counts_it(served: HttpDaemon) -> None:
    r = httpx.post(
        f"{served.url}/v1/audio/speech",
        json={
            "input": f'<speak>{TEXT} <audio src="Not a clip."/></speak>',
            "voice": "alloy",
            "response_format": "wav",
        },
        headers=served.auth,
        timeout=60,
    )
    assert r.status_code == 200, r.text
    assert r.headers["x-speakd-warnings"] == "unknown_clip"
    assert np.array_equal(wav_samples(r.content)[0], synth(served, text=TEXT)[0])
    assert served.metric("speakd_warnings_total", code="unknown_clip", frontend="http") >= 1


def test_an_unknown_chime_is_refused_counted_and_the_daemon_serves_on(
    served: HttpDaemon,
) -> None:
    _, events = synth(served, text=TEXT, chime="klaxon")
    assert events == [
        {
            "event": "error",
            "id": "s",
            "code": "unknown_chime",
            "message": "unknown chime 'klaxon' (built-in: ding, ding-dong, attention; or the "
            "text of a pinned clip)",
        }
    ]
    r = httpx.post(
        f"{served.url}/v1/say",
        json={"text": TEXT, "chime": "klaxon"},
        headers=served.auth,
        timeout=30,
    )
    assert r.status_code == 400 and r.json()["error"]["code"] == "unknown_chime"
    refused = {"kind": "refused", "outcome": "unknown_chime"}
    assert served.metric("speakd_requests_total", frontend="json", **refused) == 1
    assert served.metric("speakd_requests_total", frontend="http", **refused) == 1
    assert served.proc.say(TEXT, id="after")[-1]["status"] == "done"
    assert served.status()["chimes"] == ["ding", "ding-dong", "attention", PROMPT]


def test_a_cancel_during_the_chime_ends_the_whole_request(served: HttpDaemon) -> None:
    """Played in real time: cancelled once playback started, within the 1.4 s chime, the file
    holds part of the chime and nothing of the text."""
    with served.proc.client() as c, served.proc.client() as other:
        events = []
        for event in c.say({"text": TEXT, "chime": "attention", "id": "c1"}, wait=True):
            events.append(event)
            if event["event"] == "started":
                assert other.request({"op": "cancel", "id": "c1"})["cancelled"] == 1
    assert events[-1] == {"event": "finished", "id": "c1", "status": "cancelled"}
    pcm = played(served, "c1")
    attention = chime("attention")
    assert 0 < len(pcm) < len(attention)
    assert np.array_equal(pcm, attention[: len(pcm)])


def test_ssip_chime_before_each_speak_and_a_sound_icon_alone(served: HttpDaemon) -> None:
    text, _ = synth(served, text=TEXT)
    with SsipClient(served.proc.config.parent / "ssip.sock", timeout=30) as c:
        assert c.code("SET SELF NOTIFICATION END ON") == 220
        assert c.command("SET SELF CHIME klaxon") == ["418 ERR UNKNOWN CHIME"]
        assert c.command("SET SELF CHIME ding-dong") == ["280 OK CHIME SET"]
        first = c.speak(TEXT)
        c.wait_event(702, first, timeout=30)
        assert c.command(f"SET SELF CHIME {PROMPT}") == ["280 OK CHIME SET"]  # spaces and all
        assert c.command("SET SELF CHIME NONE") == ["280 OK CHIME SET"]
        second = c.speak(TEXT)
        c.wait_event(702, second, timeout=30)
        unit = c.command("SOUND_ICON attention")  # a sound alone, as speechd's sound icons
        assert unit[-1] == "225 OK MESSAGE QUEUED"
        icon = int(unit[0][4:])
        c.wait_event(702, icon, timeout=30)
    assert np.array_equal(
        played(served, f"ssip-{first}"), np.concatenate([chime("ding-dong"), text])
    )
    assert np.array_equal(played(served, f"ssip-{second}"), text)
    assert np.array_equal(played(served, f"ssip-{icon}"), chime("attention"))
