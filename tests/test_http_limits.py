"""The HTTP API under hostile and heavy use, over real loopback HTTP: malformed and oversized
bodies, protocol abuse, slow writers and readers, 50 concurrent clients, the limits that answer
429, and a health check that fails when the sink does."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import aiohttp
import httpx
import pytest

import speakd.lifecycle.service
from speakd.config import HttpConfig
from speakd.frontends.http.frontend import HttpFrontend
from tests.daemon_proc import InProcessDaemon, write_config
from tests.http_daemon import HttpDaemon, free_port, start_http_daemon, wav_samples
from tests.tone_engine import ToneEngine
from tests.waits import wait_until

TIMEOUT_S = 2.0  # the daemon's http.timeout_s: slow clients are cut off after it


@pytest.fixture(scope="module")
def d(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HttpDaemon]:
    daemon = start_http_daemon(
        tmp_path_factory.mktemp("http"),
        "[limits]\nmax_streams = 64\nmax_queue = 64",
        http=f"timeout_s = {TIMEOUT_S}\nmax_body_bytes = 8192",
    )
    yield daemon
    assert daemon.stop() == 0, daemon.proc.log_text()[-3000:]


# ---- bad input, slow and many clients --------------------------------------------------------


def raw(d: HttpDaemon, payload: bytes, timeout: float = 10.0) -> bytes:
    """Send bytes as they are and read the reply until the server closes or goes quiet."""
    with socket.create_connection(("127.0.0.1", d.port), timeout=timeout) as s:
        s.sendall(payload)
        chunks = []
        try:
            while data := s.recv(65536):
                chunks.append(data)
                if b"\r\n\r\n" in b"".join(chunks) and b"Content-Length" in chunks[0]:
                    head, _, rest = b"".join(chunks).partition(b"\r\n\r\n")
                    length = int(re.search(rb"Content-Length: (\d+)", head).group(1))
                    if len(rest) >= length:
                        break
        except TimeoutError:
            pass
        return b"".join(chunks)


def status_of(reply: bytes) -> int:
    match = re.match(rb"HTTP/1\.[01] (\d{3}) ", reply)
    assert match, reply[:200]
    return int(match.group(1))


def post(d: HttpDaemon, path: str, body: bytes, extra: bytes = b"") -> bytes:
    head = (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {d.token}\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n"
    ).encode()
    return raw(d, head + extra + b"\r\n" + body)


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        (b"{", 400, "bad_json"),
        (b"[" * 100_000 + b"]" * 100_000, 413, "body_too_large"),
        (b"[" * 4000 + b"]" * 4000, 400, "bad_json"),
        (b'{"text": "\xff\xfe"}', 400, "bad_encoding"),
        (b'"just a string"', 400, "bad_request"),
        (b'{"text": 12}', 400, "bad_text"),
        (b'{"text": "a\\u0000b"}', 400, "bad_text"),
        (b'{"text": "\\ud800"}', 400, "bad_text"),
        (b'{"text": "hi", "speed": 1' + b"0" * 5000 + b"}", 400, "bad_json"),
        (b'{"text": "hi", "speed": NaN}', 400, "bad_field"),
        (b'{"text": "hi", "volume": "loud"}', 400, "bad_field"),
        (b'{"text": "hi", "params": {"nope": 1}}', 400, "bad_field"),
        (b'{"text": "hi", "params": [1]}', 400, "bad_field"),
        (b'{"text": "hi", "id": {"a": 1}}', 400, "bad_field"),
        (b'{"text": "hi", "voice": 3}', 400, "bad_field"),
    ],
)
def test_hostile_say_bodies(d: HttpDaemon, body: bytes, status: int, code: str) -> None:
    reply = post(d, "/v1/say", body)
    assert reply.startswith(f"HTTP/1.1 {status} ".encode()), reply[:200]
    assert json.loads(reply.partition(b"\r\n\r\n")[2])["error"]["code"] == code


@pytest.mark.parametrize(
    "body",
    [
        b'{"input": ["a"]}',
        b'{"input": "hi", "voice": {"id": 5}}',
        b'{"input": "hi", "response_format": 3}',
        b'{"input": "hi", "stream_format": "sse"}',
        b'{"input": "hi", "speed": "fast"}',
        b"null",
    ],
)
def test_hostile_speech_bodies(d: HttpDaemon, body: bytes) -> None:
    reply = post(d, "/v1/audio/speech", body)
    assert reply.startswith(b"HTTP/1.1 400 "), reply[:300]


def test_protocol_abuse_and_the_daemon_lives_on(d: HttpDaemon) -> None:
    # aiohttp refuses what is not HTTP before any handler runs (a plain-text 4xx)
    assert status_of(raw(d, b"GARBAGE\r\n\r\n")) == 400
    assert status_of(raw(d, b"GET /" + b"a" * 20000 + b" HTTP/1.1\r\nHost: x\r\n\r\n")) in (
        400,
        414,
    )
    big = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 20000 + b"\r\n\r\n"
    assert status_of(raw(d, big)) in (400, 431)
    reply = post(d, "/nowhere", b"{}")
    assert reply.startswith(b"HTTP/1.1 404") and b'"not_found"' in reply
    delete = f"DELETE /v1/say HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {d.token}\r\n\r\n"
    reply = raw(d, delete.encode())
    assert reply.startswith(b"HTTP/1.1 405") and b'"method_not_allowed"' in reply
    reply = post(d, "/v1/say", b'{"te', extra=b"Content-Length: 100\r\n")
    assert status_of(reply) == 400  # two Content-Lengths: request smuggling, refused
    # A body that stops arriving: 408 after http.timeout_s; the connection is not held.
    t0 = time.monotonic()
    head = f"POST /v1/say HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {d.token}\r\n"
    reply = raw(d, (head + "Content-Length: 100\r\n\r\n").encode() + b'{"te', timeout=30)
    assert reply.startswith(b"HTTP/1.1 408") and b'"timeout"' in reply
    assert TIMEOUT_S - 0.1 <= time.monotonic() - t0 < TIMEOUT_S + 5
    # Headers that never end: the connection is closed after http.timeout_s.
    t0 = time.monotonic()
    assert raw(d, b"POST /v1/say HTTP/1.1\r\nHost: x\r\n", timeout=30) == b""
    assert time.monotonic() - t0 < TIMEOUT_S + 5
    assert httpx.get(f"{d.url}/healthz").json() == {"status": "ok"}
    assert d.proc.proc.poll() is None


def test_slow_reader_is_cut_off_and_its_stream_released(tmp_path: Path) -> None:
    """A client that stops reading holds a stream only for http.timeout_s. The tone engine makes
    7.7 MB of audio at once: more than the socket buffers hold, so the writer must stall."""
    port = free_port()
    http = f'[http]\nlisten = "127.0.0.1:{port}"\ntimeout_s = {TIMEOUT_S}\n'
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(speakd.lifecycle.service, "load_engine", lambda _config: ToneEngine(word_s=2.0))
        mp.delenv("NOTIFY_SOCKET", raising=False)
        d = InProcessDaemon(write_config(tmp_path, http, sink="null")).start()
    control, metrics = d.daemon.control, d.daemon.metrics
    assert control is not None and metrics is not None
    body = json.dumps({"input": " ".join(["word"] * 120), "response_format": "wav"}).encode()
    try:
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.connect(("127.0.0.1", port))
            s.sendall(
                f"POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}"
                "\r\n\r\n".encode()
                + body
            )
            wait_until(lambda: control.counters["streams"], "the stream to start", 30)
            # …and it is cut off although the client never read
            wait_until(lambda: not control.streaming, "the stalled stream's release", 30)
        labels = {"frontend": "http", "kind": "stream", "outcome": "client_gone"}
        assert metrics.registry.get_sample_value("speakd_requests_total", labels) == 1
    finally:
        assert d.stop() == 0


def test_fifty_concurrent_clients_share_one_synthesis(d: HttpDaemon) -> None:
    text = "Fifty clients ask for this sentence at the same moment."

    async def run() -> list[tuple[int, str, bytes]]:
        async with aiohttp.ClientSession(headers=d.auth) as session:

            async def one(i: int) -> tuple[int, str, bytes]:
                if i % 5 == 4:  # a fifth of them poll the status meanwhile
                    async with session.get(f"{d.url}/v1/status") as r:
                        return r.status, "status", await r.read()
                body = {"model": "tts-1", "input": text, "voice": "alloy", "response_format": "wav"}
                async with session.post(f"{d.url}/v1/audio/speech", json=body) as r:
                    return r.status, r.headers.get("X-Speakd-Cache", ""), await r.read()

            return await asyncio.gather(*(one(i) for i in range(50)))

    synth_before = d.status()["source"]["cache"]["synth"]
    results = asyncio.run(run())
    assert all(code == 200 for code, _, _ in results), [r[:2] for r in results if r[0] != 200]
    audio = {wav_samples(body)[0].tobytes() for code, kind, body in results if kind != "status"}
    assert len(audio) == 1  # every client got the same audio, streamed or cached
    assert d.status()["source"]["cache"]["synth"] == synth_before + 1  # from one synthesis


# ---- limits that need their own daemon -------------------------------------------------------


@pytest.fixture(scope="module")
def tight(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HttpDaemon]:
    """One stream at a time that no other waits for, a queue of one, and a sink that plays in
    real time."""
    daemon = start_http_daemon(
        tmp_path_factory.mktemp("tight"),
        "[limits]\nmax_streams = 1\nstream_wait_s = 0\nmax_queue = 1",
        realtime=True,
    )
    yield daemon
    assert daemon.stop() == 0


def test_busy_and_queue_full_are_429_with_retry_after(tight: HttpDaemon) -> None:
    long_text = "This sentence plays in real time, long enough to hold the queue. " * 2
    with httpx.Client(base_url=tight.url, headers=tight.auth, timeout=60) as c:
        for _ in range(3):  # one plays, one waits, the third is refused
            r = c.post("/v1/say", json={"text": long_text, "priority": "message"})
        assert r.status_code == 429 and r.json()["error"]["code"] == "queue_full"
        assert r.headers["retry-after"] == "1"
        with c.stream(
            "POST",
            "/v1/audio/speech",
            json={"input": long_text + " Streamed.", "response_format": "pcm"},
        ) as held:
            assert held.status_code == 200
            r = c.post(
                "/v1/audio/speech", json={"input": "A second stream.", "response_format": "pcm"}
            )
            assert r.status_code == 429 and r.json()["error"]["code"] == "busy"
            held.read()
        c.post("/v1/stop")


def test_healthz_503_when_the_audio_device_is_unusable(tmp_path: Path) -> None:
    env = {"SPEAKD_AUDIO_DEVICE": "no-such-device-anywhere"}
    daemon = start_http_daemon(tmp_path, sink="sounddevice", env=env)
    try:
        with httpx.Client(base_url=daemon.url, headers=daemon.auth, timeout=60) as c:
            r = c.post("/v1/say", json={"text": "Nobody will hear this.", "wait": True})
            assert r.status_code == 503 and r.json()["error"]["code"] == "audio_unavailable"
            health = c.get("/healthz")
            assert health.status_code == 503
            assert health.json()["reasons"][0].startswith("audio unavailable")
    finally:
        assert daemon.stop() == 0


def test_a_reload_changes_the_token(tmp_path: Path) -> None:
    daemon = start_http_daemon(tmp_path)
    try:
        config = daemon.proc.config
        config.write_text(config.read_text().replace(daemon.token, "the-new-token"))
        daemon.proc.proc.send_signal(signal.SIGHUP)
        status = f"{daemon.url}/v1/status"
        wait_until(
            lambda: httpx.get(status, headers=daemon.auth).status_code == 401,
            "the old token to stop working",
            30,
        )
        new = {"Authorization": "Bearer the-new-token"}
        assert httpx.get(f"{daemon.url}/v1/status", headers=new).json()["reloads"] == 1
    finally:
        assert daemon.stop() == 0


def test_health_names_an_open_breaker_and_an_unusable_sink() -> None:
    status = {
        "breaker": {"state": "open", "last_error": "EngineTimeout: no audio for 30 s"},
        "audio": {"sink": "sounddevice", "available": False, "error": "no device"},
    }
    control = SimpleNamespace(status=lambda: status)
    frontend = HttpFrontend(control, HttpConfig(listen="127.0.0.1:1"))  # type: ignore[arg-type]
    assert frontend.health() == [
        "engine unavailable: circuit breaker open (EngineTimeout: no audio for 30 s)",
        "audio unavailable: no device",
    ]
    status["breaker"]["state"], status["audio"]["available"] = "half-open", True
    assert frontend.health() == []
