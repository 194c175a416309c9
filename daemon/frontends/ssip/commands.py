"""SSIP's command table: SET, STOP, CANCEL, PAUSE, RESUME, CHAR, KEY, SOUND_ICON, LIST, GET,
HISTORY, HELP and BLOCK, each answered for one connection with its complete reply.

``SsipCommands`` is mixed into ``frontend.SsipFrontend``, which holds the state the commands
read and change (``Control``, the connections, the messages in flight, the PAUSE ALL
owner), serves the connections and queues speech (``_queue``; SPEAK's body is its own).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any
from xml.sax.saxutils import quoteattr

from speakd.frontends.ssip.connection import Connection, Message, client_key
from speakd.frontends.ssip.parser import (
    SpeakBody,
    decode_text,
    parse_int,
    printable,
    reply,
    split_command,
)
from speakd.frontends.ssip.settings import (
    ERR_PARAMETER_INVALID,
    OBSOLETE_NAMES,
    OBSOLETE_TABLES,
    SET_REPLIES,
    VOICE_TYPES,
    apply_setting,
    request_lang,
    setting_value,
)
from speakd.request.messages import Priority
from speakd.request.prepare import match_language

if TYPE_CHECKING:
    from speakd.control import Control

ERR_INVALID_COMMAND = reply(500, "ERR INVALID COMMAND")
ERR_INVALID_ENCODING = reply(501, "ERR INVALID ENCODING")
ERR_MISSING_PARAMETER = reply(510, "ERR MISSING PARAMETER")
ERR_NOT_ALLOWED_INSIDE_BLOCK = reply(332, "ERR NOT ALLOWED INSIDE BLOCK")
ERR_NOT_IMPLEMENTED = reply(380, "ERR NOT YET IMPLEMENTED")
ERR_ID_NOT_EXIST = reply(406, "ERR ID DOESNT EXIST")

NOTIFICATIONS = ("begin", "end", "cancel", "pause", "resume", "index_marks")
NOT_IN_BLOCK = {"history", "stop", "cancel", "pause", "resume", "list", "get", "help"}


class SsipCommands:
    """Each command's handler: (connection, words, line) → the reply."""

    # what SsipFrontend holds
    control: Control
    max_line_bytes: int
    _clients: dict[int, Connection]
    _inflight: dict[str, Message]
    _pause_all_owner: int | None
    _handlers: dict[str, Callable[[Connection, list[str], str], bytes]]
    _queue: Callable[..., bytes]

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

    # ---- CHAR, KEY, SOUND_ICON (SPEAK is SsipFrontend._speak) ----------------------------

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
        return self._queue(conn, param, char=True)

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
