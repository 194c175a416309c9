"""The Wyoming TTS server against real daemons, through the ``wyoming`` package's own client.

* a ``speakd serve`` process with the embedded voice on TCP, driven the way Home Assistant does:
  ``describe`` with HA's 1 s timeout, ``synthesize`` (the same audio as the socket's ``synth``, the
  second time from the cache), text streamed in sentence by sentence, and hostile input;
* the real ``Daemon`` in this process on a Unix socket with the tone engine (tests/tone_engine.py),
  for what needs a controllable engine: a failing synthesis, ``busy``, a client leaving
  mid-synthesis, playback left alone, a reload, zeroconf.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import socket
import stat
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from wyoming.client import AsyncClient, AsyncTcpClient, AsyncUnixClient
from wyoming.event import Event
from wyoming.info import Describe, Info
from wyoming.ping import Ping
from wyoming.tts import (
    Synthesize,
    SynthesizeChunk,
    SynthesizeStart,
    SynthesizeStop,
    SynthesizeVoice,
)

import speakd
import speakd.lifecycle.service
from speakd.audio import read_wav
from speakd.config import ConfigError, load_config
from speakd.frontends.wyoming.wire import spellings
from speakd.request.sounds import Sounds
from tests.daemon_proc import DaemonProc, InProcessDaemon, start_daemon, write_config
from tests.tiny_voices import tiny_multispeaker_voice
from tests.tone_engine import ToneEngine
from tests.waits import until

HA_DESCRIBE_TIMEOUT_S = 1.0  # Home Assistant gives up on a describe after this
MAX_TEXT_CHARS = 300
SENTENCES = ["The kitchen lights are on.", "The front door is locked.", "Good night!"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[DaemonProc, int]]:
    tmp = tmp_path_factory.mktemp("wyoming")
    port = free_port()
    extra = (
        f'[wyoming]\nuri = "tcp://127.0.0.1:{port}"\n'
        f"[limits]\nmax_text_chars = {MAX_TEXT_CHARS}\nmax_line_bytes = 4096\n"
    )
    d = start_daemon(write_config(tmp, extra, sink="null"))
    try:
        yield d, port
    finally:
        assert d.stop() == 0


def tcp(port: int) -> AsyncTcpClient:
    return AsyncTcpClient("127.0.0.1", port, read_timeout=60)


async def read_until(client: AsyncClient, *types: str) -> list[Event]:
    """Events up to and including the first of ``types``."""
    events = []
    while True:
        event = await client.read_event()
        assert event is not None, f"connection closed before {types}: {events}"
        events.append(event)
        if event.type in types:
            return events


def audio_of(events: list[Event]) -> bytes:
    return b"".join(e.payload or b"" for e in events if e.type == "audio-chunk")


async def synthesize(client: AsyncClient, text: str, **voice: str) -> list[Event]:
    await client.write_event(Synthesize(text, SynthesizeVoice(**voice) if voice else None).event())
    return await read_until(client, "audio-stop")  # a failed one too: error, then audio-stop


async def refusal(client: AsyncClient) -> tuple[str, bool]:
    """A refused synthesis: its error's code, then the end of the connection: closed (False)
    or closed after an event cut off mid-way (True, a text stream's), never an audio-stop."""
    error = await client.read_event()
    assert error is not None and error.type == "error" and error.data["text"], error
    try:
        end = await client.read_event()
    except asyncio.IncompleteReadError:
        return error.data["code"], True
    assert end is None, end
    return error.data["code"], False


def error_of(events: list[Event]) -> str | None:
    codes = [e.data["code"] for e in events if e.type == "error"]
    assert len(codes) <= 1, events
    return codes[0] if codes else None


async def describe(client: AsyncClient) -> Info:
    await client.write_event(Describe().event())
    event = await asyncio.wait_for(client.read_event(), HA_DESCRIBE_TIMEOUT_S)
    assert event is not None and Info.is_type(event.type), event
    return Info.from_event(event)


def status(d: DaemonProc) -> dict[str, Any]:
    with d.client() as c:
        return c.request({"op": "status"})


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ('uri = "tcp://0.0.0.0"', "wyoming.uri"),  # no port
        ('uri = "http://0.0.0.0:10200"', "wyoming.uri"),
        ('uri = "tcp://0.0.0.0:99999"', "wyoming.uri"),
        ('uri = "unix://"', "wyoming.uri"),
        ('uri = "unix:///run/speakd/wyoming.sock"\nzeroconf = "speakd"', "wyoming.zeroconf"),
        ('zeroconf = "speakd"', "wyoming.zeroconf"),
    ],
)
def test_bad_wyoming_config_names_the_key(tmp_path: Path, section: str, message: str) -> None:
    path = tmp_path / "speakd.toml"
    path.write_text(f"[wyoming]\n{section}\n")
    with pytest.raises(ConfigError, match=message):
        load_config(path, env={})


# ---- a real daemon process, as Home Assistant uses it --------------------------------------


async def test_describe_is_answered_within_a_second_with_every_voice(
    daemon: tuple[DaemonProc, int],
) -> None:
    d, port = daemon
    with d.client() as c:
        voices = c.request({"op": "voices"})["voices"]
    for _ in range(3):  # HA opens a connection per describe
        async with tcp(port) as client:
            info = await describe(client)
    (program,) = info.tts
    assert program.name == "speakd" and program.installed
    assert program.version == speakd.__version__
    assert program.supports_synthesize_streaming
    assert program.attribution.name == "speakd"
    assert [(v.name, v.description, v.languages) for v in program.voices] == [
        (v["name"], v["name"], spellings(v["languages"])) for v in voices
    ]
    assert program.voices[0].languages == ["en-US", "en_US", "en"]  # as users write it in HA
    assert all(v.installed and v.attribution.url for v in program.voices)


async def test_synthesize_gives_the_socket_synth_audio_and_then_a_cache_hit(
    daemon: tuple[DaemonProc, int],
) -> None:
    d, port = daemon
    text = "Wyoming test: the washing machine has finished."
    async with tcp(port) as client:
        events = await synthesize(client, text)
    assert [e.type for e in (events[0], events[-1])] == ["audio-start", "audio-stop"]
    assert events[0].data["rate"] == 22050 and events[0].data["width"] == 2
    assert events[0].data["channels"] == 1
    with d.client() as c:
        reference, finished = c.synth({"text": text})
    assert finished["event"] == "finished"
    assert reference is not None and audio_of(events) == reference.pcm
    out = d.config.parent / "say-output.wav"  # `speakd say --output`: the same bytes again
    assert d.cli("say", text, "--output", str(out)).returncode == 0
    assert read_wav(out).pcm == reference.pcm

    hits = status(d)["source"]["cache"]["hits"]
    async with tcp(port) as client:
        again = await synthesize(client, text, name="en_US-joe-medium")
        assert status(d)["source"]["cache"]["hits"] == hits + 1
        by_language = await synthesize(client, text, language="en-US")
        by_posix_language = await synthesize(client, text, language="en_US")
    assert audio_of(again) == reference.pcm
    assert by_language[-1].type == "audio-stop" and audio_of(by_language)
    assert audio_of(by_posix_language) == audio_of(by_language)  # either spelling, one clip
    assert "streams back (cached, origin wyoming:" in d.log_text()


async def test_the_first_chunk_goes_out_before_the_synthesis_ends(
    daemon: tuple[DaemonProc, int],
) -> None:
    _, port = daemon
    text = " ".join(f"Sentence number {n} of a long announcement." for n in range(1, 7))
    async with tcp(port) as client:
        t0 = time.monotonic()
        await client.write_event(Synthesize(text).event())
        first = await read_until(client, "audio-chunk")
        t_first = time.monotonic() - t0
        rest = await read_until(client, "audio-stop")
        t_all = time.monotonic() - t0
    assert first[0].type == "audio-start"
    assert t_first < t_all / 2, (t_first, t_all)
    assert len(audio_of(first + rest)) / 2 / 22050 > 8  # the whole text was spoken


async def test_text_streamed_in_is_spoken_sentence_by_sentence(
    daemon: tuple[DaemonProc, int],
) -> None:
    _, port = daemon
    async with tcp(port) as client:
        reference = [audio_of(await synthesize(client, s)) for s in SENTENCES]
        await client.write_event(SynthesizeStart().event())
        await client.write_event(SynthesizeChunk("The kitchen li").event())
        await client.write_event(SynthesizeChunk("ghts are on. The fr").event())
        # The first sentence is spoken while the rest is still being written.
        first = await read_until(client, "audio-stop")
        for piece in ("ont door is locked. Good", " night!"):
            await client.write_event(SynthesizeChunk(piece).event())
        full = " ".join(SENTENCES)  # HA's compatibility synthesize: never spoken twice
        await client.write_event(Synthesize(full).event())
        await client.write_event(SynthesizeStop().event())
        rest = await read_until(client, "synthesize-stopped")
        answers, current = [first], []
        for event in rest[:-1]:
            current.append(event)
            if event.type == "audio-stop":
                answers.append(current)
                current = []
        assert current == []
        assert [audio_of(a) for a in answers] == reference
        assert all(a[0].type == "audio-start" for a in answers)
        # The connection takes a plain synthesize again afterwards.
        assert audio_of(await synthesize(client, SENTENCES[0])) == reference[0]


async def test_ssml_text_format_on_synthesize_and_on_a_text_stream(
    daemon: tuple[DaemonProc, int],
) -> None:
    """``text_format: "ssml"``: the break is 300 ms of zeros between the words' own audio; a
    streamed document is spoken whole at its stop (markup cut mid-element still reads)."""
    _, port = daemon
    ssml = '<speak>Door <break time="300ms"/> open</speak>'
    async with tcp(port) as client:
        await client.write_event(Synthesize(ssml, text_format="ssml").event())
        whole = audio_of(await read_until(client, "audio-stop"))
        door, open_ = [audio_of(await synthesize(client, word)) for word in ("Door", "open")]
        assert whole == door + bytes(2 * (300 * 22050 // 1000)) + open_
        await client.write_event(SynthesizeStart(text_format="ssml").event())
        for piece in ('<speak>Door <break time="30', '0ms"/> open</speak>'):
            await client.write_event(SynthesizeChunk(piece).event())
        await client.write_event(SynthesizeStop().event())
        streamed = await read_until(client, "synthesize-stopped")
        assert audio_of(streamed) == whole


HA_SSML = (
    '<speak>Door <break time="300ms"/> open. <say-as interpret-as="characters">HA</say-as></speak>'
)


@pytest.mark.parametrize("size", [len(HA_SSML), 7, 1])
async def test_a_speak_document_streamed_without_a_format_is_one_document(
    daemon: tuple[DaemonProc, int], size: int
) -> None:
    """As Home Assistant 2026 streams every text: no text_format, the text in chunks (one, or
    many cut anywhere, here after "<", inside tags and after "open. "), the whole text again as
    synthesize, then synthesize-stop. One answer, the same audio as the document sent whole."""
    _, port = daemon
    async with tcp(port) as client:
        await client.write_event(Synthesize(HA_SSML, text_format="ssml").event())
        whole = audio_of(await read_until(client, "audio-stop"))
    text = "  \n" + HA_SSML  # an LLM's answer may start with white space
    async with tcp(port) as client:
        await client.write_event(SynthesizeStart().event())
        for i in range(0, len(text), size):
            await client.write_event(SynthesizeChunk(text[i : i + size]).event())
        await client.write_event(Synthesize(text).event())
        await client.write_event(SynthesizeStop().event())
        streamed = await read_until(client, "synthesize-stopped")
    assert [e.type for e in streamed if e.type.startswith("audio-s")] == [
        "audio-start",
        "audio-stop",
    ]
    assert error_of(streamed) is None and audio_of(streamed) == whole


async def test_speakd_chime_plays_before_a_synthesize_and_a_streams_first_sentence(
    daemon: tuple[DaemonProc, int],
) -> None:
    """speakd's ``speakd_chime`` field (Home Assistant sends none): the chime's samples, then the
    text's, in one answer; on a text stream only the first sentence has it."""
    _, port = daemon
    sounds = Sounds(loudness=-20.0)
    ding = sounds.audio(sounds.find("ding"), lambda key: None).pcm
    async with tcp(port) as client:
        first, second = [audio_of(await synthesize(client, s)) for s in SENTENCES[:2]]
        chimed = Synthesize(SENTENCES[0]).event()
        chimed.data["speakd_chime"] = "ding"
        await client.write_event(chimed)
        assert audio_of(await read_until(client, "audio-stop")) == ding + first
        start = SynthesizeStart().event()
        start.data["speakd_chime"] = "ding"
        await client.write_event(start)
        await client.write_event(SynthesizeChunk(" ".join(SENTENCES[:2])).event())
        await client.write_event(SynthesizeStop().event())
        streamed = await read_until(client, "synthesize-stopped")
        stops = [i for i, e in enumerate(streamed) if e.type == "audio-stop"]
        assert audio_of(streamed[: stops[0]]) == ding + first
        assert audio_of(streamed[stops[0] :]) == second
        unknown = Synthesize(SENTENCES[0]).event()
        unknown.data["speakd_chime"] = "klaxon"
        await client.write_event(unknown)
        assert await refusal(client) == ("unknown_chime", False)


async def test_speakd_pitch_shifts_a_synthesize_and_every_sentence_of_a_stream(
    daemon: tuple[DaemonProc, int],
) -> None:
    """speakd's ``speakd_pitch`` field: the request's ``pitch``; the length stays."""
    _, port = daemon
    async with tcp(port) as client:
        plain = [audio_of(await synthesize(client, s)) for s in SENTENCES[:2]]
        pitched = []
        for sentence in SENTENCES[:2]:
            event = Synthesize(sentence).event()
            event.data["speakd_pitch"] = 3
            await client.write_event(event)
            pitched.append(audio_of(await read_until(client, "audio-stop")))
        start = SynthesizeStart().event()
        start.data["speakd_pitch"] = 3
        await client.write_event(start)
        await client.write_event(SynthesizeChunk(" ".join(SENTENCES[:2])).event())
        await client.write_event(SynthesizeStop().event())
        streamed = await read_until(client, "synthesize-stopped")
    for p, q in zip(pitched, plain, strict=True):  # resampled pitch: within a few per cent
        assert abs(len(p) / len(q) - 1) < 0.08
    assert all(p != q for p, q in zip(pitched, plain, strict=True))
    stops = [i for i, e in enumerate(streamed) if e.type == "audio-stop"]
    assert [audio_of(streamed[: stops[0]]), audio_of(streamed[stops[0] :])] == pitched


async def test_ssml_marks_are_speakd_mark_events_ahead_of_the_audio_that_follows(
    daemon: tuple[DaemonProc, int],
) -> None:
    """Each ``<mark>`` is a ``speakd-mark`` event at its offset in samples, sent when exactly
    that much audio has gone out: on the onset of the word it precedes, in one utterance; a mark
    at the end comes before ``audio-stop``."""
    _, port = daemon
    ssml = '<speak><mark name="start"/>Door <mark name="mid"/> open<mark name="end"/></speak>'
    async with tcp(port) as client:
        await client.write_event(Synthesize(ssml, text_format="ssml").event())
        marks, onsets, sent = [], {}, 0
        for event in await read_until(client, "audio-stop"):
            if event.type == "speakd-mark":
                assert event.data["sample"] == sent  # ahead of the audio after it
                marks.append((event.data["name"], event.data["sample"]))
            elif event.type == "speakd-word":
                onsets[event.data["word"]] = event.data["start"]
            elif event.type == "audio-chunk":
                sent += len(event.payload or b"") // 2
    assert marks == [("start", onsets["Door"]), ("mid", onsets["open"]), ("end", sent)]
    assert 0 <= onsets["Door"] < onsets["open"] < sent  # speech starts with its first sound


STREAM = (SynthesizeStart().event(), SynthesizeStop().event())


@pytest.mark.parametrize(
    ("events", "code", "cut"),
    [
        ([Synthesize("Hi", SynthesizeVoice(name="nobody")).event()], "unknown_voice", False),
        ([Synthesize("Hi", SynthesizeVoice(language="xx")).event()], "unknown_language", False),
        ([Synthesize("   ").event()], "empty_text", False),
        ([Synthesize(f"<speak>{'word ' * 100}</speak>").event()], "text_too_long", False),
        ([Event("synthesize", {"voice": {"name": "x"}})], "bad_event", False),  # no text
        ([Event("synthesize", {"text": 5})], "bad_text", False),
        ([Event("synthesize", {"text": "Hi", "voice": "x"})], "bad_event", False),
        ([SynthesizeChunk("Hello.").event()], "bad_event", True),  # no synthesize-start
        ([SynthesizeStop().event()], "bad_event", True),
        ([SynthesizeStart(SynthesizeVoice(name="nobody")).event()], "unknown_voice", True),
        ([STREAM[0], SynthesizeChunk(" \n\t ").event(), STREAM[1]], "empty_text", True),
        ([STREAM[0], STREAM[1]], "empty_text", True),
    ],
)
async def test_a_refused_synthesis_is_an_error_then_the_end_of_its_connection(
    daemon: tuple[DaemonProc, int], events: list[Event], code: str, cut: bool
) -> None:
    """Home Assistant keeps what it reads as the text's audio: a refusal must not read as
    silence. A whole synthesize's connection closes (HA 2025.4: "No TTS"); a stream's ends in an
    event cut off mid-way (HA 2026 fails only on that). Counted: tests/test_refusals.py."""
    _, port = daemon
    async with tcp(port) as client:
        for event in events:
            await client.write_event(event)
        assert await refusal(client) == (code, cut)
    async with tcp(port) as other:
        await describe(other)


async def test_a_long_whole_text_is_spoken_sentence_by_sentence_in_one_answer(
    daemon: tuple[DaemonProc, int],
) -> None:
    """Over limits.max_text_chars (300 here) sent whole, as HA 2025.4 sends every text."""
    _, port = daemon
    text = " ".join(f"Sentence number {i} is spoken as well." for i in range(20))
    assert len(text) > 2 * MAX_TEXT_CHARS
    async with tcp(port) as client:
        events = await synthesize(client, text)
    kinds = [e.type for e in events if e.type == "audio-start" or e.type == "audio-stop"]
    assert kinds == ["audio-start", "audio-stop"] and error_of(events) is None
    starts = [e.data["start"] for e in events if e.type == "speakd-word"]  # from audio-start
    assert len(starts) >= 20 * 6 and starts == sorted(starts)
    assert starts[-1] < len(audio_of(events)) // 2
    short = len(audio_of(events)) / len(text)
    async with tcp(port) as client:
        one = await synthesize(client, "Sentence number 1 is spoken as well.")
    assert short > 0.5 * len(audio_of(one)) / len("Sentence number 1 is spoken as well.")


@pytest.mark.parametrize(
    ("wire", "code"),
    [
        (b"this is not json\n", "bad_event"),
        (b'["a list"]\n', "bad_event"),
        (b'{"data": {}}\n', "bad_event"),  # no type
        (b'{"type": "synthesize", "data_length": 3}\nabc', "bad_event"),  # data not JSON
        (b'{"type": "synthesize", "data": [1], "data_length": 2}\n{}', "bad_event"),
        (b"\xff\xfe\n", "bad_event"),
    ],
)
async def test_malformed_events_are_errors_and_the_connection_goes_on(
    daemon: tuple[DaemonProc, int], wire: bytes, code: str
) -> None:
    _, port = daemon
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    client = tcp(port)
    client._reader, client._writer = reader, writer  # the library's client on a raw socket
    try:
        writer.write(wire)
        error = await client.read_event()
        assert error is not None and error.type == "error" and error.data["code"] == code
        await describe(client)
    finally:
        writer.close()


@pytest.mark.parametrize(
    "header",
    [
        b'{"type": "synthesize", "data_length": 1000000000000}\n',
        b'{"type": "audio-chunk", "payload_length": 5000}\n',  # over limits.max_line_bytes
        b'{"type": "synthesize", "data_length": "12"}\n',
        b'{"type": "synthesize", "data_length": -1}\n',
        b'{"type": "x", "pad": "' + b"y" * 70000 + b'"}\n',  # a header past the reader's limit
    ],
)
async def test_an_event_that_cannot_be_followed_closes_only_its_connection(
    daemon: tuple[DaemonProc, int], header: bytes
) -> None:
    _, port = daemon
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    client = tcp(port)
    client._reader, client._writer = reader, writer
    writer.write(header)
    error = await client.read_event()
    assert error is not None and error.type == "error"
    assert error.data["code"] in ("event_too_large", "bad_event")
    assert await client.read_event() is None  # closed by the server
    writer.close()
    async with tcp(port) as other:
        await describe(other)


async def test_unknown_events_are_dropped_as_the_protocol_asks(
    daemon: tuple[DaemonProc, int],
) -> None:
    _, port = daemon
    async with tcp(port) as client:
        await client.write_event(Event("select-program", {"name": "speakd"}))
        await client.write_event(Event("frobnicate", {"x": 1}, payload=b"\x00" * 100))
        await client.write_event(Ping(text="still here").event())
        pong = await client.read_event()
        assert pong is not None and pong.type == "pong" and pong.data["text"] == "still here"


# ---- the real Daemon in this process, with the tone engine ---------------------------------


class Messages(logging.Handler):
    """The in-process daemon's log lines from the Wyoming front-end."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


LOG = Messages()


@pytest.fixture(scope="module")
def tone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[InProcessDaemon, Path]]:
    tmp = tmp_path_factory.mktemp("wyoming-tone")
    sock = tmp / "wyoming.sock"
    extra = (
        f'[wyoming]\nuri = "unix://{sock}"\n'
        "[limits]\nmax_streams = 4\n"
        '[engine]\nfallback_text = "Sorry."\n'
    )
    config = write_config(tmp, extra, sink="null", realtime=True, voices="embedded = false")
    logger = logging.getLogger("speakd.frontends.wyoming")
    logger.addHandler(LOG)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(logger, "level", logging.INFO)
        mp.setattr(
            speakd.lifecycle.service,
            "load_engine",
            lambda _config: ToneEngine(word_s=0.1, compute_s=0.05),
        )
        mp.delenv("NOTIFY_SOCKET", raising=False)
        d = InProcessDaemon(config).start()
        try:
            yield d, sock
        finally:
            assert d.stop() == 0
            logger.removeHandler(LOG)


def unix(sock: Path) -> AsyncUnixClient:
    return AsyncUnixClient(sock, read_timeout=30)


def words(n: int, tag: str) -> str:
    return " ".join(f"{tag}{i}" for i in range(n))


async def test_unix_socket_gets_the_socket_mode(tone: tuple[InProcessDaemon, Path]) -> None:
    d, sock = tone
    assert stat.S_IMODE(sock.stat().st_mode) == d.config.socket.mode_bits
    async with unix(sock) as client:
        assert [v.name for v in (await describe(client)).tts[0].voices] == ["low", "high"]


async def test_an_engine_failure_is_an_error_and_the_connection_goes_on(
    tone: tuple[InProcessDaemon, Path],
) -> None:
    _, sock = tone
    async with unix(sock) as client:
        await client.write_event(Synthesize("please FAIL now").event())
        assert await refusal(client) == ("synthesis_failed", False)
    async with unix(sock) as client:
        assert len(audio_of(await synthesize(client, "fine now"))) > 0


async def test_a_text_stream_ends_with_synthesize_stopped_whatever_fails(
    tone: tuple[InProcessDaemon, Path],
) -> None:
    _, sock = tone
    async with unix(sock) as client:
        await client.write_event(SynthesizeStart().event())
        await client.write_event(SynthesizeChunk("Good one. This will FAIL now. Last").event())
        await client.write_event(SynthesizeChunk(" one.").event())
        await client.write_event(SynthesizeStop().event())
        events = await read_until(client, "audio-stop")
        assert [e.type for e in events if e.type != "audio-chunk"] == ["audio-start", "audio-stop"]
        assert await refusal(client) == ("synthesis_failed", True)  # the rest is not sent

    async with unix(sock) as client:  # a voice nobody has: refused at the start
        await client.write_event(SynthesizeStart(SynthesizeVoice(name="nobody")).event())
        await client.write_event(SynthesizeChunk("Never said. Not this either. ").event())
        await client.write_event(Synthesize("Never said. Not this either.").event())
        await client.write_event(SynthesizeStop().event())
        assert await refusal(client) == ("unknown_voice", True)


async def test_a_sentence_that_stops_at_its_mark_is_spoken_after_the_hold(
    tone: tuple[InProcessDaemon, Path],
) -> None:
    """An LLM pausing after "Hello there." : spoken after wyoming.sentence_hold_ms (150 ms), not
    when the next chunk or the end arrives; "3." is not spoken while more may follow."""
    _, sock = tone
    async with unix(sock) as client:
        await client.write_event(SynthesizeStart().event())
        await client.write_event(SynthesizeChunk("Hello there.").event())
        first = await read_until(client, "audio-stop")  # the stream is still open
        assert audio_of(first) and error_of(first) is None
        await client.write_event(SynthesizeChunk("It is 3.").event())
        await client.write_event(SynthesizeChunk("5 degrees").event())
        await client.write_event(SynthesizeStop().event())
        events = await read_until(client, "synthesize-stopped")
        assert [e.type for e in events if e.type != "audio-chunk"] == [
            "audio-start",
            "audio-stop",
            "synthesize-stopped",
        ]  # "It is 3.5 degrees" in one piece


async def test_a_client_leaving_mid_synthesis_cancels_it(
    tone: tuple[InProcessDaemon, Path],
) -> None:
    d, sock = tone
    before = d.status()["source"]["cache"]["not_stored"]
    async with unix(sock) as client:
        await client.write_event(Synthesize(words(200, "gone")).event())  # 10 s of compute
        await read_until(client, "audio-chunk")
    await until(  # an uncancelled synthesis would be stored after 10 s
        lambda: d.status()["source"]["cache"]["not_stored"] != before, "the dropped synthesis", 5
    )
    state = d.status()
    assert state["source"]["cache"]["not_stored"] == before + 1  # cancelled, never stored
    assert state["streams"]["active"] == 0 and state["source"]["cache"]["inflight"] == 0
    assert "the client left; its stream is released" in "".join(LOG.messages)


async def test_six_home_assistant_streams_past_max_streams_all_return_audio(
    tone: tuple[InProcessDaemon, Path],
) -> None:
    """Six Home Assistant ``synthesize`` calls at once, ``limits.max_streams = 4``: the fifth and
    sixth wait their turn (``limits.stream_wait_s``) instead of being refused, every one gets its
    audio, and the metrics say how long the streams waited."""
    d, sock = tone
    waited = d.status()["streams"]["streams_waited"]
    clients = [unix(sock) for _ in range(6)]
    for client in clients:
        await client.connect()
    try:
        for i, client in enumerate(clients):  # each holds its stream ~2 s (tone words, 0.1 s)
            await client.write_event(Synthesize(words(20, f"six{i}x")).event())
        answers = await asyncio.gather(*(read_until(c, "audio-stop") for c in clients))
    finally:
        for client in clients:
            await client.disconnect()
    assert [error_of(events) for events in answers] == [None] * 6
    assert all(audio_of(events) for events in answers)
    assert d.status()["streams"]["streams_waited"] - waited >= 2
    exposition = d.daemon.metrics.exposition().decode()
    assert 'speakd_stream_wait_seconds_bucket{le="0.001"}' in exposition
    waits = _histogram(exposition, "speakd_stream_wait_seconds")
    assert waits["+Inf"] - waits["0.001"] >= 2  # at least two waited for a place


def _histogram(exposition: str, name: str) -> dict[str, float]:
    """A histogram's cumulative bucket counts by ``le``."""
    pattern = re.compile(rf'^{name}_bucket{{le="([^"]+)"}} (\S+)$', re.M)
    return {le: float(n) for le, n in pattern.findall(exposition)}


async def test_wyoming_never_interrupts_what_the_board_plays(
    tone: tuple[InProcessDaemon, Path],
) -> None:
    d, sock = tone
    said: list[dict[str, Any]] = []
    playing = threading.Thread(
        target=lambda: said.extend(d.say(words(15, "board"), priority="important"))
    )
    playing.start()
    async with unix(sock) as client:
        for n in range(3):
            assert audio_of(await synthesize(client, words(5, f"ha{n}")))
    await asyncio.to_thread(playing.join, 30)
    assert said[-1]["event"] == "finished" and said[-1]["status"] == "done"


async def test_info_follows_a_reload_and_a_new_uri(tone: tuple[InProcessDaemon, Path]) -> None:
    d, sock = tone
    config = Path(d.daemon.config_path or "")
    voices = config.parent / "voices"
    tiny_multispeaker_voice(voices, "xx_XX-duo-low")  # a voice dropped into voices.dir
    try:
        asyncio.run_coroutine_threadsafe(d.daemon.reload(), d.loop).result(30)
        async with unix(sock) as client:
            listed = (await describe(client)).tts[0].voices
        assert [v.name for v in listed] == ["low", "high", "xx_XX-duo-low"]
        assert [s.name for s in listed[2].speakers or []] == ["anna", "bert"]
        assert listed[2].languages == ["en-US", "en_US", "en"]
    finally:
        for f in voices.iterdir():
            f.unlink()
        asyncio.run_coroutine_threadsafe(d.daemon.reload(), d.loop).result(30)

    config = Path(d.daemon.config_path or "")
    moved = sock.with_name("moved.sock")
    config.write_text(config.read_text().replace(str(sock), str(moved)))
    try:
        asyncio.run_coroutine_threadsafe(d.daemon.reload(), d.loop).result(30)
        async with unix(moved) as client:
            assert [v.name for v in (await describe(client)).tts[0].voices] == ["low", "high"]
        assert not sock.exists()
    finally:
        config.write_text(config.read_text().replace(str(moved), str(sock)))
        asyncio.run_coroutine_threadsafe(d.daemon.reload(), d.loop).result(30)
    async with unix(sock) as client:
        await describe(client)


async def test_zeroconf_announces_the_tcp_port_under_its_name(
    tone: tuple[InProcessDaemon, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The announcement itself is the wyoming package's (real mDNS needs a LAN: not here)."""
    import wyoming.zeroconf

    from speakd.config import WyomingConfig
    from speakd.frontends.wyoming.frontend import WyomingFrontend

    seen: dict[str, Any] = {}

    class FakeZeroconf:
        def __init__(self, port: int, name: str, host: str | None) -> None:
            seen.update(port=port, name=name, host=host)
            self._aiozc = self

        async def register_server(self) -> None:
            seen["registered"] = True

        async def async_close(self) -> None:
            seen["closed"] = True

    monkeypatch.setattr(wyoming.zeroconf, "HomeAssistantZeroconf", FakeZeroconf)
    d, _ = tone
    port = free_port()
    config = WyomingConfig(uri=f"tcp://0.0.0.0:{port}", zeroconf="kitchen speakd")
    config.validate()
    frontend = WyomingFrontend(
        d.daemon.control, config, max_event_bytes=65536, max_pending=8, socket_mode=0o660
    )

    def on_loop(coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, d.loop).result(10)

    on_loop(frontend.start())
    try:
        assert seen == {"port": port, "name": "kitchen speakd", "host": None, "registered": True}
        async with tcp(port) as client:
            await describe(client)
    finally:
        on_loop(frontend.close())
    assert seen["closed"]
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
        pytest.fail("the server still listens after close")
