"""The HTTP API end to end: a real daemon and real clients — the official ``openai`` SDK unchanged,
``httpx`` and ``curl`` — over loopback HTTP: every endpoint, every format, auth, metrics and
health. Hostile and heavy use: tests/test_http_limits.py; the page: tests/test_http_page.py."""

from __future__ import annotations

import io
import json
import subprocess
import wave
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest
import soundfile

from speakd.audio import read_wav
from speakd.audio.encode import ENCODER_DELAY
from tests.daemon_proc import synth
from tests.http_daemon import HttpDaemon, start_http_daemon, wav_samples

HELLO = "Hello from speakd. The door is open."


@pytest.fixture(scope="module")
def d(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HttpDaemon]:
    daemon = start_http_daemon(tmp_path_factory.mktemp("http"), "[limits]\nmax_text_chars = 400")
    yield daemon
    assert daemon.stop() == 0, daemon.proc.log_text()[-3000:]


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> np.ndarray:
    """``speakd synth`` of HELLO without a daemon: what every format must carry."""
    return read_wav(synth(HELLO, tmp_path_factory.mktemp("ref") / "hello.wav")).samples()


@pytest.fixture
def sdk(d: HttpDaemon) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{d.url}/v1", api_key=d.token, max_retries=0, timeout=60)


@pytest.fixture
def http(d: HttpDaemon) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=d.url, headers=d.auth, timeout=60) as client:
        yield client


def decode(data: bytes) -> tuple[np.ndarray, int]:
    """Any compressed format back to int16 samples, through FFmpeg (PyAV): an outside decoder."""
    av = pytest.importorskip("av")
    with av.open(io.BytesIO(data)) as container:
        frames = list(container.decode(audio=0))
    rate = frames[0].sample_rate
    samples = np.concatenate([f.to_ndarray().reshape(-1) for f in frames])
    if samples.dtype.kind == "f":
        samples = (samples * 32767).astype(np.int16)
    return samples, rate


# ---- the openai SDK, unchanged --------------------------------------------------------------


def test_openai_sdk_wav_is_the_engine_audio_streamed_then_cached(
    d: HttpDaemon, sdk: openai.OpenAI, reference: np.ndarray
) -> None:
    first = sdk.audio.speech.create(
        model="tts-1", voice="alloy", input=HELLO, response_format="wav"
    )
    assert first.response.headers["x-speakd-cache"] == "miss"
    if first.response.headers.get("transfer-encoding") == "chunked":  # streamed as synthesised
        assert first.content[4:8] == b"\xff\xff\xff\xff"  # length unknown, as OpenAI does
    else:  # a loaded machine may finish the synthesis before the response starts: sent whole
        assert first.response.headers["content-length"] == str(len(first.content))
    samples, rate = wav_samples(first.content)
    assert rate == 22050 and np.array_equal(samples, reference)
    again = sdk.audio.speech.create(
        model="speakd", voice="alloy", input=HELLO, response_format="wav"
    )
    assert again.response.headers["x-speakd-cache"] == "hit"
    with wave.open(io.BytesIO(again.content)) as w:  # whole: exact sizes
        assert w.getnframes() == len(reference)
        assert np.array_equal(np.frombuffer(w.readframes(len(reference)), "<i2"), reference)


@pytest.mark.parametrize("fmt", ["mp3", "opus", "flac", "wav"])
def test_openai_sdk_miss_and_hit_decode_whole_with_libsndfile_and_ffmpeg(
    sdk: openai.OpenAI, fmt: str
) -> None:
    """libsndfile (``soundfile.read``) takes a file's length from its header, so a streamed miss
    must carry a true length or none: it decodes as long as the hit, within one frame, except
    MP3's encoder delay and padding that only a whole file's Info tag trims
    (speakd.audio.encode)."""
    text = f"The {fmt} clip, streamed once and cached. The door is open."
    decoded, chunked = [], []
    for cached in ("miss", "hit"):
        response = sdk.audio.speech.create(
            model="tts-1", voice="nova", input=text, response_format=fmt
        )
        assert response.response.headers["x-speakd-cache"] == cached
        chunked.append(response.response.headers.get("transfer-encoding") == "chunked")
        samples, rate = soundfile.read(io.BytesIO(response.content), dtype="int16")
        assert rate == (48000 if fmt == "opus" else 22050)
        assert np.sqrt(np.mean(samples.astype(np.float64) ** 2)) > 300  # speech, not silence
        assert len(decode(response.content)[0]) == len(samples)  # FFmpeg agrees
        decoded.append(samples)
    miss, hit = decoded
    assert not chunked[1] and not (fmt == "flac" and chunked[0])  # hits and FLAC go whole
    frame = {"mp3": 576, "opus": 960}.get(fmt, 1)  # samples per frame (Layer III at 22 kHz)
    late = ENCODER_DELAY if fmt == "mp3" and chunked[0] else 0
    assert 0 <= len(miss) - late - len(hit) < (2 * frame if late else frame)
    if fmt in ("flac", "wav"):  # lossless
        assert np.array_equal(miss, hit)
    pcm, _ = wav_samples(  # the clip itself, from the cache
        sdk.audio.speech.create(
            model="tts-1", voice="nova", input=text, response_format="wav"
        ).content
    )
    assert abs(len(hit) - len(pcm) * rate / 22050) < frame
    if fmt == "flac":
        assert np.array_equal(hit, pcm)


def test_openai_sdk_streaming_response_pcm_is_24khz(d: HttpDaemon, sdk: openai.OpenAI) -> None:
    text = "Streaming raw PCM to a client that plays it as it comes."
    bodies = []
    for cached in ("miss", "hit"):
        with sdk.audio.speech.with_streaming_response.create(
            model="tts-1", voice="echo", input=text, response_format="pcm", speed=1.0
        ) as response:
            assert response.headers["x-speakd-cache"] == cached
            assert response.headers["x-sample-rate"] == "24000"
            assert response.headers["content-type"] == "audio/pcm"
            bodies.append(b"".join(response.iter_bytes(4096)))
    miss, hit = (np.frombuffer(body, "<i2").astype(int) for body in bodies)
    # the miss is resampled window by window as VITS decodes, the hit (one stored clip) at once
    assert len(miss) == len(hit) and np.abs(miss - hit).max() <= 2  # rounding at chunk edges
    assert 2.0 < len(bodies[0]) / 2 / 24000 < 6.0


def test_openai_sdk_speakd_voice_extras_and_ignored_fields(sdk: openai.OpenAI) -> None:
    response = sdk.audio.speech.create(
        model="whatever-model",
        voice="en_US-joe-medium",
        input="Extra fields ride along.",
        response_format="wav",
        instructions="Speak like a pirate.",  # ignored, as the issue says
        extra_body={"seed": 7, "params": {"noise_scale": 0.0}, "unknown_field": [1, 2]},
    )
    plain = wav_samples(response.content)[0]
    assert plain.size > 10000
    pitched = sdk.audio.speech.create(
        model="tts-1",
        voice="en_US-joe-medium",
        input="Extra fields ride along.",
        response_format="wav",
        extra_body={"seed": 7, "params": {"noise_scale": 0.0}, "pitch": 4},
    )
    shifted = wav_samples(pitched.content)[0]
    # resampled pitch (docs/ssml.md#pitch): the length within a few per cent
    assert abs(shifted.size / plain.size - 1) < 0.08 and not np.array_equal(shifted, plain)


def test_openai_sdk_errors(d: HttpDaemon, sdk: openai.OpenAI) -> None:
    wrong = openai.OpenAI(base_url=f"{d.url}/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        wrong.audio.speech.create(model="tts-1", voice="alloy", input="hi")
    with pytest.raises(openai.BadRequestError, match="supported: mp3, opus, flac, wav, pcm"):
        sdk.audio.speech.create(model="tts-1", voice="alloy", input="hi", response_format="aac")
    for fields, code in (
        ({"voice": "nobody"}, "unknown_voice"),
        ({"input": "   "}, "empty_text"),
        ({"speed": 9.0}, "bad_field"),
    ):
        with pytest.raises(openai.BadRequestError) as e:
            sdk.audio.speech.create(**{"model": "tts-1", "voice": "alloy", "input": "hi", **fields})
        assert e.value.code == code
    with pytest.raises(openai.APIStatusError) as e:
        sdk.audio.speech.create(model="tts-1", voice="alloy", input="x" * 401)
    assert e.value.status_code == 413 and e.value.code == "text_too_long"


def test_models_and_voices(d: HttpDaemon, sdk: openai.OpenAI, http: httpx.Client) -> None:
    assert {"tts-1", "speakd"} <= {m.id for m in sdk.models.list()}
    assert sdk.models.retrieve("tts-1-hd").id == "tts-1-hd"
    voices = http.get("/v1/audio/voices").json()
    assert voices["default"] == "en_US-joe-medium"
    assert [v["id"] for v in voices["voices"]] == ["en_US-joe-medium"]
    assert [v["languages"] for v in voices["voices"]] == [["en-US"]]  # BCP 47
    assert "alloy" in voices["openai_voices"]
    assert {o["name"] for o in voices["options"]} >= {"noise_scale", "noise_w"}
    assert voices["formats"] == ["mp3", "opus", "flac", "wav", "pcm"]


# ---- speakd's own endpoints -----------------------------------------------------------------


def test_say_wait_plays_on_the_board(d: HttpDaemon, http: httpx.Client) -> None:
    r = http.post("/v1/say", json={"text": "Played over HTTP.", "id": "h-say", "wait": True})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["event"] == "finished" and body["status"] == "done" and body["id"] == "h-say"
    assert [e["event"] for e in body["events"]] == ["queued", "started", "finished"]
    assert read_wav(d.proc.config.parent / "wav" / "h-say.wav").duration > 0.5


def test_say_without_wait_is_accepted_then_cancel_stop_status(
    d: HttpDaemon, http: httpx.Client
) -> None:
    r = http.post("/v1/say", json={"text": "Queued, not awaited.", "priority": "notification"})
    assert r.status_code == 202 and r.json()["event"] in ("queued", "finished")
    assert http.post("/v1/cancel", json={"id": "no-such-request"}).json() == {"cancelled": 0}
    assert http.post("/v1/cancel").status_code == 200
    assert http.post("/v1/stop").json()["stopped"] >= 0
    s = http.get("/v1/status").json()
    assert s["engine"]["kind"] == "vits" and s["max_queue"] == 32
    r = http.post("/v1/say", json={"text": "x", "priority": "urgent"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "bad_priority"
    r = http.post("/v1/say", json={"text": "x", "wait": "yes"})
    assert r.json()["error"]["code"] == "bad_field"


# ---- operations ------------------------------------------------------------------------------


def test_healthz_and_metrics_count_every_front_end(d: HttpDaemon, http: httpx.Client) -> None:
    r = httpx.get(f"{d.url}/healthz")  # no token needed
    assert r.status_code == 200 and r.json() == {"status": "ok"}
    assert httpx.get(f"{d.url}/metrics").status_code == 401
    before = d.metric("speakd_requests_total", frontend="json", kind="say", outcome="done")
    with d.proc.client() as c:  # the socket front-end is counted too
        events = list(c.say({"text": "Counted from the socket."}, wait=True))
        assert events[-1]["status"] == "done"
    after = d.metric("speakd_requests_total", frontend="json", kind="say", outcome="done")
    assert after == before + 1
    http.post("/v1/audio/speech", json={"input": HELLO, "response_format": "wav"})
    assert d.metric("speakd_requests_total", frontend="http", kind="stream", outcome="done") >= 1
    assert d.metric("speakd_cache_hits_total") >= 1
    assert d.metric("speakd_cache_misses_total") >= 1
    assert d.metric("speakd_cache_bytes") > 0
    assert d.metric("speakd_first_audio_seconds_count", kind="say") >= 1
    assert d.metric("speakd_first_audio_seconds_count", kind="stream") >= 1
    assert d.metric("speakd_synthesis_rtf_count") >= 1
    assert d.metric("speakd_breaker_state", state="closed") == 1
    assert d.metric("speakd_queue_length") == 0
    assert d.metric("speakd_http_responses_total", route="/v1/audio/speech", status="200") >= 1


def test_curl(d: HttpDaemon, tmp_path: Path, reference: np.ndarray) -> None:
    out = tmp_path / "hello.wav"
    auth = f"Authorization: Bearer {d.token}"
    body = json.dumps(
        {"model": "tts-1", "input": HELLO, "voice": "alloy", "response_format": "wav"}
    )
    r = subprocess.run(
        ["curl", "-fsS", "--no-buffer", "-H", auth, "-H", "Content-Type: application/json",
         "-d", body, "-o", str(out), f"{d.url}/v1/audio/speech"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert np.array_equal(read_wav(out).samples(), reference)
    r = subprocess.run(
        ["curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}", "-d", body,
         f"{d.url}/v1/audio/speech"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert r.stdout == "401"
    r = subprocess.run(
        ["curl", "-sS", "-H", auth, "-d", '{"text":"curl says hi","wait":true}',
         f"{d.url}/v1/say"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert json.loads(r.stdout)["status"] == "done"


def test_auth(d: HttpDaemon) -> None:
    for headers in (
        {},
        {"Authorization": "Bearer wrong"},
        {"Authorization": f"Basic {d.token}"},
        {"Authorization": f"Bearer {d.token}x"},
        {"Authorization": "Bearer"},
    ):
        r = httpx.get(f"{d.url}/v1/status", headers=headers)
        assert r.status_code == 401, headers
        assert r.json()["error"]["code"] == "unauthorized"
        assert r.headers["www-authenticate"].startswith("Bearer")
    assert httpx.get(
        f"{d.url}/v1/status", headers={"Authorization": f"bearer {d.token}"}
    ).is_success
    for path in ("/", "/index.js", "/index.css", "/healthz"):  # no data in them
        assert httpx.get(f"{d.url}{path}").status_code == 200, path
