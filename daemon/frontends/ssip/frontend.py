"""Speech Dispatcher's SSIP on a Unix socket, so the stock ``spd-say`` (and libspeechd clients)
talk to speakd unchanged.

    $ SPEECHD_ADDRESS=unix_socket:/run/speakd/ssip.sock SPEECHD_CMD=/bin/false spd-say -w hello

Each connection is one SSIP client with its own settings (``SET SELF …``) and a numeric client
id; every message gets a numeric message id (``225-<id>``). Settings speakd has a notion of are
applied to each SPEAK: PRIORITY → the scheduler's priority, RATE −100..100 → speed 0.25..4
(2^(rate/50)), VOLUME −100..100 → gain 0..1 (speechd's default 100 = speakd's normal gain),
SYNTHESIS_VOICE → the voice when speakd knows it (else the default voice, as speechd's modules
fall back), LANGUAGE → a voice of that language when the default voice is of another one,
SSML_MODE on → the text is SSML (docs/ssml.md; a fragment without ``<speak>`` is wrapped in
one), SPELLING on → letters spoken one by one, and speakd's own CHIME <name> (``NONE``: off) → that
sound before each SPEAK (a request's ``chime``, ``speakd.request.sounds``), PUNCTUATION (and the old
PUNCTUATION_IMPORTANT) → the request's ``punctuation`` (``speakd.markup.punctuation``), PITCH
−100..100 → ``pitch`` ±12 semitones (``speakd.audio.pitch``), CAP_LET_RECOGN → ``capitals``
(``speakd.markup.capitals``). PITCH_RANGE, VOICE_TYPE and OUTPUT_MODULE are accepted, stored and
reported by GET, but change nothing.
Events 700 (an SSML mark reached, ``INDEX MARK`` with its name) and 701–705 go out (when the
client turned them on with ``SET SELF NOTIFICATION``) only between complete replies. Framing
rules live in ``parser``, each client's state in ``connection``, the command table in
``commands``; this module serves the connections and queues their speech.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable

from speakd.control import Control
from speakd.frontends.ssip.commands import ERR_INVALID_ENCODING, SsipCommands
from speakd.frontends.ssip.connection import Connection, Message, origin
from speakd.frontends.ssip.parser import (
    LineFramer,
    LineTooLong,
    SpeakBody,
    decode_text,
    printable,
    reply,
    strip_ssml,
)
from speakd.frontends.ssip.settings import Settings, request_fields
from speakd.frontends.unixserver import peer_of
from speakd.markup.ssml import is_ssml
from speakd.request.messages import Event, EventType, RequestError

log = logging.getLogger(__name__)

MAX_CONNECTIONS = 256
READ_CHUNK = 65536
OK_QUEUED = "OK MESSAGE QUEUED"


class SsipFrontend(SsipCommands):
    # What a peer outside the socket's allow-list reads before the connection closes.
    REFUSAL = reply(400, "ERR NOT ALLOWED HERE")

    def __init__(self, control: Control, max_line_bytes: int) -> None:
        self.control = control
        self.max_line_bytes = max_line_bytes
        self._client_ids = itertools.count(1)
        self._msg_ids = itertools.count(1)
        self._clients: dict[int, Connection] = {}
        self._inflight: dict[str, Message] = {}  # request id → message, until its end
        self._pause_all_owner: int | None = None  # the client whose PAUSE ALL holds everyone
        self._handlers: dict[str, Callable[[Connection, list[str], str], bytes]] = {
            "set": self._set,
            "stop": self._stop,
            "cancel": self._cancel,
            "pause": self._pause,
            "resume": self._resume,
            "char": self._event_message,
            "key": self._event_message,
            "sound_icon": self._event_message,
            "list": self._list,
            "get": self._get,
            "history": self._history,
            "help": self._help,
            "block": self._block,
        }

    # ---- connection -----------------------------------------------------------------------

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = peer_of(writer)
        conn = Connection(next(self._client_ids), writer, str(peer) if peer else "")
        if len(self._clients) >= MAX_CONNECTIONS:
            log.warning("ssip: refusing client %s: %d connections open", peer, MAX_CONNECTIONS)
            conn.write(reply(300, "ERR TOO MANY CLIENTS"))
            writer.close()
            return
        self._clients[conn.client_id] = conn
        log.debug("ssip client %d connected (%s)", conn.client_id, conn.peer)
        framer = LineFramer(self.max_line_bytes)
        body: SpeakBody | None = None
        try:
            while not conn.closed:
                data = await reader.read(READ_CHUNK)
                if not data:
                    break
                for line in framer.feed(data):
                    if conn.closed:
                        break
                    conn.busy = True
                    try:
                        out, body = self._process(conn, line, body)
                    except Exception:  # a bug here must cost one reply, not the daemon
                        log.exception("ssip client %d: command failed", conn.client_id)
                        out, body = reply(300, "ERR INTERNAL"), None
                    finally:
                        conn.busy = False
                    if out is not None:
                        conn.answer(out)
                await writer.drain()
        except (ConnectionError, BrokenPipeError):
            log.debug("ssip client %d went away", conn.client_id)
        finally:
            self._drop(conn)
            writer.close()

    def _drop(self, conn: Connection) -> None:
        """The client is gone: its queued speech still plays (spd-say exits right after
        queueing), but a pause it set is lifted so its utterance cannot block the queue."""
        conn.closed = True
        self._clients.pop(conn.client_id, None)
        self.control.resume(conn.key)
        if self._pause_all_owner == conn.client_id:  # nobody else could ever lift it
            self._pause_all_owner = None
            self.control.resume(None)
        log.debug("ssip client %d disconnected", conn.client_id)

    def _process(
        self, conn: Connection, line: bytes | LineTooLong, body: SpeakBody | None
    ) -> tuple[bytes | None, SpeakBody | None]:
        """One framed line → its reply (None while a SPEAK body is still coming) and the body
        being collected, if any."""
        if body is not None:
            if not body.add(line):
                return None, body
            return self._speak(conn, body), None
        if isinstance(line, LineTooLong):
            return reply(500, f"ERR LINE TOO LONG (limit {self.max_line_bytes})"), None
        return self._command(conn, line)

    def _speak(self, conn: Connection, body: SpeakBody) -> bytes:
        if body.overflow:
            self.control.refused(origin(conn), "text_too_long")
            return reply(400, f"ERR TEXT TOO LONG (limit {self.control.max_text_chars} characters)")
        data = body.data()
        if not data:
            return reply(227, "OK MESSAGE CANCELED")
        text = decode_text(data)
        if text is None:
            self.control.refused(origin(conn), "bad_encoding")
            return ERR_INVALID_ENCODING
        settings = conn.settings
        if settings.ssml_mode and settings.spelling:
            text = strip_ssml(text)  # spelled letter by letter: the markup has no say
        chime = settings.chime or None
        if settings.spelling:
            return self._queue(conn, " ".join(c for c in text if not c.isspace()), chime=chime)
        if settings.ssml_mode:
            if not strip_ssml(text):
                return self._queue(conn, "")  # tags only: nothing to say
            document = text if is_ssml(text) else f"<speak>{text}</speak>"
            return self._queue(conn, document, ssml=True, chime=chime)
        return self._queue(conn, text, chime=chime)

    def _queue(
        self,
        conn: Connection,
        text: str,
        *,
        ssml: bool = False,
        chime: str | None = None,
        char: bool = False,
    ) -> bytes:
        """Hand one message to the scheduler (``char``: a CHAR); reply 225 with its id (or the
        error)."""
        msg = Message(next(self._msg_ids), conn.client_id, conn)
        if not text.strip():
            # Nothing to say (SSML tags only, a space, a sound icon): speechd still queues it
            # and reports begin/end, so a waiting client (spd-say -w) returns.
            conn.notify("begin", 701, msg.msg_id, "BEGIN")
            conn.notify("end", 702, msg.msg_id, "END")
            return reply(225, OK_QUEUED, str(msg.msg_id))
        fields = request_fields(conn.settings, text, self._voice(conn.settings), char=char)
        fields["id"] = f"ssip-{msg.msg_id}"
        if ssml:
            fields["format"] = "ssml"
        if chime:
            fields["chime"] = chime
        try:
            request = self.control.build_request(
                fields,
                origin=origin(conn),
                client=conn.key,
                on_event=lambda ev: self._on_event(msg, ev),
                strict_lang=False,  # speechd speaks a language it lacks in the default voice
            )
        except RequestError as e:
            return _error_reply(e.code, str(e))
        self._inflight[request.id] = msg
        self.control.say(request)
        if msg.rejected is not None:
            self._inflight.pop(request.id, None)
            data = msg.rejected.data
            return _error_reply(data.get("code", "internal_error"), data.get("message", ""))
        msg.accepted = True
        return reply(225, OK_QUEUED, str(msg.msg_id))

    def _on_event(self, msg: Message, ev: Event) -> None:
        """Scheduler events → 70x notifications for the message's connection."""
        if ev.terminal:
            self._inflight.pop(ev.request_id, None)
        if not msg.accepted and ev.type is EventType.ERROR:
            msg.rejected = ev  # refused at submit: becomes the reply, not an event
            return
        conn = msg.conn
        if ev.type is EventType.STARTED:
            conn.notify("begin", 701, msg.msg_id, "BEGIN")
        elif ev.type is EventType.FINISHED and ev.data.get("status") == "done":
            conn.notify("end", 702, msg.msg_id, "END")
        elif ev.terminal:
            conn.notify("cancel", 703, msg.msg_id, "CANCELED")
        elif ev.type is EventType.PAUSED:
            conn.notify("pause", 704, msg.msg_id, "PAUSED")
        elif ev.type is EventType.RESUMED:
            conn.notify("resume", 705, msg.msg_id, "RESUMED")
        elif ev.type is EventType.MARK:  # playback reached an SSML <mark>
            name = printable(str(ev.data["name"]))
            conn.notify("index_marks", 700, msg.msg_id, "INDEX MARK", name)

    def _voice(self, settings: Settings) -> str | None:
        """SYNTHESIS_VOICE when speakd knows it (any case); else None, so LANGUAGE picks one."""
        if not settings.synthesis_voice:
            return None
        wanted = settings.synthesis_voice.lower()
        for v in self.control.voices():
            if v["name"].lower() == wanted:
                return v["name"]
        log.debug("ssip: unknown voice %r, using the default", settings.synthesis_voice)
        return None


def _error_reply(code: str, message: str) -> bytes:
    """A request speakd refuses: 4xx when the client can fix it, 3xx when speakd cannot."""
    server_side = code in ("queue_full", "shutting_down", "duplicate_id", "internal_error")
    return reply(300 if server_side else 400, f"ERR {printable(message)}")
