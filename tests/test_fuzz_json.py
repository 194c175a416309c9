"""Fuzz the JSON-lines socket and the MQTT say payloads of one real ``speakd serve`` process.

Hypothesis throws random bytes, random JSON, say requests with random field types, huge lines,
invalid UTF-8, deep nesting, oversized numbers and lone surrogates at a live daemon (embedded
voice, real mosquitto). Properties: the daemon never dies or hangs; every input is answered, each
error with a code and a message and never ``internal_error``; a fatal line (too long, not UTF-8)
ends only its own connection; the next client is served.

The example budget is modest for CI; the bench mode (docs/reliability.md, "Bench") runs e.g.

    SPEAKD_JSON_FUZZ_EXAMPLES=10000 SPEAKD_MQTT_FUZZ_EXAMPLES=10000 \\
        .venv/bin/python -m pytest tests/test_fuzz_json.py -q
"""

from __future__ import annotations

import itertools
import json
import os
import socket
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from speakd.engines.vits.params import OPTIONS
from tests.bench_report import report
from tests.daemon_proc import DaemonProc
from tests.mosquitto import Mosquitto, Watcher
from tests.test_mqtt import PAYLOAD_LIMIT, start_mqtt_daemon
from tests.test_ssip_fuzz import chunked

JSON_EXAMPLES = int(os.environ.get("SPEAKD_JSON_FUZZ_EXAMPLES", "120"))
MQTT_EXAMPLES = int(os.environ.get("SPEAKD_MQTT_FUZZ_EXAMPLES", "40"))
MAX_LINE = 8192  # above 4300 digits: an over-long integer fits in a line
SITE = "fuzz"
REPLY_TOPIC = "fuzz/reply"
ANSWERS = {"queued", "error", "status", "voices", "ok"}  # what answers a line directly


def fuzz_settings(examples: int) -> settings:
    return settings(
        max_examples=examples,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


@pytest.fixture(scope="module")
def watcher(broker: Mosquitto) -> Iterator[Watcher]:
    w = Watcher(broker, "hermes/#", f"speakd/{SITE}/availability", f"{REPLY_TOPIC}/#")
    yield w
    w.close()


@pytest.fixture(scope="module")
def daemon(
    tmp_path_factory: pytest.TempPathFactory, broker: Mosquitto, watcher: Watcher
) -> Iterator[DaemonProc]:
    limits = f"[limits]\nmax_line_bytes = {MAX_LINE}\nmax_text_chars = 200\nmax_queue = 4"
    d = start_mqtt_daemon(tmp_path_factory.mktemp("fuzzd"), broker, watcher, SITE, limits)
    yield d
    assert d.stop() == 0, d.log_text()[-5000:]
    # Nothing escaped a handler: asyncio's "Unhandled exception…", a front-end's log.exception…
    # (DEBUG tracebacks of ordinary request errors, e.g. not_cached, are fine; so is paho's own
    # DEBUG-enabled chatter while disconnecting.)
    log = d.log_text().splitlines()
    errors = [line for line in log if " ERROR " in line and ".paho: " not in line]
    assert not errors, errors[:20]


@pytest.fixture(scope="module")
def counts() -> Iterator[dict[str, int]]:
    """Inputs thrown per front-end, for the bench report."""
    n = {"json_inputs": 0, "json_examples": 0, "mqtt_inputs": 0}
    yield n
    report("fuzz_json", **n)


# ---- strategies ------------------------------------------------------------------------------

surrogates = st.sampled_from(["\ud800", "a\udfffb", "\udc80x"])
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(-(10**400), 10**400),
    st.floats(),
    st.text(max_size=20),
    surrogates,
)
json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=8,
)
FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "op": st.sampled_from(["say", "say", "stop", "cancel", "status", "voices", "dance"])
    | json_values,
    "text": st.sampled_from(["Hi.", "Door open.", "   ", "a" * 300, "x\x00y", ""]) | json_values,
    "id": st.text(max_size=10) | st.just("x" * 200) | json_values,
    "voice": st.sampled_from(["default", "en_US-joe-medium", "nobody"]) | json_values,
    "priority": st.sampled_from(["important", "message", "text", "notification", "urgent"])
    | json_values,
    "speed": st.floats() | json_values,
    "volume": st.floats() | json_values,
    "seed": st.integers() | json_values,
    "params": st.dictionaries(
        st.sampled_from([*(o.name for o in OPTIONS), "bogus"]), json_values, max_size=3
    )
    | json_values,
    "wait": st.booleans() | json_values,
    "cache_only": st.booleans() | json_values,
}
requests = st.fixed_dictionaries({}, optional=FIELDS)


def encode(obj: Any, ascii_only: bool) -> bytes:
    # surrogatepass: a lone surrogate sent raw is invalid UTF-8 on the wire (→ bad_encoding)
    return json.dumps(obj, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass")


request_bytes = st.builds(encode, requests | json_values, st.booleans())
invalid_utf8 = st.sampled_from(
    [b"\xff\xfe", b'{"text": "\xc3"}', b"\xed\xa0\x80", b'{"op":"\x80"}']
)
deep = st.tuples(st.integers(1, 3000), st.sampled_from([b"[", b'{"a":'])).map(lambda t: t[1] * t[0])
huge_number = st.integers(4301, 5000).map(lambda n: b'{"op":"say","text":"hi","seed":' + b"9" * n)
garbage = st.binary(max_size=60)


def lines_of(piece: st.SearchStrategy[bytes]) -> st.SearchStrategy[bytes]:
    return piece.map(lambda b: b + b"\n")


huge_line = st.tuples(st.integers(2 * MAX_LINE, 4 * MAX_LINE), st.booleans()).map(
    lambda t: b'{"text":"' + b"a" * t[0] + (b'"}\n' if t[1] else b"")
)
json_lines = st.lists(
    st.one_of(
        lines_of(request_bytes),
        lines_of(request_bytes),
        lines_of(request_bytes),
        lines_of(garbage),
        lines_of(invalid_utf8),
        lines_of(deep),
        lines_of(huge_number),
        st.sampled_from([b"\n", b"  \r\n", b"\t\n"]),
        garbage,
        huge_line,
    ),
    max_size=8,
).map(b"".join)


# ---- the JSON socket -------------------------------------------------------------------------


def expected(payload: bytes) -> tuple[int, str | None]:
    """How the server must read ``payload``: lines it answers, and the fatal error that ends it."""
    lines = payload.split(b"\n")
    if lines[-1] == b"":
        lines.pop()
    answered = 0
    for line in lines:
        if len(line) > MAX_LINE:
            return answered, "line_too_long"
        if not line.strip():
            continue
        try:
            line.decode("utf-8")
        except UnicodeDecodeError:
            return answered, "bad_encoding"
        answered += 1
    return answered, None


def read_all(sock: socket.socket) -> tuple[bytes, bool]:
    """Everything the server sent, and whether it ended with a reset instead of EOF (a server
    that closes with our unsent input still queued: only after a fatal line)."""
    out = b""
    try:
        while chunk := sock.recv(65536):
            out += chunk
    except ConnectionResetError:
        return out, True
    return out, False


def check_event(event: Any) -> None:
    assert isinstance(event, dict) and isinstance(event.get("event"), str), event
    if event["event"] == "error":
        assert isinstance(event["code"], str) and event["code"], event
        assert isinstance(event["message"], str) and event["message"], event
        assert event["code"] != "internal_error", event


def assert_served(d: DaemonProc) -> None:
    """A fresh client gets its status; its stop keeps one example's queue out of the next."""
    assert d.proc.poll() is None, d.log_text()[-5000:]
    with d.client(timeout=20) as c:
        assert c.request({"op": "status"})["event"] == "status"
        assert c.request({"op": "stop"})["event"] == "ok"


@fuzz_settings(JSON_EXAMPLES)
@given(
    payload=json_lines,
    cuts=st.lists(st.integers(0, 20_000), max_size=5),
    ending=st.sampled_from(["half_close", "half_close", "abrupt"]),
)
def test_json_socket_fuzz(
    daemon: DaemonProc, counts: dict[str, int], payload: bytes, cuts: list[int], ending: str
) -> None:
    answered, fatal = expected(payload)
    counts["json_examples"] += 1
    counts["json_inputs"] += max(1, payload.count(b"\n"))
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(20)  # a hang fails the test
        s.connect(daemon.socket)
        try:
            for chunk in chunked(payload, cuts):
                s.sendall(chunk)
            if ending == "half_close":
                s.shutdown(socket.SHUT_WR)
        except (BrokenPipeError, ConnectionResetError):
            assert fatal is not None, "the server closed a connection that did nothing wrong"
        if ending == "half_close":
            output, reset = read_all(s)
            assert not reset or fatal is not None, "reset a connection that did nothing wrong"
            assert not output or output.endswith(b"\n"), output[-200:]
            events = [json.loads(line) for line in output.splitlines()]
            for event in events:
                check_event(event)
            got = sum(
                e["event"] in ANSWERS or (e["event"] == "finished" and e["status"] == "discarded")
                for e in events
            )
            assert got >= answered + (fatal is not None), (payload[:300], events)
            if fatal is not None:
                assert events[-1]["event"] == "error" and events[-1]["code"] == fatal, events
    assert_served(daemon)


def test_half_closed_connection_gets_every_answer(daemon: DaemonProc) -> None:
    lines = [b'{"op": "status"}', b"{oops", b'{"op": "say", "text": 5}', b'{"op": "voices"}']
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(20)
        s.connect(daemon.socket)
        s.sendall(b"\n".join(lines))  # the last line has no newline: EOF ends it
        s.shutdown(socket.SHUT_WR)
        events = [json.loads(line) for line in read_all(s)[0].splitlines()]
    assert [e["event"] for e in events] == ["status", "error", "error", "voices"]
    assert [e.get("code") for e in events[1:3]] == ["bad_json", "bad_text"]


@pytest.mark.parametrize(
    ("line", "code"),
    [
        (b"[" * 3000, "bad_json"),  # nesting deeper than the parser's recursion limit
        (b'{"op": "say", "text": "hi", "seed": ' + b"9" * 5000 + b"}", "bad_json"),
        (b'{"op": "say", "text": "hi", "params": {"top_k": 1' + b"0" * 400 + b"}}", "bad_field"),
        (b'{"op": "say", "text": "a\\ud800b"}', "bad_text"),
        (b'{"op": "cancel", "id": "\\udfff"}', None),
        (b'{"op": "nope", "id": "\\udfff"}', "unknown_op"),
    ],
)
def test_inputs_the_fuzz_found(daemon: DaemonProc, line: bytes, code: str | None) -> None:
    """Each once broke a connection without an answer; now each gets a clear one."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(20)
        s.connect(daemon.socket)
        s.sendall(line + b"\n")
        s.shutdown(socket.SHUT_WR)
        output, _ = read_all(s)
    [event] = [json.loads(raw) for raw in output.splitlines()]
    check_event(event)
    assert event.get("code") == code, event
    output.decode("utf-8")  # answers are valid UTF-8 even when echoing a lone surrogate
    assert_served(daemon)


# ---- MQTT say payloads -----------------------------------------------------------------------

correlations = itertools.count()
hermes_objects = st.builds(
    lambda obj, session: {**obj, "siteId": SITE, "sessionId": session},
    requests,
    st.text(max_size=8) | surrogates | json_values,
)
oversized = st.integers(PAYLOAD_LIMIT + 1, 4 * PAYLOAD_LIMIT).map(lambda n: b'{"text":"' + b"a" * n)
mqtt_payloads = st.one_of(
    st.tuples(st.just("speakd"), request_bytes),
    st.tuples(st.just("hermes"), st.builds(encode, hermes_objects, st.booleans())),
    st.tuples(
        st.just("speakd"),
        st.one_of(garbage, invalid_utf8, deep, huge_number, oversized, st.just(b"")),
    ),
)


def reply_to(watcher: Watcher, correlation: bytes, since: int) -> dict[str, Any]:
    msg = watcher.wait(REPLY_TOPIC, lambda m: m.correlation == correlation, since, timeout=20)
    return msg.json()


@fuzz_settings(MQTT_EXAMPLES)
@given(cases=st.lists(mqtt_payloads, min_size=1, max_size=8))
def test_mqtt_say_payload_fuzz(
    daemon: DaemonProc,
    watcher: Watcher,
    counts: dict[str, int],
    cases: list[tuple[str, bytes]],
) -> None:
    since = watcher.mark()
    expected = []
    for where, payload in cases:
        topic = "hermes/tts/say" if where == "hermes" else f"speakd/{SITE}/say"
        correlation = f"c{next(correlations)}".encode()
        watcher.publish(topic, payload, response_topic=REPLY_TOPIC, correlation=correlation)
        counts["mqtt_inputs"] += 1
        expected.append(correlation)  # a re-used id is a new say: answered like any other
    for correlation in expected:
        reply = reply_to(watcher, correlation, since)
        assert isinstance(reply.get("status"), str), reply
        if reply["status"] == "error":
            assert reply["code"] != "internal_error" and reply["message"], reply
    # still alive: a stop on our topic is answered (and clears the queue for the next example)
    stop = f"s{next(correlations)}".encode()
    since = watcher.mark()
    watcher.publish(f"speakd/{SITE}/stop", b"", response_topic=REPLY_TOPIC, correlation=stop)
    assert reply_to(watcher, stop, since)["status"] == "stopped"
    assert daemon.proc.poll() is None, daemon.log_text()[-5000:]


def test_mqtt_errors_still_end_with_say_finished(daemon: DaemonProc, watcher: Watcher) -> None:
    """An unreadable Hermes say (deep nesting, lone-surrogate session) still gets its
    ``hermes/error/tts`` and ``sayFinished``, valid UTF-8 JSON both."""
    cases = [
        (f"speakd/{SITE}/say", b"[" * 3000),
        ("hermes/tts/say", b'{"siteId": "fuzz", "id": "sur1", "sessionId": "\\ud800", "text": 1}'),
    ]
    for topic, payload in cases:
        since = watcher.mark()
        watcher.publish(topic, payload)
        error = watcher.wait("hermes/error/tts", since=since, timeout=20).json()
        assert error["siteId"] == SITE and error["error"].split(":")[0] in ("bad_json", "bad_text")
        watcher.wait("hermes/tts/sayFinished", lambda m: m.json()["siteId"] == SITE, since)
