"""JSON lines on a Unix socket: one JSON object per line in, events out on the same connection.

Ops: ``say`` (text, id, voice, lang, priority, speed, volume, seed, params, cache_only, wait) plays
on the board; ``synth`` (the same fields but priority, volume and wait) streams the audio back
without playing it; ``explain`` (the same fields) says what it would say, part by part;
``stop``, ``cancel`` (id), ``status``, ``voices``. Every reply and event carries the request's
``id`` (null when the request had none and none was made).

A request spoken with a part skipped (a clip speakd lacks, a speaker its voice lacks:
docs/reliability.md, "Lenient input") gets a ``warning`` event first, ``{"event":"warning",
"id":"r…","code":"unknown_clip","message":"…"}``, then is answered as any other.

A ``say`` is answered with ``queued`` (or ``error``); with ``"wait": true`` the connection also
gets ``started`` and the terminal ``finished``/``error``:

    $ echo '{"op":"say","text":"Door open","wait":true}' \\
        | socat -t 30 - UNIX:/run/speakd/speakd.sock
    {"event":"queued","id":"r…","position":0}
    {"event":"started","id":"r…","latency_ms":12.5}
    {"event":"finished","id":"r…","status":"done"}

A ``synth`` is answered with ``audio`` events, base64 PCM with its format, then ``finished``:

    {"event":"audio","id":"r…","format":{"encoding":"s16le","rate":22050,"width":2,"channels":1},
     "data":"…"}
    {"event":"finished","id":"r…","status":"done","duration_s":1.32,"cached":true}

Text in SSML (``"format": "ssml"``, or a text whose root is ``<speak>``: docs/ssml.md) is
synthesised the same way; each ``<mark>`` is a ``mark`` event, ahead of the audio that follows
it, with its offset in samples from the start: ``{"event":"mark","id":"r…","name":"m",
"sample":26460}`` (a waiting ``say`` gets it when playback reaches the mark). With ``"words":
true`` each spoken word is a ``word`` event the same way (``speakd.audio.Word.event``).

A client that half-closes after its requests (``printf … | socat -t 30``) still gets every event
until those requests end (socat's default ``-t 0.5`` would hang up before they do). A malformed
line gets an ``error`` event and the connection stays usable; a line over
``limits.max_line_bytes`` or invalid UTF-8 gets an error and the connection is closed.
"""

from __future__ import annotations

import asyncio
import base64
import logging
from collections.abc import Callable
from typing import Any

from speakd.control import Control
from speakd.frontends.unixserver import peer_of
from speakd.request.messages import Event, RequestError, dump_json, error_data, parse_json
from speakd.request.stream import AudioStream

log = logging.getLogger(__name__)

OPS = ("say", "synth", "explain", "stop", "cancel", "status", "voices")
AUDIO_EVENT_BYTES = 32768  # PCM per ``audio`` event (≈ 0.7 s at 24 kHz), so lines stay short

Send = Callable[[dict[str, Any]], None]


def _line(obj: dict[str, Any]) -> bytes:
    return dump_json(obj) + b"\n"


class _Connection:
    """One client: what it is still owed, so a half-close does not cut its events short."""

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self.writer = writer
        self.owed: set[str] = set()  # ids of say(wait) requests not ended yet
        self.tasks: set[asyncio.Task[None]] = set()  # synth streams
        self.settled = asyncio.Event()
        self.settled.set()

    def send(self, obj: dict[str, Any]) -> None:
        if not self.writer.is_closing():
            self.writer.write(_line(obj))

    def owe(self, request_id: str) -> None:
        self.owed.add(request_id)
        self.settled.clear()

    def paid(self, request_id: str) -> None:
        self.owed.discard(request_id)
        if not self.owed:
            self.settled.set()


class JsonLinesFrontend:
    REFUSAL = b'{"event":"error","id":null,"code":"forbidden","message":"not allowed here"}\n'

    def __init__(self, control: Control, max_line_bytes: int) -> None:
        self.control = control
        self.max_line_bytes = max_line_bytes
        self._connections = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._connections += 1
        peer = peer_of(writer)
        client = f"json:{self._connections}"
        origin = f"json:{peer}" if peer else "json"
        conn = _Connection(writer)
        try:
            while True:
                try:
                    raw = await reader.readline()
                except ValueError:  # asyncio's LimitOverrunError for an endless line
                    self.control.refused(origin, "line_too_long")
                    conn.send(
                        _error(None, "line_too_long", f"line exceeds {self.max_line_bytes} bytes")
                    )
                    break
                if not raw:  # EOF, or a half-close: what is owed still goes out
                    await conn.settled.wait()
                    if conn.tasks:
                        await asyncio.gather(*conn.tasks, return_exceptions=True)
                    break
                if not raw.strip():
                    continue
                try:
                    text = raw.decode("utf-8")
                except UnicodeDecodeError:
                    self.control.refused(origin, "bad_encoding")
                    conn.send(_error(None, "bad_encoding", "request is not valid UTF-8"))
                    break
                self._dispatch(text, conn, origin, client)
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            log.debug("%s went away", origin)
        finally:
            for task in conn.tasks:
                task.cancel()
            writer.close()

    def _dispatch(self, text: str, conn: _Connection, origin: str, client: str) -> None:
        try:
            msg = parse_json(text)
            if not isinstance(msg, dict):
                raise RequestError("bad_request", "a request must be a JSON object")
        except RequestError as e:
            self.control.refused(origin, e.code)
            conn.send(_error(None, e.code, str(e)))
            return
        op = msg.get("op", "say")
        raw_id = msg.get("id")
        request_id = str(raw_id) if isinstance(raw_id, str | int) and raw_id is not True else None
        reply: dict[str, Any] | None
        try:
            if op == "say":
                reply = None
                self._say(msg, conn, origin, client)
            elif op == "synth":
                reply = None
                self._synth(msg, conn, origin, client)
            elif op == "explain":
                built = self.control.build_request(msg, origin=origin, client=client)
                reply = {"event": "explain", **self.control.explain(built)}
            elif op == "stop":
                reply = {"event": "ok", "op": "stop", "stopped": self.control.stop()}
            elif op == "cancel":
                n = self.control.cancel(request_id) if request_id else self.control.cancel()
                reply = {"event": "ok", "op": "cancel", "cancelled": n}
            elif op == "status":
                reply = {"event": "status", **self.control.status()}
            elif op == "voices":
                reply = {
                    "event": "voices",
                    "voices": self.control.voices(),
                    "options": self.control.options(),
                }
            else:
                self.control.refused(origin, "unknown_op")
                raise RequestError("unknown_op", f"unknown op {op!r} ({', '.join(OPS)})")
        except RequestError as e:
            reply = _error(request_id, e.code, str(e))
        if reply is not None:
            conn.send({"event": reply.pop("event"), "id": request_id, **reply})

    def _say(self, msg: dict[str, Any], conn: _Connection, origin: str, client: str) -> None:
        wait = bool(msg.get("wait", False))

        def on_event(event: Event) -> None:
            if (
                wait
                or event.type.value in ("warning", "queued", "error")
                or (event.terminal and event.data.get("status") == "discarded")
            ):
                conn.send(event.to_dict())
            if event.terminal:
                conn.paid(event.request_id)

        request = self.control.build_request(msg, origin=origin, client=client, on_event=on_event)
        if wait:
            conn.owe(request.id)
        self.control.say(request)

    def _synth(self, msg: dict[str, Any], conn: _Connection, origin: str, client: str) -> None:
        request = self.control.build_request(  # its warnings, before any audio
            msg, origin=origin, client=client, on_event=lambda e: conn.send(e.to_dict())
        )
        task = asyncio.create_task(self._stream(request, conn), name=f"synth-{request.id}")
        conn.tasks.add(task)
        task.add_done_callback(conn.tasks.discard)

    async def _stream(self, request: Any, conn: _Connection) -> None:
        rid = request.id
        try:
            async with self.control.stream(request) as stream:
                index = frames = 0
                async for chunk in stream.aread():
                    _send_marks(conn, rid, stream, index, frames)
                    for word in chunk.words if request.words else ():
                        conn.send(
                            {"event": word.kind, "id": rid, **word.event(frames, chunk.sample_rate)}
                        )
                    index, frames = index + 1, frames + chunk.frames
                    fmt = {
                        "encoding": "s16le",
                        "rate": chunk.sample_rate,
                        "width": chunk.sample_width,
                        "channels": chunk.channels,
                    }
                    for i in range(0, len(chunk.pcm), AUDIO_EVENT_BYTES):
                        data = base64.b64encode(chunk.pcm[i : i + AUDIO_EVENT_BYTES]).decode()
                        conn.send({"event": "audio", "id": rid, "format": fmt, "data": data})
                        await conn.writer.drain()
                _send_marks(conn, rid, stream, index, frames)
                finished = {
                    "event": "finished",
                    "id": rid,
                    "status": "done",
                    "duration_s": round(stream.duration, 3),
                    "cached": stream.from_cache,
                }
                if stream.voice_load_s is not None:  # its voice was loaded for it first
                    finished["voice_load_ms"] = round(stream.voice_load_s * 1000, 1)
                conn.send(finished)
        except ConnectionError:
            log.info("request %s: the client left; its synthesis is released", rid)
        except Exception as e:  # RequestError (busy), engine failures: the caller hears why
            conn.send({"event": "error", "id": rid, **error_data(e)})


def _send_marks(conn: _Connection, rid: str, stream: AudioStream, index: int, frames: int) -> None:
    """The SSML marks before chunk ``index``, at their offset in samples from the audio's start."""
    for name in stream.marks_before(index):
        conn.send({"event": "mark", "id": rid, "name": name, "sample": frames})


def _error(request_id: str | None, code: str, message: str) -> dict[str, Any]:
    return {"event": "error", "id": request_id, "code": code, "message": message}
