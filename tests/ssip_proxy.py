"""An SSIP logging proxy: a unix socket in front of an SSIP server that forwards every byte both
ways and records every line with its arrival time, so a test sees the protocol a real client
(Orca through libspeechd) speaks and times it without touching either end."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Line:
    at: float  # time.monotonic() when the proxy read it
    conn: int  # which client connection
    to_server: bool
    text: str


@dataclass
class Message:
    """One queued message's events, in the order the server sent them."""

    conn: int
    msg_id: str
    body: list[str] = field(default_factory=list)  # the SPEAK lines the client sent
    events: list[tuple[str, float, str]] = field(default_factory=list)  # (code, at, mark name)


class SsipProxy:
    """Listens on ``path`` and relays each connection to the SSIP server at ``upstream``."""

    def __init__(self, path: Path, upstream: str) -> None:
        self.path, self.upstream = path, upstream
        self.lines: list[Line] = []
        self._lock = threading.Lock()
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._server.bind(str(path))
        self._server.listen()
        self._socks: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self._server.close()
        for s in self._socks:
            s.close()

    def _accept(self) -> None:
        conn = 0
        while True:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            server.connect(self.upstream)
            self._socks += [client, server]
            conn += 1
            for src, dst, up in ((client, server, True), (server, client, False)):
                threading.Thread(target=self._pump, args=(src, dst, conn, up), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, conn: int, to_server: bool) -> None:
        pending = b""
        while True:
            try:
                data = src.recv(65536)
            except OSError:
                data = b""
            now = time.monotonic()
            if not data:
                for s in (src, dst):
                    with contextlib.suppress(OSError):
                        s.shutdown(socket.SHUT_RDWR)
                return
            pending += data
            *lines, pending = pending.split(b"\n")
            with self._lock:
                for raw in lines:
                    text = raw.decode("utf-8", "replace").rstrip("\r")
                    self.lines.append(Line(now, conn, to_server, text))
            dst.sendall(data)

    def snapshot(self) -> list[Line]:
        with self._lock:
            return list(self.lines)

    def replies(self) -> list[Line]:
        """The server's final reply lines (``NNN text``), events (7xx) left out."""
        return [
            ln
            for ln in self.snapshot()
            if not ln.to_server and ln.text[3:4] == " " and not ln.text.startswith("7")
        ]

    def messages(self) -> list[Message]:
        """Every message a client queued (SPEAK or CHAR), with its body and its events."""
        out: dict[tuple[int, str], Message] = {}
        events: dict[tuple[int, str], list[tuple[str, float, str]]] = {}
        body: dict[int, list[str]] = {}
        in_body: dict[int, bool] = {}
        block: dict[int, list[str]] = {}
        last_body: dict[int, list[str]] = {}
        for ln in self.snapshot():
            if ln.to_server:
                if in_body.get(ln.conn):
                    if ln.text == ".":
                        in_body[ln.conn] = False
                        last_body[ln.conn] = body.pop(ln.conn, [])
                    else:
                        body.setdefault(ln.conn, []).append(ln.text)
                elif ln.text.upper().startswith("CHAR "):
                    last_body[ln.conn] = [ln.text[5:]]
                continue
            if ln.text.startswith("230 "):
                in_body[ln.conn] = True
                continue
            lines = block.setdefault(ln.conn, [])
            lines.append(ln.text)
            if ln.text[3:4] != " ":
                continue
            del block[ln.conn]
            code, key = ln.text[:3], (ln.conn, lines[0][4:])
            if code == "225":
                evs = events.setdefault(key, [])
                out[key] = Message(ln.conn, key[1], last_body.pop(ln.conn, []), evs)
            elif code.startswith("7"):
                mark = lines[2][4:] if code == "700" else ""
                events.setdefault(key, []).append((code, ln.at, mark))
        return list(out.values())
