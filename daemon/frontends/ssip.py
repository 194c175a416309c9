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
rules live in ``ssip_parser``.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from xml.sax.saxutils import quoteattr

from speakd.audio.pitch import ssip_semitones
from speakd.control import Control
from speakd.frontends.ssip_parser import (
    LineFramer,
    LineTooLong,
    SpeakBody,
    decode_text,
    event,
    parse_int,
    printable,
    reply,
    split_command,
    strip_ssml,
)
from speakd.frontends.ssip_settings import (
    ERR_PARAMETER_INVALID,
    OBSOLETE_NAMES,
    OBSOLETE_TABLES,
    SET_REPLIES,
    VOICE_TYPES,
    Settings,
    apply_setting,
    rate_to_speed,
    request_lang,
    setting_value,
    volume_to_gain,
)
from speakd.frontends.unixserver import peer_of
from speakd.markup.ssml import is_ssml
from speakd.request.messages import Event, EventType, Priority, RequestError
from speakd.request.prepare import match_language

log = logging.getLogger(__name__)

MAX_CONNECTIONS = 256
READ_CHUNK = 65536

OK_QUEUED = "OK MESSAGE QUEUED"
ERR_INVALID_COMMAND = reply(500, "ERR INVALID COMMAND")
ERR_INVALID_ENCODING = reply(501, "ERR INVALID ENCODING")
ERR_MISSING_PARAMETER = reply(510, "ERR MISSING PARAMETER")
ERR_NOT_ALLOWED_INSIDE_BLOCK = reply(332, "ERR NOT ALLOWED INSIDE BLOCK")
ERR_NOT_IMPLEMENTED = reply(380, "ERR NOT YET IMPLEMENTED")
ERR_ID_NOT_EXIST = reply(406, "ERR ID DOESNT EXIST")

NOTIFICATIONS = ("begin", "end", "cancel", "pause", "resume", "index_marks")
NOT_IN_BLOCK = {"history", "stop", "cancel", "pause", "resume", "list", "get", "help"}


@dataclass(eq=False)
class Connection:
    client_id: int
    writer: asyncio.StreamWriter
    peer: str
    settings: Settings = field(default_factory=Settings)
    in_block: bool = False
    busy: bool = False  # between a command and its reply: events wait in ``held``
    held: list[bytes] = field(default_factory=list)
    closed: bool = False  # QUIT received or the peer went away: read no further

    @property
    def key(self) -> str:
        return client_key(self.client_id)

    def write(self, data: bytes) -> None:
        if not self.writer.is_closing():
            self.writer.write(data)

    def answer(self, data: bytes) -> None:
        """Send a complete reply, then any events that came in while it was being made."""
        self.write(data)
        held, self.held = self.held, []
        for item in held:
            self.write(item)

    def notify(self, kind: str, code: int, msg_id: int, text: str, *extra: str) -> None:
        if kind not in self.settings.notify:
            return
        data = event(code, msg_id, self.client_id, text, *extra)
        if self.busy:
            self.held.append(data)
        else:
            self.write(data)


def _origin(conn: Connection) -> str:
    """What a message is logged and counted under: its client's name, else its number."""
    return f"ssip:{conn.settings.client_name or conn.client_id}"


def client_key(client_id: int) -> str:
    return f"ssip:{client_id}"


@dataclass(eq=False)
class Message:
    """One queued SSIP message: its ids and whether its 225 reply went out yet."""

    msg_id: int
    client_id: int
    conn: Connection
    accepted: bool = False
    rejected: Event | None = None


class SsipFrontend:
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

    # ---- commands -------------------------------------------------------------------------

    def _command(self, conn: Connection, raw: bytes) -> tuple[bytes, SpeakBody | None]:
        """One command line → its complete reply (and a body collector after SPEAK)."""
        line = decode_text(raw.replace(b"\x00", b"?"))
        if line is None:
            return ERR_INVALID_ENCODING, None
        words = split_command(line)
        name = words[0].lower()
        if conn.in_block and name in NOT_IN_BLOCK:
            return ERR_NOT_ALLOWED_INSIDE_BLOCK, None
        if name == "speak":
            body = SpeakBody(max_bytes=4 * self.control.max_text_chars + self.max_line_bytes)
            return reply(230, "OK RECEIVING DATA"), body
        if name in ("quit", "bye"):
            conn.closed = True
            return reply(231, "HAPPY HACKING"), None
        handler = self._handlers.get(name)
        if handler is None:
            return ERR_INVALID_COMMAND, None
        return handler(conn, words, line), None

    # ---- SET ------------------------------------------------------------------------------

    def _set(self, conn: Connection, words: list[str], line: str) -> bytes:
        who, sub, value = _arg(words, 1), _arg(words, 2).lower(), _arg(words, 3)
        if not who or not sub:
            return ERR_MISSING_PARAMETER
        sub = OBSOLETE_NAMES.get(sub, sub)
        if sub in OBSOLETE_TABLES:
            return reply(*OBSOLETE_TABLES[sub]) if value else ERR_MISSING_PARAMETER
        self_only = who.lower() == "self"
        if sub == "priority":
            if conn.in_block:
                return ERR_NOT_ALLOWED_INSIDE_BLOCK
            if not self_only:
                return reply(301, "ERR COULDNT SET PRIORITY")
            if not value:
                return ERR_MISSING_PARAMETER
            try:
                conn.settings.priority = Priority[value.upper()]
            except KeyError:
                return reply(408, "ERR UNKNOWN PRIORITY")
            return reply(202, "OK PRIORITY SET")
        if sub == "client_name":
            if conn.in_block:
                return ERR_NOT_ALLOWED_INSIDE_BLOCK
            if not self_only:
                return ERR_PARAMETER_INVALID
            if not value:
                return ERR_MISSING_PARAMETER
            if value.count(":") != 2:
                return reply(311, "ERR COULDNT SET CLIENT_NAME")
            conn.settings.client_name = value.strip('"').lower()
            return reply(208, "OK CLIENT NAME SET")
        if sub == "notification":
            return self._set_notification(conn, self_only, value, _arg(words, 4))
        if sub not in SET_REPLIES:
            return ERR_INVALID_COMMAND
        if conn.in_block and sub in ("output_module", "spelling"):
            return ERR_NOT_ALLOWED_INSIDE_BLOCK
        if sub in ("synthesis_voice", "chime", "punctuation_important"):  # the rest of the line
            value = " ".join(words[3:]).strip()
        if not value:
            return ERR_MISSING_PARAMETER
        parsed = setting_value(sub, value)
        if isinstance(parsed, bytes):
            return parsed
        if sub == "chime" and parsed and self.control.sounds.find(parsed) is None:
            return reply(418, "ERR UNKNOWN CHIME")
        targets = self._targets(conn, who)
        if targets is None:
            return ERR_PARAMETER_INVALID
        code, text, err, err_text = SET_REPLIES[sub]
        if not targets:
            return reply(err, err_text)
        for target in targets:
            apply_setting(target.settings, sub, parsed)
        return reply(code, text)

    def _set_notification(self, conn: Connection, self_only: bool, kind: str, state: str) -> bytes:
        if not self_only:
            return ERR_PARAMETER_INVALID
        if not kind or not state:
            return ERR_MISSING_PARAMETER
        if state.lower() not in ("on", "off"):
            return ERR_PARAMETER_INVALID
        kind = kind.lower()
        kinds = NOTIFICATIONS if kind == "all" else (kind,)
        if kind != "all" and kind not in NOTIFICATIONS:
            return reply(316, "ERR COULDNT SET NOTIFICATION")
        if state.lower() == "on":
            conn.settings.notify.update(kinds)
        else:
            conn.settings.notify.difference_update(kinds)
        return reply(220, "OK NOTIFICATION SET")

    def _targets(self, conn: Connection, who: str) -> list[Connection] | None:
        """``self`` / ``all`` / a client id → connections; None when ``who`` is malformed."""
        who = who.lower()
        if who == "self":
            return [conn]
        if who == "all":
            return list(self._clients.values())
        client_id = parse_int(who)
        if client_id is None:
            return None
        target = self._clients.get(client_id)
        return [target] if target else []

    # ---- SPEAK, CHAR, KEY, SOUND_ICON -----------------------------------------------------

    def _speak(self, conn: Connection, body: SpeakBody) -> bytes:
        if body.overflow:
            self.control.refused(_origin(conn), "text_too_long")
            return reply(400, f"ERR TEXT TOO LONG (limit {self.control.max_text_chars} characters)")
        data = body.data()
        if not data:
            return reply(227, "OK MESSAGE CANCELED")
        text = decode_text(data)
        if text is None:
            self.control.refused(_origin(conn), "bad_encoding")
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

    def _event_message(self, conn: Connection, words: list[str], line: str) -> bytes:
        """CHAR, KEY and SOUND_ICON: one short message each, answered like SPEAK."""
        param = _arg(words, 1)
        if not param:
            return ERR_MISSING_PARAMETER
        kind = words[0].lower()
        # a sound speakd has (speakd.request.sounds) plays alone; others not
        if kind == "sound_icon":
            if self.control.sounds.find(param) is None:
                return self._queue(conn, "")
            return self._queue(conn, f"<speak><audio src={quoteattr(param)}/></speak>", ssml=True)
        if kind == "key":
            return self._queue(conn, param.replace("_", " "))
        return self._queue(conn, param if param != "space" else "space")

    def _queue(
        self, conn: Connection, text: str, *, ssml: bool = False, chime: str | None = None
    ) -> bytes:
        """Hand one message to the scheduler; reply 225 with its id (or the error)."""
        msg = Message(next(self._msg_ids), conn.client_id, conn)
        if not text.strip():
            # Nothing to say (SSML tags only, a space, a sound icon): speechd still queues it
            # and reports begin/end, so a waiting client (spd-say -w) returns.
            conn.notify("begin", 701, msg.msg_id, "BEGIN")
            conn.notify("end", 702, msg.msg_id, "END")
            return reply(225, OK_QUEUED, str(msg.msg_id))
        fields: dict[str, Any] = {
            "text": text,
            "format": "ssml" if ssml else None,
            "chime": chime,
            "id": f"ssip-{msg.msg_id}",
            "priority": conn.settings.priority.name.lower(),
            "voice": self._voice(conn.settings),
            "lang": request_lang(conn.settings.language),
            "speed": rate_to_speed(conn.settings.rate),
            "pitch": ssip_semitones(conn.settings.pitch),
            "volume": volume_to_gain(conn.settings.volume),
            "punctuation": conn.settings.punctuation,
            "punctuation_important": conn.settings.punctuation_important,
            "capitals": conn.settings.cap_let_recogn,
        }
        try:
            request = self.control.build_request(
                {k: v for k, v in fields.items() if v is not None},
                origin=_origin(conn),
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

    # ---- STOP, CANCEL, PAUSE, RESUME ------------------------------------------------------

    def _scope(self, conn: Connection, words: list[str]) -> str | int | bytes:
        """``all`` → "all", ``self``/<id> → a client id, else the error reply."""
        who = _arg(words, 1).lower()
        if not who:
            return ERR_MISSING_PARAMETER
        if who == "all":
            return "all"
        if who == "self":
            return conn.client_id
        client_id = parse_int(who)
        if client_id is None:
            return ERR_PARAMETER_INVALID
        if client_id <= 0:
            return ERR_ID_NOT_EXIST
        return client_id

    def _stop(self, conn: Connection, words: list[str], line: str) -> bytes:
        """Stop what is being spoken now (all clients' or one client's); the queue goes on."""
        scope = self._scope(conn, words)
        if isinstance(scope, bytes):
            return scope
        current = self.control.status()["current"]
        if scope == "all":
            self.control.cancel()
        elif current in self._inflight and self._inflight[current].client_id == scope:
            self.control.cancel(request_id=current)
        return reply(210, "OK STOPPED")

    def _cancel(self, conn: Connection, words: list[str], line: str) -> bytes:
        """Stop and drop everything queued (all clients' or one client's)."""
        scope = self._scope(conn, words)
        if isinstance(scope, bytes):
            return scope
        if scope == "all":
            self.control.stop()
        else:
            self.control.cancel(client=client_key(int(scope)))
        return reply(213, "OK CANCELED")

    def _pause(self, conn: Connection, words: list[str], line: str) -> bytes:
        scope = self._scope(conn, words)
        if isinstance(scope, bytes):
            return scope
        if scope == "all":
            self._pause_all_owner = conn.client_id
        self.control.pause(None if scope == "all" else client_key(int(scope)))
        return reply(211, "OK PAUSED")

    def _resume(self, conn: Connection, words: list[str], line: str) -> bytes:
        scope = self._scope(conn, words)
        if isinstance(scope, bytes):
            return scope
        if scope == "all":
            self._pause_all_owner = None
        if not self.control.resume(None if scope == "all" else client_key(int(scope))):
            return reply(417, "ERR NOT PAUSED")
        return reply(212, "OK RESUMED")

    # ---- LIST, GET, HISTORY, HELP, BLOCK --------------------------------------------------

    def _list(self, conn: Connection, words: list[str], line: str) -> bytes:
        what = _arg(words, 1).lower()
        if not what:
            return ERR_MISSING_PARAMETER
        if what == "voices":
            return reply(249, "OK VOICE LIST SENT", *(v.upper() for v in VOICE_TYPES))
        if what == "synthesis_voices":
            lang = request_lang(_arg(words, 2))
            rows = [  # one row per speaker, its name as the variant, as speech-dispatcher lists
                f"{printable(v['name'])}\t{printable(v['language'])}\t{printable(speaker)}"
                for v in self.control.voices()
                if not lang or match_language(tuple(v["languages"]), lang) is not None
                for speaker in v["speakers"] or ["none"]
            ]
            return reply(249, "OK VOICE LIST SENT", *rows)
        if what == "output_modules":
            kinds = dict.fromkeys(v["engine"] for v in self.control.voices())
            return reply(250, "OK MODULE LIST SENT", *kinds)
        return ERR_PARAMETER_INVALID

    def _get(self, conn: Connection, words: list[str], line: str) -> bytes:
        what = _arg(words, 1).lower()
        what = OBSOLETE_NAMES.get(what, what)
        if not what:
            return ERR_MISSING_PARAMETER
        s = conn.settings
        values: dict[str, Any] = {
            "voice_type": s.voice_type.upper() if not s.synthesis_voice else "NO_VOICE",
            "output_module": s.output_module or self.control.status()["engine"]["kind"],
            "language": s.language,
            "rate": s.rate,
            "pitch": s.pitch,
            "volume": s.volume,
            "punctuation": s.punctuation,
        }
        if what not in values:
            return ERR_PARAMETER_INVALID
        return reply(251, "OK GET RETURNED", printable(str(values[what])))

    def _history(self, conn: Connection, words: list[str], line: str) -> bytes:
        """Only ``HISTORY GET CLIENT_ID`` (libspeechd's spd_get_client_id); speakd keeps no
        history, so the rest answers 380 as speechd does for its unimplemented parts."""
        main, sub = _arg(words, 1).lower(), _arg(words, 2).lower()
        if not main:
            return ERR_MISSING_PARAMETER
        if main == "get":
            if sub == "client_id":
                return reply(245, "OK CLIENT ID SENT", str(conn.client_id))
            if sub in ("client_list", "client_messages", "last", "message"):
                return ERR_NOT_IMPLEMENTED
            return ERR_MISSING_PARAMETER
        if main in ("cursor", "say", "sort"):
            return ERR_NOT_IMPLEMENTED
        return ERR_INVALID_COMMAND

    def _help(self, conn: Connection, words: list[str], line: str) -> bytes:
        lines = [
            "  SPEAK           -- say text",
            "  KEY             -- say a combination of keys",
            "  CHAR            -- say a character",
            "  SOUND_ICON      -- execute a sound icon",
            "  SET             -- set a parameter",
            "  GET             -- get a current parameter",
            "  LIST            -- list available arguments",
            "  HISTORY         -- commands related to history",
            "  QUIT            -- close the connection",
        ]
        return reply(248, "OK HELP SENT", *lines)

    def _block(self, conn: Connection, words: list[str], line: str) -> bytes:
        what = _arg(words, 1).lower()
        if not what:
            return ERR_MISSING_PARAMETER
        if what == "begin":
            if conn.in_block:
                return reply(330, "ERR ALREADY INSIDE BLOCK")
            conn.in_block = True
            return reply(260, "OK INSIDE BLOCK")
        if what == "end":
            if not conn.in_block:
                return reply(331, "ERR ALREADY OUTSIDE BLOCK")
            conn.in_block = False
            return reply(261, "OK OUTSIDE BLOCK")
        return ERR_PARAMETER_INVALID


def _arg(words: list[str], i: int) -> str:
    return words[i] if i < len(words) else ""


def _error_reply(code: str, message: str) -> bytes:
    """A request speakd refuses: 4xx when the client can fix it, 3xx when speakd cannot."""
    server_side = code in ("queue_full", "shutting_down", "duplicate_id", "internal_error")
    return reply(300 if server_side else 400, f"ERR {printable(message)}")
