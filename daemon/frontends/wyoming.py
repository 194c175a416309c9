"""Wyoming TTS server: how Home Assistant (Assist, media players, voice satellites) speaks through
speakd. Set ``[wyoming] uri`` and add it in Home Assistant as a Wyoming Protocol integration
(docs/wyoming.md).

Events, on the ``wyoming`` package's own server and event classes:

* ``describe`` → ``info``: one program with every voice of every engine, their languages and
  speakers (``wyoming_wire.build_info``), as they are now (a reload may add voices).
* ``synthesize`` → ``audio-start``, ``audio-chunk``…, ``audio-stop``: one request through
  ``Control.stream`` — a cache hit comes straight from the cache, a miss shares one synthesis with
  any playback of the same key, and each chunk goes out as the engine yields it.
* ``synthesize-start``, ``synthesize-chunk``…, ``synthesize-stop`` (text streamed in, an LLM's
  answer): every sentence is a request of its own as soon as it is complete
  (``frontends/sentences.py``), each answered ``audio-start`` … ``audio-stop``, then
  ``synthesize-stopped``. The ``synthesize`` a client sends inside the stream for older servers is
  ignored, never spoken twice.
* ``text_format: "ssml"`` on ``synthesize`` or ``synthesize-start`` makes the text SSML
  (docs/ssml.md); a streamed SSML text is spoken whole at ``synthesize-stop``, since markup cannot
  be cut into sentences before it is complete.
* ``speakd_chime`` (speakd's own field) on ``synthesize`` or ``synthesize-start``: a request's
  ``chime`` (``speakd.request.sounds``), played first in the same audio; a streamed text's first
  sentence has it. ``speakd_pitch``, the same way: a request's ``pitch`` in semitones
  (``speakd.audio.pitch``), every sentence of a stream at it.
* ``ping`` → ``pong``. Other event types are dropped, as the protocol asks of servers.
* ``speakd-word`` (out, between ``audio-start`` and ``audio-stop``, ahead of the audio it starts
  in; ``speakd-sentence`` after a ChatTTS sentence): a word's timing, ``{"word", "start", "end",
  "start_s", "end_s"}`` in samples and seconds from ``audio-start`` (``speakd.audio.Word.event``),
  for satellites and robots that move with the speech; Home Assistant reads up to ``audio-stop``
  and skips event types it does not know.
* ``speakd-mark`` (out, the same way): an SSML ``<mark>``, ``{"name", "sample"}``, ahead of the
  audio that follows it (after the last chunk, before ``audio-stop``, for a mark at the end).
* ``speakd-warning`` (out, before ``audio-start``): a part of the request skipped while the rest
  is spoken, ``{"code", "message"}`` (a clip speakd lacks, a speaker the voice lacks:
  docs/reliability.md, "Lenient input"); also logged and counted.

Work runs in the connection's own task, one request after another, while its events keep being
read: ``describe`` is answered even mid-synthesis, and a client that goes away cancels what it was
owed (its streams are released; the last reader out cancels the synthesis). A bad event, an
unknown voice, empty or over-long text, a busy daemon (``limits.max_streams`` streams for all of
``limits.stream_wait_s``), more than
``limits.max_queue`` pending requests or a failed synthesis is an ``error`` event with a code
(``messages.error_data``) and the connection goes on; a synthesis that was refused or failed is
still closed with ``audio-stop``, which is what Home Assistant waits for. Nothing here goes
through the scheduler: Wyoming never interrupts what the board is playing.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlparse

from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.error import Error
from wyoming.event import Event
from wyoming.info import Describe
from wyoming.ping import Ping, Pong
from wyoming.server import AsyncEventHandler, AsyncServer, AsyncUnixServer
from wyoming.tts import (
    Synthesize,
    SynthesizeChunk,
    SynthesizeStart,
    SynthesizeStop,
    SynthesizeStopped,
    SynthesizeVoice,
)

from speakd.config import WyomingConfig
from speakd.control import Control
from speakd.frontends.sentences import SentenceSplitter
from speakd.frontends.unixserver import widen_backlog
from speakd.frontends.wyoming_wire import WireError, build_info, read_event
from speakd.request.errors import RequestError
from speakd.request.messages import SpeakRequest, error_data
from speakd.request.stream import AudioStream

log = logging.getLogger(__name__)

SAMPLES_PER_CHUNK = 1024  # per audio-chunk event, as wyoming-piper sends them


@dataclass(frozen=True)
class _Say:
    """A job: one text to speak, made into a request when its turn comes, so that a refusal is
    answered in order and a reload's new engine is the one that checks it."""

    text: Any
    voice: dict[str, Any]  # the request's fields but its text


STOPPED = None  # a job: the text stream's last sentence is out, send synthesize-stopped
Job = _Say | None


class WyomingFrontend:
    """The server: one ``WyomingHandler`` per connection, all in the daemon's event loop."""

    def __init__(
        self,
        control: Control,
        config: WyomingConfig,
        *,
        max_event_bytes: int,
        max_pending: int,
        socket_mode: int,
    ) -> None:
        self.control = control
        self.config = config
        self.max_event_bytes = max_event_bytes  # limits.max_line_bytes
        self.max_pending = max_pending  # limits.max_queue, per connection
        self.socket_mode = socket_mode  # [socket] mode, for a unix:// server
        self.server: AsyncServer | None = None
        self._zeroconf: Any = None
        self._connections = itertools.count(1)

    async def start(self) -> None:
        self.server = AsyncServer.from_uri(self.config.uri)
        await self.server.start(self._handler)
        widen_backlog(self.server._server)  # the library listens with asyncio's backlog
        if isinstance(self.server, AsyncUnixServer):  # bound with the umask: same mode as ours
            os.chmod(self.server.socket_path, self.socket_mode)
        log.info("Wyoming server on %s", self.config.uri)
        if self.config.zeroconf:
            try:
                await self._announce()
            except OSError as e:  # no multicast route (yet): serve anyway, HA can add it by hand
                log.warning("Wyoming zeroconf announcement failed, serving without it: %s", e)

    async def close(self) -> None:
        """Stop listening and drop every connection (their work is cancelled)."""
        if self._zeroconf is not None:
            with contextlib.suppress(Exception):  # a network already gone must not stop a stop
                await self._zeroconf._aiozc.async_close()  # the library has no unregister
            self._zeroconf = None
        if self.server is not None:
            await self.server.stop()
            self.server = None

    def info_event(self) -> Event:
        """``info`` for the voices there are now (a reload may change them)."""
        return build_info(self.control.voices()).event()

    async def _announce(self) -> None:
        """Zeroconf (mDNS) so Home Assistant discovers the server, as wyoming-piper does."""
        from wyoming.zeroconf import HomeAssistantZeroconf

        url = urlparse(self.config.uri)
        assert url.port is not None  # WyomingConfig.validate: zeroconf needs tcp://HOST:PORT
        host = None if url.hostname in ("0.0.0.0", "::") else url.hostname
        self._zeroconf = HomeAssistantZeroconf(port=url.port, name=self.config.zeroconf, host=host)
        await self._zeroconf.register_server()
        log.info("Wyoming server announced over zeroconf as %r", self.config.zeroconf)

    def _handler(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> WyomingHandler:
        peer = writer.get_extra_info("peername")
        origin = f"wyoming:{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else "wyoming"
        return WyomingHandler(self, reader, writer, origin, f"wyoming:{next(self._connections)}")


@dataclass
class _TextStream:
    """A ``synthesize-start`` … ``synthesize-stop`` in progress. ``failed``: its voice was
    refused at the start (the client heard why once); its text is dropped, not refused again."""

    voice: dict[str, str]
    splitter: SentenceSplitter
    chime: dict[str, Any] = field(default_factory=dict)  # the first sentence's
    ssml: bool = False  # text_format "ssml": one document, spoken whole at synthesize-stop
    document: str = ""
    failed: bool = False
    sentences: int = 0
    hold: asyncio.TimerHandle | None = None  # a held sentence end, spoken when it runs out


@dataclass
class _Owed:
    """The connection's pending work, spoken in order by one task."""

    jobs: asyncio.Queue[Job] = field(default_factory=asyncio.Queue)
    task: asyncio.Task[None] | None = None
    current: str | None = None  # the request being spoken


class WyomingHandler(AsyncEventHandler):
    """One connection: its events are read and answered here, its audio is made by its own task
    (``_work``), so a ``describe`` or the next chunk of text never waits for a synthesis."""

    def __init__(
        self,
        frontend: WyomingFrontend,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        origin: str,
        client: str,
    ) -> None:
        super().__init__(reader, writer)
        self.frontend = frontend
        self.control = frontend.control
        self.origin, self.client = origin, client
        self._text: _TextStream | None = None
        self._owed = _Owed()

    async def run(self) -> None:
        """The library's loop, reading with ``read_event``: a malformed event is answered with an
        error and the connection goes on (unless the stream cannot be followed past it)."""
        log.debug("%s connected (%s)", self.client, self.origin)
        try:
            while True:
                try:
                    event = await read_event(self.reader, self.frontend.max_event_bytes)
                except WireError as e:
                    log.info("%s: %s", self.client, e)
                    self.control.refused(self.origin, e.code)
                    await self._error(e)
                    if e.fatal:
                        await self._swallow_input()
                        break
                    continue
                if event is None or not await self.handle_event(event):
                    break
        except ConnectionError:
            pass
        finally:
            await self.disconnect()
            self.writer.close()

    async def _swallow_input(self) -> None:
        """Before closing on a fatal error: half-close, then read what the client already sent
        (for a second at most). Closing with unread input resets the connection, and the client
        would lose the error that says why."""

        async def swallow() -> None:
            while await self.reader.read(1 << 16):
                pass

        with contextlib.suppress(ConnectionError, TimeoutError, OSError):
            self.writer.write_eof()
            await asyncio.wait_for(swallow(), 1.0)

    async def disconnect(self) -> None:
        """The client left (or is dropped): cancel what it was still owed."""
        owed = self._owed
        if owed.task is None or owed.task.done():
            return
        if owed.current is not None or not owed.jobs.empty():
            log.info(
                "%s left: request %s and %d pending cancelled",
                self.client,
                owed.current,
                owed.jobs.qsize(),
            )
        owed.task.cancel()
        await asyncio.gather(owed.task, return_exceptions=True)

    async def handle_event(self, event: Event) -> bool:
        try:
            await self._dispatch(event)
        except RequestError as e:  # refused here, before any request was built
            self.control.refused(self.origin, e.code)
            await self._error(e)
        return True

    async def _dispatch(self, event: Event) -> None:
        kind = event.type
        if Describe.is_type(kind):
            await self.write_event(self.frontend.info_event())
        elif Synthesize.is_type(kind):
            if self._text is not None:
                log.debug("%s: synthesize inside a text stream ignored", self.client)
                return
            try:
                synthesize = _parse(Synthesize.from_event, event)
                fields = _voice_fields(synthesize.voice) | _format(synthesize.text_format)
                fields |= _chime(event) | _pitch(event)
                self._enqueue(_Say(synthesize.text, fields))
            except RequestError as e:  # answered as a failed synthesis is (see _speak)
                self.control.refused(self.origin, e.code)
                await self._error(e)
                await self.write_event(AudioStop().event())
        elif SynthesizeStart.is_type(kind):
            start = _parse(SynthesizeStart.from_event, event)
            self._start_text(start.voice, start.text_format, _chime(event), _pitch(event))
        elif SynthesizeChunk.is_type(kind):
            text = self._open_text(kind)
            chunk = _parse(SynthesizeChunk.from_event, event).text
            if not isinstance(chunk, str):
                raise RequestError("bad_text", "synthesize-chunk text must be a string")
            if text.ssml:  # markup cannot be cut into sentences before it is whole
                text.document += chunk
                return
            self._hold(text)
            self._sentences(text, text.splitter.feed(chunk))
            if text.splitter.held() and self.frontend.config.sentence_hold_ms:
                text.hold = asyncio.get_running_loop().call_later(
                    self.frontend.config.sentence_hold_ms / 1000, self._release, text
                )
        elif SynthesizeStop.is_type(kind):
            text = self._open_text(kind)
            self._hold(text)
            whole = [text.document] if text.document.strip() else []
            self._sentences(text, whole if text.ssml else text.splitter.finish(), STOPPED)
            self._text = None
            log.info("%s: text stream ended (%d sentences)", self.client, text.sentences)
        elif Ping.is_type(kind):
            await self.write_event(Pong(text=_parse(Ping.from_event, event).text).event())
        else:
            log.debug("%s: %s event dropped", self.client, kind)

    # ---- text streamed in -------------------------------------------------------------------

    def _start_text(
        self,
        voice: SynthesizeVoice | None,
        text_format: str | None,
        chime: dict[str, Any],
        pitch: dict[str, Any],
    ) -> None:
        if self._text is not None:
            raise RequestError("bad_event", "synthesize-start inside an open text stream")
        fields = _voice_fields(voice) | _format(text_format) | pitch
        splitter = SentenceSplitter(self.control.max_text_chars)
        self._text = _TextStream(fields, splitter, chime, ssml="format" in fields)
        try:  # refuse an unknown voice once, here, rather than once per sentence
            self.control.select_voice(fields.get("voice"), fields.get("lang"))
        except RequestError:
            self._text.failed = True
            raise

    @staticmethod
    def _hold(text: _TextStream) -> None:
        """More text came (or its end): a held sentence end waits no longer for the timer."""
        if text.hold is not None:
            text.hold.cancel()
            text.hold = None

    def _release(self, text: _TextStream) -> None:
        """``wyoming.sentence_hold_ms`` passed with no more text: the held sentence is spoken."""
        text.hold = None
        if self._text is text:
            self._sentences(text, text.splitter.release())

    def _open_text(self, kind: str) -> _TextStream:
        if self._text is None:
            raise RequestError("bad_event", f"{kind} without synthesize-start")
        return self._text

    def _sentences(self, text: _TextStream, sentences: list[str], *end: Job) -> None:
        jobs: list[Job] = []
        if not text.failed:
            jobs = [
                _Say(s, text.voice | (text.chime if text.sentences + i == 0 else {}))
                for i, s in enumerate(sentences)
            ]
            text.sentences += len(jobs)
        self._enqueue(*jobs, *end)

    # ---- the work ---------------------------------------------------------------------------

    def _request(self, text: Any, voice: dict[str, Any]) -> SpeakRequest:
        return self.control.build_request(
            {"text": text, **voice}, origin=self.origin, client=self.client
        )

    def _enqueue(self, *jobs: Job) -> None:
        owed = self._owed
        if owed.jobs.qsize() + len(jobs) > self.frontend.max_pending:
            raise RequestError(
                "queue_full",
                f"{owed.jobs.qsize()} requests pending on this connection (limits.max_queue)",
            )
        for job in jobs:
            owed.jobs.put_nowait(job)
        if jobs and owed.task is None:
            owed.task = asyncio.create_task(self._work(), name=f"wyoming-{self.client}")

    async def _work(self) -> None:
        owed = self._owed
        try:
            while True:
                job = await owed.jobs.get()
                if job is STOPPED:
                    await self.write_event(SynthesizeStopped().event())
                    continue
                await self._speak(job)
        except ConnectionError:
            log.debug("%s went away mid-answer", self.client)
            self.reader.feed_eof()  # ends run(), which closes the connection

    async def _speak(self, say: _Say) -> None:
        """One request's audio as audio-start, audio-chunk…, audio-stop. A refused or failed one
        is an error, then audio-stop all the same: Home Assistant reads a synthesize's answer up
        to its audio-stop and does not look at error events."""
        rid: str | None = None
        started = False
        try:
            request = self._request(say.text, say.voice)
            rid = self._owed.current = request.id
            for warning in request.warnings:  # Home Assistant skips events it does not know
                await self.write_event(Event("speakd-warning", warning.to_dict()))
            async with self.control.stream(request) as stream:
                index = offset = 0  # chunks and samples sent before this chunk
                async for chunk in stream.aread():
                    await self._marks(stream, index, offset)
                    fmt = {
                        "rate": chunk.sample_rate,
                        "width": chunk.sample_width,
                        "channels": chunk.channels,
                    }
                    if not started:
                        await self.write_event(AudioStart(**fmt).event())
                        started = True
                    for word in chunk.words:
                        timing = word.event(offset, chunk.sample_rate)
                        await self.write_event(Event(f"speakd-{word.kind}", timing))
                    index, offset = index + 1, offset + chunk.frames
                    step = SAMPLES_PER_CHUNK * chunk.sample_width * chunk.channels
                    for i in range(0, len(chunk.pcm), step):
                        piece = chunk.pcm[i : i + step]
                        await self.write_event(AudioChunk(audio=piece, **fmt).event())
                await self._marks(stream, index, offset)
                if not started:  # no audio at all: still a well-formed answer
                    rate = self.control.sample_rate(request)
                    await self.write_event(AudioStart(rate=rate, width=2, channels=1).event())
                log.info(
                    "request %s: %.2f s of audio sent (%s)",
                    rid,
                    stream.duration,
                    "cached" if stream.from_cache else "synthesized",
                )
        except (ConnectionError, asyncio.CancelledError):  # gone: leaving the block released it
            log.info("request %s: the client left; its stream is released", rid)
            raise
        except Exception as e:  # refused, busy, engine failures: the client hears why, goes on
            log.warning("request %s failed: %s", rid or "(refused)", e)
            await self._error(e)
        finally:
            self._owed.current = None
        await self.write_event(AudioStop().event())

    async def _marks(self, stream: AudioStream, index: int, offset: int) -> None:
        """The SSML marks before chunk ``index``, as ``speakd-mark`` events at their offset in
        samples from ``audio-start`` (the socket's ``mark`` event)."""
        for name in stream.marks_before(index):
            await self.write_event(Event("speakd-mark", {"name": name, "sample": offset}))

    async def _error(self, e: BaseException) -> None:
        data = error_data(e)
        await self.write_event(Error(text=data["message"], code=data["code"]).event())


def _parse(parser: Any, event: Event) -> Any:
    """The library's ``from_event``, with a malformed event as a ``bad_event`` error (the library
    takes a voice that is not an object, ``"voice": "x"``, as no voice: refused here)."""
    if not isinstance(event.data.get("voice") or {}, dict):
        raise RequestError("bad_event", f"{event.type}: voice must be an object")
    try:
        return parser(event)
    except (KeyError, TypeError, AttributeError, ValueError) as e:
        raise RequestError("bad_event", f"malformed {event.type} event: {e!r}") from None


def _format(text_format: str | None) -> dict[str, str]:
    """``text_format: "ssml"`` makes the text SSML (docs/ssml.md); any other is plain text."""
    return {"format": "ssml"} if text_format == "ssml" else {}


def _chime(event: Event) -> dict[str, Any]:
    """speakd's ``speakd_chime`` field as the request's ``chime``."""
    chime = event.data.get("speakd_chime")
    return {} if chime is None else {"chime": chime}


def _pitch(event: Event) -> dict[str, Any]:
    """speakd's ``speakd_pitch`` field as the request's ``pitch`` (semitones)."""
    pitch = event.data.get("speakd_pitch")
    return {} if pitch is None else {"pitch": pitch}


def _voice_fields(voice: SynthesizeVoice | None) -> dict[str, str]:
    """A Wyoming voice as request fields: ``name`` names the voice, ``speaker`` (Home
    Assistant's speaker option) a speaker inside it, and a language picks the voice by language
    (``Control.select_voice``)."""
    if voice is None:
        return {}
    fields: dict[str, Any] = {}
    if voice.name is not None:
        fields["voice"] = voice.name
    if voice.speaker is not None:
        fields["speaker"] = voice.speaker
    if voice.language is not None:
        fields["lang"] = voice.language
    return fields
