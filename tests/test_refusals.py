"""Every refusal is counted: a real daemon with all five front-ends (JSON socket, SSIP, MQTT over a
real mosquitto, Wyoming, HTTP) is sent requests it must turn away, one error code at a time, and
``speakd_requests_total{frontend, kind, outcome}`` grows by exactly one for each — whether the
front-end refused it itself (a line that is not JSON) or ``Control.build_request`` did (an
unknown voice), or the queue or the cache did (counted with the say's outcome)."""

from __future__ import annotations

import asyncio
import json
import re
import socket
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import httpx
import pytest
from wyoming.client import AsyncTcpClient
from wyoming.event import Event
from wyoming.tts import (
    Synthesize,
    SynthesizeChunk,
    SynthesizeStart,
    SynthesizeStop,
    SynthesizeVoice,
)

from tests.daemon_proc import DaemonProc, start_daemon, write_config
from tests.http_daemon import TOKEN, free_port
from tests.mosquitto import Mosquitto
from tests.ssip_harness import SsipClient
from tests.test_mqtt import mosquitto_cli, mosquitto_pub
from tests.waits import wait_until

MAX_TEXT = 400
MAX_LINE = 4096
SITE = "hall"


@dataclass
class Daemon:
    proc: DaemonProc
    http: str  # http://127.0.0.1:PORT
    wyoming: int
    broker: Mosquitto

    def requests(self, frontend: str, kind: str, outcome: str) -> float:
        text = httpx.get(
            f"{self.http}/metrics", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10
        ).text
        labels = f'frontend="{frontend}",kind="{kind}",outcome="{outcome}"'
        match = re.search(rf"^speakd_requests_total{{{labels}}} (\S+)$", text, re.M)
        return float(match.group(1)) if match else 0.0


@pytest.fixture(scope="module")
def d(tmp_path_factory: pytest.TempPathFactory, broker: Mosquitto) -> Iterator[Daemon]:
    tmp = tmp_path_factory.mktemp("refusals")
    http, wyoming = free_port(), free_port()
    extra = f"""
[limits]
max_text_chars = {MAX_TEXT}
max_line_bytes = {MAX_LINE}
max_queue = 1
[http]
listen = "127.0.0.1:{http}"
token = "{TOKEN}"
[wyoming]
uri = "tcp://127.0.0.1:{wyoming}"
[mqtt]
enabled = true
host = "{broker.host}"
port = {broker.port}
site_id = "{SITE}"
"""
    proc = start_daemon(write_config(tmp, extra, sink="null", realtime=True))
    daemon = Daemon(proc, f"http://127.0.0.1:{http}", wyoming, broker)
    online = subprocess.run(  # retained once the daemon has subscribed
        mosquitto_cli("mosquitto_sub", broker, "-t", f"speakd/{SITE}/availability", "-C", "1",
                      "-W", "30"),
        capture_output=True, text=True, timeout=40,
    )  # fmt: skip
    assert online.stdout.strip() == "online", online
    yield daemon
    assert proc.stop() == 0, proc.log_text()[-3000:]


# ---- how each front-end is refused ------------------------------------------------------------


def json_line(line: bytes) -> Callable[[Daemon], None]:
    def send(d: Daemon) -> None:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(30)
            s.connect(d.proc.socket)
            s.sendall(line + b"\n")
            replies = s.makefile("rb")
            while b'"error"' not in replies.readline():  # a say refused later: queued first
                pass

    return send


def json_say(fields: dict) -> Callable[[Daemon], None]:
    return json_line(json.dumps({"op": "say", **fields}).encode())


def json_queue_full(d: Daemon) -> None:
    """max_queue = 1: a long say plays, the next waits, one more is refused (messages: a
    `text` would replace the one waiting)."""
    with d.proc.client() as c:
        for n in range(4):  # one refusal, then no more
            say = {"text": f"Long say {n} to fill the queue. " * 4, "priority": "message"}
            if c.request(say).get("code"):
                break
        c.request({"op": "stop"})


def ssip_speak(body: bytes) -> Callable[[Daemon], None]:
    def speak(d: Daemon) -> None:
        with SsipClient(d.proc.config.parent / "ssip.sock", timeout=30) as c:
            assert c.code("SET SELF CLIENT_NAME test:refusals:main") == 208
            assert c.code("SPEAK") == 230
            c.send(body + b"\r\n.\r\n")
            assert not c.reply()[-1].startswith("2"), "refused"

    return speak


def mqtt_say(payload: str) -> Callable[[Daemon], None]:
    return lambda d: mosquitto_pub(d.broker, f"speakd/{SITE}/say", payload)


def wyoming(*events: Event) -> Callable[[Daemon], None]:
    async def send(port: int) -> None:
        async with AsyncTcpClient("127.0.0.1", port) as client:
            for event in events:
                await client.write_event(event)
            while (reply := await asyncio.wait_for(client.read_event(), 30)) is not None:
                if reply.type == "error":
                    return

    return lambda d: asyncio.run(send(d.wyoming))


def http_post(path: str, body: bytes | dict) -> Callable[[Daemon], None]:
    def post(d: Daemon) -> None:
        content = body if isinstance(body, bytes) else json.dumps(body).encode()
        r = httpx.post(
            f"{d.http}{path}",
            content=content,
            headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
            timeout=30,
        )
        assert r.status_code >= 400, r.text

    return post


NOBODY = SynthesizeVoice(name="nobody")
WHITESPACE_STREAM = (SynthesizeStart().event(), SynthesizeChunk("  \n ").event())
WHITESPACE_STREAM += (Synthesize("  \n ").event(), SynthesizeStop().event())
SPEAK = "/v1/audio/speech"
SPEECH = {"model": "tts-1", "voice": "alloy", "input": "Refused over HTTP."}

CASES: list[tuple[str, str, str, Callable[[Daemon], None]]] = [
    # the JSON socket: refused by the front-end, then by build_request, then by the queue/cache
    ("json", "refused", "bad_json", json_line(b"{not json")),
    ("json", "refused", "bad_request", json_line(b"[1, 2]")),
    ("json", "refused", "unknown_op", json_line(b'{"op": "dance"}')),
    ("json", "refused", "bad_encoding", json_line(b'{"text": "\xff\xfe"}')),
    ("json", "refused", "line_too_long", json_line(b'{"text": "' + b"a" * MAX_LINE + b'"}')),
    ("json", "refused", "empty_text", json_say({"text": "   "})),
    ("json", "refused", "text_too_long", json_say({"text": "a" * (MAX_TEXT + 1)})),
    ("json", "refused", "bad_text", json_say({"text": "a\u0000b"})),
    ("json", "refused", "bad_field", json_say({"text": "Hi.", "speed": 9})),
    ("json", "refused", "bad_priority", json_say({"text": "Hi.", "priority": "urgent"})),
    ("json", "refused", "unknown_voice", json_say({"text": "Hi.", "voice": "nobody"})),
    ("json", "refused", "unknown_language", json_say({"text": "Hi.", "lang": "xx"})),
    ("json", "say", "not_cached", json_say({"text": "Never said before.", "cache_only": True})),
    ("json", "say", "queue_full", json_queue_full),
    # SSIP: a SPEAK whose body is too long or not UTF-8, and one build_request refuses
    ("ssip", "refused", "text_too_long", ssip_speak(b"a" * 1000 + (b"\r\n" + b"a" * 1000) * 6)),
    ("ssip", "refused", "bad_encoding", ssip_speak(b"\xff\xfe")),
    ("ssip", "refused", "text_too_long", ssip_speak(b"a" * (MAX_TEXT + 1))),
    # MQTT: a payload that is not JSON, a field build_request refuses
    ("mqtt", "refused", "bad_json", mqtt_say("{not json")),
    ("mqtt", "refused", "empty_text", mqtt_say('{"text": ""}')),
    ("mqtt", "refused", "unknown_voice", mqtt_say('{"text": "Hi.", "voice": "nobody"}')),
    # Wyoming: a malformed event (the front-end), a voice build_request refuses
    ("wyoming", "refused", "bad_event", wyoming(Event("synthesize", {"text": "Hi", "voice": "x"}))),
    ("wyoming", "refused", "unknown_voice", wyoming(Synthesize("Hi.", NOBODY).event())),
    ("wyoming", "refused", "bad_text", wyoming(Event("synthesize", {"text": 5}))),
    ("wyoming", "refused", "empty_text", wyoming(Synthesize(" \t ").event())),
    ("wyoming", "refused", "empty_text", wyoming(*WHITESPACE_STREAM)),  # as HA 2026 sends it
    # HTTP: what the handlers check (body, format, wait), then build_request
    ("http", "refused", "bad_json", http_post(SPEAK, b"{not json")),
    ("http", "refused", "bad_format", http_post(SPEAK, {**SPEECH, "response_format": "aac"})),
    ("http", "refused", "bad_field", http_post("/v1/say", {"text": "Hi.", "wait": "yes"})),
    ("http", "refused", "body_too_large", http_post("/v1/say", b" " * 70_000)),
    ("http", "refused", "unknown_voice", http_post(SPEAK, {**SPEECH, "voice": "nobody"})),
    ("http", "refused", "text_too_long", http_post("/v1/say", {"text": "a" * (MAX_TEXT + 1)})),
    ("http", "refused", "empty_text", http_post(SPEAK, {**SPEECH, "input": ""})),
]


@pytest.mark.parametrize(
    ("frontend", "kind", "code", "refuse"),
    CASES,
    ids=[f"{f}-{c}-{i}" for i, (f, _, c, _) in enumerate(CASES)],
)
def test_each_refusal_counts_once(
    d: Daemon, frontend: str, kind: str, code: str, refuse: Callable[[Daemon], None]
) -> None:
    before = d.requests(frontend, kind, code)
    refuse(d)
    wait_until(lambda: d.requests(frontend, kind, code) > before, f"{frontend} {code} counted")
    assert d.requests(frontend, kind, code) == before + 1  # once, not twice
