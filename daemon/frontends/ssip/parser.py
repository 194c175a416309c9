"""SSIP framing without I/O: CRLF lines, the dot-terminated SPEAK body, replies and events.

Kept apart from the front-end so the byte-level rules (which the fuzz tests hammer) are plain
functions. The rules are Speech Dispatcher's own (``src/server/server.c``, ``parse.c``):

* a line ends at CRLF only; a bare LF is part of the line (spd-say sends multi-line text with
  bare LFs inside, and a lone ``.`` after a bare LF must not end the message);
* after ``SPEAK`` the body runs until a line that is exactly ``.``; a body line starting with
  ``..`` loses one dot; NUL bytes become ``?``;
* replies are ``NNN-line`` … ``NNN text``, all CRLF-terminated; events ``70x-msg_id``,
  ``70x-client_id``, ``70x TEXT``.
"""

from __future__ import annotations

import html
import re
from dataclasses import dataclass, field

CRLF = b"\r\n"


class LineTooLong:
    """Marks a line that overran the limit; its bytes were dropped up to the next CRLF."""

    def __repr__(self) -> str:
        return "LINE_TOO_LONG"


LINE_TOO_LONG = LineTooLong()


class LineFramer:
    """Splits a byte stream into CRLF-terminated lines, never buffering more than ``max_line``.

    A line longer than ``max_line`` yields ``LINE_TOO_LONG`` once and its remaining bytes are
    discarded until the next CRLF, so a client that never sends CRLF costs bounded memory and
    the connection resynchronises on the next line.
    """

    def __init__(self, max_line: int) -> None:
        self.max_line = max_line
        self._buf = bytearray()
        self._discarding = False

    def feed(self, data: bytes) -> list[bytes | LineTooLong]:
        out: list[bytes | LineTooLong] = []
        buf = self._buf
        search = max(0, len(buf) - 1)  # a CR may end the previous chunk
        buf += data
        start = 0
        while True:
            end = buf.find(CRLF, max(start, search))
            if end < 0:
                break
            if self._discarding:
                self._discarding = False
            elif end - start > self.max_line:
                out.append(LINE_TOO_LONG)
            else:
                out.append(bytes(buf[start:end]))
            start = search = end + 2
        del buf[:start]
        if len(buf) > self.max_line + 1:
            if not self._discarding:
                out.append(LINE_TOO_LONG)
                self._discarding = True
            del buf[:-1]  # keep a trailing CR: it may pair with the next chunk's LF
        return out

    @property
    def pending(self) -> int:
        """Bytes held that do not yet form a complete line."""
        return len(self._buf)


@dataclass
class SpeakBody:
    """Collects the lines after ``SPEAK`` until the lone ``.``; bounded by ``max_bytes``."""

    max_bytes: int
    lines: list[bytes] = field(default_factory=list)
    size: int = 0
    overflow: bool = False

    def add(self, line: bytes | LineTooLong) -> bool:
        """Take one framed line; True when it was the terminating ``.``."""
        if line == b".":
            return True
        if isinstance(line, LineTooLong):
            self.overflow = True
            return False
        self.size += len(line) + 2
        if self.size > self.max_bytes:
            self.overflow = True
        if not self.overflow:
            self.lines.append(line[1:] if line.startswith(b"..") else line)
        return False

    def data(self) -> bytes:
        """The message bytes as Speech Dispatcher stores them: lines joined by CRLF."""
        return CRLF.join(self.lines).replace(b"\x00", b"?")


def decode_text(data: bytes) -> str | None:
    """UTF-8 → str with CRLF folded to LF; None when the bytes are not valid UTF-8."""
    try:
        return data.decode("utf-8").replace("\r\n", "\n")
    except UnicodeDecodeError:
        return None


def split_command(line: str) -> list[str]:
    """Parameters split on single spaces, as speechd's ``get_param`` does (empty ones kept)."""
    return line.split(" ")


def parse_int(word: str) -> int | None:
    """speechd's ``isanum``: optional sign then digits."""
    digits = word[1:] if word[:1] in ("+", "-") else word
    if not digits.isascii() or not digits.isdigit():
        return None
    return int(word)


_TAG = re.compile(r"<[^<>]*>")


def strip_ssml(text: str) -> str:
    """SSML_MODE on: speak the text content; tags go, entities are decoded, and whitespace
    is collapsed as SSML treats it."""
    return " ".join(html.unescape(_TAG.sub(" ", text)).split())


def reply(code: int, text: str, *lines: str) -> bytes:
    """A complete reply: ``code-line`` for each of ``lines`` then ``code text``."""
    head = "".join(f"{code}-{line}\r\n" for line in lines)
    return f"{head}{code} {text}\r\n".encode()


def event(code: int, msg_id: int, client_id: int, text: str, *extra: str) -> bytes:
    """An asynchronous 70x notification (``extra`` carries an index mark's name)."""
    return reply(code, text, str(msg_id), str(client_id), *extra)


def printable(text: str, limit: int = 200) -> str:
    """Text safe to put inside one reply line (no CR/LF or control characters)."""
    clean = "".join(c if c.isprintable() else " " for c in text)
    return clean[:limit]
