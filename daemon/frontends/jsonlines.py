"""JSON lines on a Unix socket: one JSON object per line in, events out on the same connection.

Ops: ``say`` (text, id, voice, priority, speed, volume, seed, params, wait), ``stop``, ``cancel``
(id), ``status``, ``voices``. A ``say`` is answered with ``queued`` (or ``error``); with
``"wait": true`` the connection also gets ``started`` and the terminal ``finished``/``error``.

    $ echo '{"op":"say","text":"Door open","wait":true}' | socat - UNIX:/run/speakd/speakd.sock
    {"event":"queued","id":"r…","position":0}
    {"event":"started","id":"r…","latency_ms":12.5}
    {"event":"finished","id":"r…","status":"done"}

A malformed line gets an ``error`` event and the connection stays usable; a line over
``limits.max_line_bytes`` or invalid UTF-8 gets an error and the connection is closed.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from speakd.control import Control
from speakd.frontends.unixserver import peer_of
from speakd.messages import Event, RequestError, dump_json, parse_json

log = logging.getLogger(__name__)


def _line(obj: dict[str, Any]) -> bytes:
    return dump_json(obj) + b"\n"


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

        def send(obj: dict[str, Any]) -> None:
            if not writer.is_closing():
                writer.write(_line(obj))

        try:
            while True:
                try:
                    raw = await reader.readline()
                except ValueError:  # asyncio's LimitOverrunError for an endless line
                    send(_error(None, "line_too_long", f"line exceeds {self.max_line_bytes} bytes"))
                    break
                if not raw:
                    break
                if not raw.strip():
                    continue
                try:
                    text = raw.decode("utf-8")
                except UnicodeDecodeError:
                    send(_error(None, "bad_encoding", "request is not valid UTF-8"))
                    break
                self._dispatch(text, send, origin, client)
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            log.debug("%s went away", origin)
        finally:
            writer.close()

    def _dispatch(self, text: str, send: Any, origin: str, client: str) -> None:
        try:
            msg = parse_json(text)
        except RequestError as e:
            send(_error(None, e.code, str(e)))
            return
        if not isinstance(msg, dict):
            send(_error(None, "bad_request", "a request must be a JSON object"))
            return
        op = msg.get("op", "say")
        request_id = msg.get("id") if isinstance(msg.get("id"), str) else None
        try:
            if op == "say":
                self._say(msg, send, origin, client)
            elif op == "stop":
                send({"event": "ok", "op": "stop", "stopped": self.control.stop()})
            elif op == "cancel":
                n = self.control.cancel(request_id) if request_id else self.control.cancel()
                send({"event": "ok", "op": "cancel", "id": request_id, "cancelled": n})
            elif op == "status":
                send({"event": "status", **self.control.status()})
            elif op == "voices":
                send({"event": "voices", "voices": self.control.voices()})
            else:
                raise RequestError(
                    "unknown_op", f"unknown op {op!r} (say, stop, cancel, status, voices)"
                )
        except RequestError as e:
            send(_error(request_id, e.code, str(e)))

    def _say(self, msg: dict[str, Any], send: Any, origin: str, client: str) -> None:
        wait = bool(msg.get("wait", False))

        def on_event(event: Event) -> None:
            if (
                wait
                or event.type.value in ("queued", "error")
                or (event.terminal and event.data.get("status") == "discarded")
            ):
                send(event.to_dict())

        request = self.control.build_request(msg, origin=origin, client=client, on_event=on_event)
        self.control.say(request)


def _error(request_id: str | None, code: str, message: str) -> dict[str, Any]:
    return {"event": "error", "id": request_id, "code": code, "message": message}
