"""One Wyoming connection: the events a client sends and what speakd answers (docs/wyoming.md).

Events, on the ``wyoming`` package's own event classes:

* ``describe`` → ``info``: one program with every voice of every engine, their languages and
  speakers (``wire.build_info``), as they are now (a reload may add voices).
* ``synthesize`` → ``audio-start``, ``audio-chunk``…, ``audio-stop``: one request through
  ``Control.stream`` — a cache hit comes straight from the cache, a miss shares one synthesis with
  any playback of the same key, and each chunk goes out as the engine yields it. A plain text
  over ``limits.max_text_chars`` is spoken sentence by sentence in that one answer (a whole text
  is bounded by what one event carries, ``limits.max_line_bytes``).
* ``synthesize-start``, ``synthesize-chunk``…, ``synthesize-stop`` (text streamed in, an LLM's
  answer): every sentence is a request of its own as soon as it is complete
  (``sentences.py``), each answered ``audio-start`` … ``audio-stop``, then
  ``synthesize-stopped``. The ``synthesize`` a client sends inside the stream for older servers is
  ignored, never spoken twice.
* ``text_format: "ssml"`` on ``synthesize`` or ``synthesize-start``, or a text whose root is
  ``<speak>``, makes the text SSML (docs/ssml.md); a streamed SSML text is spoken whole at
  ``synthesize-stop``, since markup cannot be cut before it is complete. Home Assistant 2026
  streams every text without a format, so a stream's start is read until it tells
  (``TextStream.take``).
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
owed (its streams are released; the last reader out cancels the synthesis). A synthesis refused
(an unknown voice, empty, whitespace-only or over-long text, a busy daemon: ``limits.max_streams``
streams for all of ``limits.stream_wait_s``, more than ``limits.max_queue`` pending requests) or
failed is an ``error`` event with a code (``messages.error_data``), counted, and then the end of the
connection (``_abort``): Home Assistant keeps whatever answer it reads as that text's audio, so a
refusal must read as a failure, never as silence. A malformed or unknown event of another kind is
an ``error`` and the connection goes on. Nothing here goes through the scheduler: Wyoming never
interrupts what the board is playing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.error import Error
from wyoming.event import Event
from wyoming.info import Describe
from wyoming.ping import Ping, Pong
from wyoming.server import AsyncEventHandler
from wyoming.tts import (
    Synthesize,
    SynthesizeChunk,
    SynthesizeStart,
    SynthesizeStop,
    SynthesizeStopped,
)

from speakd.frontends.wyoming.sentences import SentenceSplitter
from speakd.frontends.wyoming.texts import STOPPED, Job, Say, TextStream, whole_parts
from speakd.frontends.wyoming.wire import (
    CUT_OFF,
    WireError,
    chime,
    parse,
    pitch,
    read_event,
    text_format,
    voice_fields,
)
from speakd.markup.ssml import is_ssml
from speakd.request.errors import RequestError
from speakd.request.messages import SpeakRequest, error_data
from speakd.request.stream import AudioStream

if TYPE_CHECKING:
    from speakd.frontends.wyoming.frontend import WyomingFrontend

log = logging.getLogger(__name__)

SAMPLES_PER_CHUNK = 1024  # per audio-chunk event, as wyoming-piper sends them
_SYNTHESIS = frozenset({"synthesize", "synthesize-start", "synthesize-chunk", "synthesize-stop"})
ABORT_GRACE_S = 1.0  # after a refusal, how long the client has to close before speakd does


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
        self._text: TextStream | None = None
        self._owed = _Owed()
        self._closing = False  # a synthesis was refused: the connection ends (see _abort)

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
        if self._closing:  # what a client still sends after a refusal is read and dropped
            return True
        try:
            await self._dispatch(event)
        except RequestError as e:  # refused here, before any request was built
            self.control.refused(self.origin, e.code)
            if event.type not in _SYNTHESIS:
                await self._error(e)
                return True
            streamed = self._text is not None or not Synthesize.is_type(event.type)
            self._text = None
            await self.disconnect()  # what was owed before is not sent after the refusal
            await self._abort(e, cut=streamed)
        return True

    async def _dispatch(self, event: Event) -> None:
        kind = event.type
        if Describe.is_type(kind):
            await self.write_event(self.frontend.info_event())
        elif Synthesize.is_type(kind):
            if self._text is not None:
                log.debug("%s: synthesize inside a text stream ignored", self.client)
                return
            synthesize = parse(Synthesize.from_event, event)
            fields = voice_fields(synthesize.voice) | text_format(synthesize.text_format)
            parts = whole_parts(synthesize.text, fields, self.control.max_text_chars)
            self._enqueue(Say(parts, fields | pitch(event), chime(event)))
        elif SynthesizeStart.is_type(kind):
            self._start_text(event)
        elif SynthesizeChunk.is_type(kind):
            text = self._open_text(kind)
            chunk = parse(SynthesizeChunk.from_event, event).text
            if not isinstance(chunk, str):
                raise RequestError("bad_text", "synthesize-chunk text must be a string")
            chunk = text.take(chunk)
            if text.ssml or text.undecided:  # markup cannot be cut before it is whole
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
            if text.undecided:  # a text that never told: a document is SSML, else plain
                text.ssml = is_ssml(text.document)
                if not text.ssml:
                    self._sentences(text, text.splitter.feed(text.document))
            whole = [text.document] if text.document.strip() else []
            sentences = whole if text.ssml else text.splitter.finish()
            if text.sentences + len(sentences) == 0:
                raise RequestError("empty_text", "text is empty")  # as a whole synthesize's is
            self._sentences(text, sentences, STOPPED)
            self._text = None
            log.info("%s: text stream ended (%d sentences)", self.client, text.sentences)
        elif Ping.is_type(kind):
            await self.write_event(Pong(text=parse(Ping.from_event, event).text).event())
        else:
            log.debug("%s: %s event dropped", self.client, kind)

    # ---- text streamed in -------------------------------------------------------------------

    def _start_text(self, event: Event) -> None:
        if self._text is not None:
            raise RequestError("bad_event", "synthesize-start inside an open text stream")
        start = parse(SynthesizeStart.from_event, event)
        fields = voice_fields(start.voice) | text_format(start.text_format) | pitch(event)
        # an unknown voice is refused once, here, rather than once per sentence
        self.control.select_voice(fields.get("voice"), fields.get("lang"))
        splitter = SentenceSplitter(self.control.max_text_chars)
        ssml = "format" in fields
        self._text = TextStream(fields, splitter, chime(event), ssml=ssml, undecided=not ssml)

    @staticmethod
    def _hold(text: TextStream) -> None:
        """More text came (or its end): a held sentence end waits no longer for the timer."""
        if text.hold is not None:
            text.hold.cancel()
            text.hold = None

    def _release(self, text: TextStream) -> None:
        """``wyoming.sentence_hold_ms`` passed with no more text: the held sentence is spoken."""
        text.hold = None
        if self._text is text:
            self._sentences(text, text.splitter.release())

    def _open_text(self, kind: str) -> TextStream:
        if self._text is None:
            raise RequestError("bad_event", f"{kind} without synthesize-start")
        return self._text

    def _sentences(self, text: TextStream, sentences: list[str], *end: Job) -> None:
        jobs: list[Job] = [
            Say((s,), text.voice, text.chime if text.sentences + i == 0 else {}, True)
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
                if not await self._speak(job):
                    return
        except ConnectionError:
            log.debug("%s went away mid-answer", self.client)
            self.reader.feed_eof()  # ends run(), which closes the connection

    async def _speak(self, say: Say) -> bool:
        """One answer: audio-start, audio-chunk…, audio-stop, for every part of the job (a long
        whole text's sentences are one answer, as the client asked for one). A refused or failed
        one ends the connection instead (``_abort``); False then."""
        sent: int | None = None  # samples of this answer sent; None before its audio-start
        try:
            for n, part in enumerate(say.parts):
                voice = say.voice | (say.first if n == 0 else {})
                sent = await self._speak_part(self._request(part, voice), sent)
        except (ConnectionError, asyncio.CancelledError):  # gone: leaving the block released it
            log.info("%s: the client left; its stream is released", self.client)
            raise
        except Exception as e:  # refused, busy, engine failures: the client hears why
            await self._abort(e, cut=say.streamed)
            return False
        finally:
            self._owed.current = None
        await self.write_event(AudioStop().event())
        return True

    async def _speak_part(self, request: SpeakRequest, sent: int | None) -> int:
        """One request's audio after ``sent`` samples of the answer (None: audio-start first);
        word and mark events count samples from the answer's audio-start. Returns the samples
        sent in all."""
        rid = self._owed.current = request.id
        for warning in request.warnings:  # Home Assistant skips events it does not know
            await self.write_event(Event("speakd-warning", warning.to_dict()))
        async with self.control.stream(request) as stream:
            index, offset = 0, sent or 0  # chunks and samples sent before this chunk
            async for chunk in stream.aread():
                await self._marks(stream, index, offset)
                fmt = {"rate": chunk.sample_rate, "width": chunk.sample_width}
                fmt["channels"] = chunk.channels
                if sent is None:
                    await self.write_event(AudioStart(**fmt).event())
                    sent = 0
                for word in chunk.words:
                    timing = word.event(offset, chunk.sample_rate)
                    await self.write_event(Event(f"speakd-{word.kind}", timing))
                index, offset = index + 1, offset + chunk.frames
                step = SAMPLES_PER_CHUNK * chunk.sample_width * chunk.channels
                for i in range(0, len(chunk.pcm), step):
                    piece = chunk.pcm[i : i + step]
                    await self.write_event(AudioChunk(audio=piece, **fmt).event())
            await self._marks(stream, index, offset)
            if sent is None:  # no audio at all: still a well-formed answer
                rate = self.control.sample_rate(request)
                await self.write_event(AudioStart(rate=rate, width=2, channels=1).event())
            log.info(
                "request %s: %.2f s of audio sent (%s)",
                rid,
                stream.duration,
                "cached" if stream.from_cache else "synthesized",
            )
        return offset

    async def _abort(self, e: BaseException, *, cut: bool) -> None:
        """A synthesis refused or failed: ``error`` (why), then the connection ends, so that no
        client takes the answer for silence and keeps it. Home Assistant ignores ``error`` and
        caches what it read up to ``audio-stop`` or a plain close of a stream: 2025.4 reports
        "No TTS" for a ``synthesize`` whose connection closes before ``audio-stop``; 2026 ends a
        stream's audio at a close and keeps it, and fails (keeping nothing) only on an event cut
        off mid-way, so a stream gets ``CUT_OFF`` before the close (docs/wyoming.md)."""
        self._closing = True
        log.warning("%s: %s; closing the connection", self.client, e)
        await self._error(e)
        if cut:
            self.writer.write(CUT_OFF)
        with contextlib.suppress(OSError):
            self.writer.write_eof()  # run() reads on until the client closes, or the grace ends
        asyncio.get_running_loop().call_later(ABORT_GRACE_S, self.reader.feed_eof)

    async def _marks(self, stream: AudioStream, index: int, offset: int) -> None:
        """The SSML marks before chunk ``index``, as ``speakd-mark`` events at their offset in
        samples from ``audio-start`` (the socket's ``mark`` event)."""
        for name in stream.marks_before(index):
            await self.write_event(Event("speakd-mark", {"name": name, "sample": offset}))

    async def _error(self, e: BaseException) -> None:
        data = error_data(e)
        await self.write_event(Error(text=data["message"], code=data["code"]).event())
