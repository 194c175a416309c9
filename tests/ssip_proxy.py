"""A logging SSIP proxy: every line both ways with its time, for tests that watch what a real client
(Orca) says to speakd and what it hears back, without touching either side."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Line:
    t: float  # time.monotonic() when the line passed
    conn: int  # the client connection's number, from 1
    sent: bool  # True: client → server; False: server → client
    text: str


@dataclass(frozen=True)
class Event:
    """One 70x notification as the client received it."""

    t: float
    conn: int
    code: int
    msg_id: int
    extra: tuple[str, ...]  # e.g. the mark's name


@dataclass
class SsipProxy:
    """Listens at ``path`` and forwards each connection to ``upstream``."""

    path: Path
    upstream: Path
    lines: list[Line] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _conns: int = 0
    _socks: list[socket.socket] = field(default_factory=list)

    def __enter__(self) -> SsipProxy:
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._server.bind(str(self.path))
        self._server.listen(8)
        threading.Thread(target=self._accept, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.close()
        for s in self._socks:
            s.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            server.connect(str(self.upstream))
            self._socks += [client, server]
            self._conns += 1
            for src, dst, sent in ((client, server, True), (server, client, False)):
                args = (src, dst, self._conns, sent)
                threading.Thread(target=self._pump, args=args, daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, conn: int, sent: bool) -> None:
        pending = b""
        while True:
            try:
                data = src.recv(65536)
            except OSError:
                data = b""
            t = time.monotonic()
            if not data:
                with contextlib.suppress(OSError):
                    dst.shutdown(socket.SHUT_WR)
                return
            dst.sendall(data)
            pending += data
            *done, pending = pending.split(b"\r\n")
            with self._lock:
                self.lines += [Line(t, conn, sent, d.decode(errors="replace")) for d in done]

    def snapshot(self) -> list[Line]:
        with self._lock:
            return list(self.lines)

    def refusals(self) -> list[Line]:
        """Server replies in 4xx/5xx: something the client asked for was refused."""
        return [ln for ln in self.snapshot() if not ln.sent and ln.text[:1] in "45"]

    def messages(self) -> dict[tuple[int, int], str]:
        """Each SPEAK's body by (connection, message id), the id from the 225 reply after it."""
        out: dict[tuple[int, int], str] = {}
        body: dict[int, list[str]] = {}
        done: dict[int, str] = {}
        for ln in self.snapshot():
            if ln.sent and ln.text == "SPEAK":
                body[ln.conn] = []
            elif ln.sent and ln.conn in body:
                if ln.text == ".":
                    done[ln.conn] = "\n".join(body.pop(ln.conn))
                else:
                    body[ln.conn].append(ln.text[1:] if ln.text.startswith("..") else ln.text)
            elif not ln.sent and ln.text.startswith("225-") and ln.conn in done:
                out[(ln.conn, int(ln.text[4:]))] = done.pop(ln.conn)
        return out

    def events(self) -> list[Event]:
        """The 70x notifications, each from its ``NNN-`` lines up to its ``NNN TEXT`` line."""
        out: list[Event] = []
        parts: dict[int, list[str]] = {}
        for ln in self.snapshot():
            if ln.sent or not ln.text.startswith("7") or len(ln.text) < 4:
                continue
            if ln.text[3] == "-":
                parts.setdefault(ln.conn, []).append(ln.text[4:])
                continue
            body = parts.pop(ln.conn, [])
            if len(body) >= 2:
                out.append(Event(ln.t, ln.conn, int(ln.text[:3]), int(body[0]), tuple(body[2:])))
        return out
