"""SSIP robustness: property tests of the framing and a protocol fuzz against the real front-end.

The fuzz throws random and malformed lines, huge lines, invalid UTF-8, SPEAK bodies cut short,
random chunking and half-closed or abruptly closed connections at one long-running server; every
byte it answers must be well-formed SSIP, no command may hit the internal-error path, and the
next client must be served.

The example budget is modest for CI; a bench run sets it from the environment, e.g.

    SPEAKD_SSIP_FUZZ_EXAMPLES=10000 .venv/bin/python -m pytest tests/test_ssip_fuzz.py -q
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from speakd.frontends.ssip.parser import LINE_TOO_LONG, LineFramer, SpeakBody, decode_text
from tests.ssip_harness import SsipClient, SsipServer, escape

EXAMPLES = int(os.environ.get("SPEAKD_SSIP_FUZZ_EXAMPLES", "150"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
MAX_LINE = 1024  # the fuzz server's line limit: huge lines are cheap to make
TIMEOUT = 30.0  # generous: CI machines stall for seconds under load; a hang still fails
REPLY_LINE = re.compile(rb"[1-7]\d\d[- ][^\r\n]*")


# ---- framing, without sockets --------------------------------------------------------------


def chunked(data: bytes, cuts: list[int]) -> Iterator[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    start = 0
    for p in [*points, len(data)]:
        yield data[start:p]
        start = p


def reference_lines(data: bytes, max_line: int) -> list[object]:
    """What a correct framer yields: complete CRLF lines, over-long ones as one marker each
    (and a marker for an unfinished over-long tail, which the framer must already drop)."""
    *complete, tail = data.split(b"\r\n")
    out: list[object] = [LINE_TOO_LONG if len(x) > max_line else x for x in complete]
    if len(tail) > max_line + 1:
        out.append(LINE_TOO_LONG)
    return out


crlf_heavy = st.lists(
    st.one_of(st.binary(max_size=12), st.sampled_from([b"\r\n", b"\r", b"\n", b".", b".."])),
    max_size=30,
).map(b"".join)


@FUZZ
@given(data=crlf_heavy, cuts=st.lists(st.integers(0, 400), max_size=8), max_line=st.integers(1, 16))
def test_framer_matches_reference_for_any_chunking(
    data: bytes, cuts: list[int], max_line: int
) -> None:
    framer = LineFramer(max_line)
    got = [line for chunk in chunked(data, cuts) for line in framer.feed(chunk)]
    assert got == reference_lines(data, max_line)
    assert framer.pending <= max_line + 1  # memory stays bounded


@FUZZ
@given(text=st.text(), cuts=st.lists(st.integers(0, 400), max_size=8))
def test_libspeechd_escaping_round_trips(text: str, cuts: list[int]) -> None:
    """Whatever libspeechd sends (escape_dot + CRLF.CRLF), the body is the text again."""
    raw = text.encode()
    wire = escape(text).encode() + b"\r\n.\r\n"
    framer, body, done = LineFramer(1 << 20), SpeakBody(max_bytes=1 << 20), False
    for chunk in chunked(wire, cuts):
        for line in framer.feed(chunk):
            assert not done, "data after the terminator"
            done = body.add(line)
    assert done
    assert body.data() == raw.replace(b"\x00", b"?")
    assert decode_text(body.data()) == text.replace("\x00", "?").replace("\r\n", "\n")


# ---- the protocol fuzz against a live front-end --------------------------------------------


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SsipServer]:
    path = tmp_path_factory.mktemp("ssipfuzz") / "ssip.sock"
    with SsipServer(path, max_line_bytes=MAX_LINE, max_queue=8) as s:
        yield s


COMMANDS = [
    b'SET SELF CLIENT_NAME "u:fuzz:main"',
    b"SET SELF PRIORITY MESSAGE",
    b"SET SELF PRIORITY important",
    b"SET SELF NOTIFICATION all on",
    b"SET SELF RATE 100",
    b"SET SELF VOLUME -100",
    b"SET SELF SSML_MODE on",
    b"SET SELF SPELLING on",
    b"SET SELF SYNTHESIS_VOICE high",
    b"SET ALL PITCH 3",
    b"SET 1 RATE 5",
    b"STOP ALL",
    b"STOP SELF",
    b"CANCEL ALL",
    b"CANCEL SELF",
    b"PAUSE SELF",
    b"PAUSE ALL",
    b"RESUME ALL",
    b"RESUME SELF",
    b"LIST SYNTHESIS_VOICES",
    b"LIST OUTPUT_MODULES",
    b"GET VOLUME",
    b"HISTORY GET CLIENT_ID",
    b"HELP",
    b"BLOCK BEGIN",
    b"BLOCK END",
    b"CHAR x",
    b"KEY ctrl_a",
    b"SOUND_ICON bell",
    b"SET SELF",
    b"LIST",
    b"",
]

command_line = st.sampled_from(COMMANDS).map(lambda c: c + b"\r\n")
speak = st.tuples(
    st.binary(max_size=40), st.sampled_from([b"\r\n.\r\n", b"\n.\n", b"", b"\r\n"])
).map(lambda t: b"SPEAK\r\n" + t[0] + t[1])
ssml = st.text(max_size=30).map(
    lambda t: b"SET SELF SSML_MODE on\r\nSPEAK\r\n<speak>" + t.encode() + b"</speak>\r\n.\r\n"
)
garbage = st.binary(max_size=60)
random_line = st.binary(max_size=60).map(lambda b: b + b"\r\n")
invalid_utf8 = st.sampled_from([b"\xff\xfe", b"SET SELF \xc3", b"\xed\xa0\x80", b"CHAR \x80"]).map(
    lambda b: b + b"\r\n"
)
huge = st.tuples(st.integers(MAX_LINE - 2, 6 * MAX_LINE), st.booleans()).map(
    lambda t: b"SET SELF LANGUAGE " + b"x" * t[0] + (b"\r\n" if t[1] else b"")
)
pieces = st.lists(
    st.one_of(command_line, command_line, speak, ssml, garbage, random_line, invalid_utf8, huge),
    max_size=12,
)


def read_all(sock: socket.socket) -> bytes:
    out = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            return out
        if not chunk:
            return out
        out += chunk


def check_well_formed(output: bytes) -> None:
    if not output:
        return
    assert output.endswith(b"\r\n"), output[-80:]
    for line in output[:-2].split(b"\r\n"):
        assert REPLY_LINE.fullmatch(line), f"malformed reply line {line[:80]!r}"
        assert not line.startswith(b"300 ERR INTERNAL"), "a command hit the internal-error path"


def assert_served(server: SsipServer) -> None:
    """A fresh client is served; its cleanup keeps one example's pauses out of the next."""
    with SsipClient(server.path, timeout=TIMEOUT) as c:
        assert c.code("HISTORY GET CLIENT_ID") == 245
        assert c.code("RESUME ALL") in (212, 417)
        assert c.code("CANCEL ALL") == 213


@FUZZ
@given(
    payload=pieces.map(b"".join),
    cuts=st.lists(st.integers(0, 10_000), max_size=6),
    ending=st.sampled_from(["half_close", "abrupt", "quit"]),
)
def test_fuzz_never_crashes_and_next_client_is_served(
    server: SsipServer, payload: bytes, cuts: list[int], ending: str
) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(TIMEOUT)
        s.connect(str(server.path))
        try:
            for chunk in chunked(payload, cuts):
                s.sendall(chunk)
            if ending == "quit":
                s.sendall(b"\r\n.\r\nQUIT\r\n")  # ends an open SPEAK body, then quits
            if ending != "abrupt":
                s.shutdown(socket.SHUT_WR)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server may close first (a QUIT inside the payload)
        if ending != "abrupt":
            check_well_formed(read_all(s))
    assert_served(server)


@FUZZ
@given(commands=st.lists(st.sampled_from(COMMANDS), min_size=1, max_size=20))
def test_half_closed_client_gets_every_reply(server: SsipServer, commands: list[bytes]) -> None:
    """Commands sent before a half-close are all answered before the server closes."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(TIMEOUT)
        s.connect(str(server.path))
        s.sendall(b"".join(c + b"\r\n" for c in commands))
        s.shutdown(socket.SHUT_WR)
        output = read_all(s)
    check_well_formed(output)
    finals = [line for line in output[:-2].split(b"\r\n") if line[3:4] == b" " and line[:1] != b"7"]
    assert len(finals) == len(commands)
    assert_served(server)


def test_many_connections_at_once(server: SsipServer) -> None:
    clients = [SsipClient(server.path) for _ in range(50)]
    try:
        for c in clients:
            c.send(b"HISTORY GET CLIENT_ID\r\n")
        ids = {c.reply()[0] for c in clients}
        assert len(ids) == 50
    finally:
        for c in clients:
            c.close()
    assert_served(server)


def test_endless_line_costs_bounded_memory(server: SsipServer) -> None:
    with SsipClient(server.path) as c:
        for _ in range(64):  # 4 MiB without a CRLF
            c.send(b"A" * 65536)
        c.send(b"\r\nHELP\r\n")
        assert c.reply()[0].startswith("500 ERR LINE TOO LONG")
        assert c.reply()[-1] == "248 OK HELP SENT"
    assert_served(server)
