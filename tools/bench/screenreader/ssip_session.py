"""A timestamped SSIP client: what a screen reader's ``libspeechd`` does on the socket, with the
instant every reply and event arrived, so a bench can time keypress → ``701 BEGIN`` and
``CANCEL`` → ``703 CANCELED`` on any SSIP server (speakd or Speech Dispatcher) alike.

A reader thread splits the stream into replies (2xx–5xx, returned to the command that asked) and
events (7xx, recorded per message id with ``time.monotonic()`` at arrival).
"""

from __future__ import annotations

import queue
import socket
import threading
import time
from dataclasses import dataclass, field

EVENTS = {"700": "mark", "701": "begin", "702": "end", "703": "cancel", "704": "pause"}


class SsipError(RuntimeError):
    """A 4xx/5xx reply: the server refused a command the replay sends."""


@dataclass
class Message:
    """One message's events as they arrived: code → first arrival time, marks in order."""

    times: dict[str, float] = field(default_factory=dict)
    marks: list[tuple[str, float]] = field(default_factory=list)
    order: list[str] = field(default_factory=list)  # event codes in arrival order


class SsipSession:
    """One SSIP connection on a unix socket, its replies in a queue and its events per message."""

    def __init__(self, path: str, timeout: float = 30.0) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(path)
        self.timeout = timeout
        self.replies: queue.Queue[list[str]] = queue.Queue()
        self.messages: dict[str, Message] = {}
        self.changed = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def close(self) -> None:
        self.sock.close()
        self._reader.join(5)

    def _read(self) -> None:
        block: list[str] = []
        buf = self.sock.makefile("rb")
        for raw in buf:
            now = time.monotonic()
            line = raw.decode("utf-8", "replace").rstrip("\r\n")
            block.append(line)
            if len(line) >= 4 and line[3] == "-":
                continue
            if line.startswith("7"):
                self._event(block, now)
            else:
                self.replies.put(block)
            block = []

    def _event(self, block: list[str], now: float) -> None:
        code, msg_id = block[-1][:3], block[0][4:]
        with self.changed:
            msg = self.messages.setdefault(msg_id, Message())
            msg.order.append(code)
            if code == "700":
                msg.marks.append((block[2][4:], now))
            msg.times.setdefault(code, now)
            self.changed.notify_all()

    def command(self, line: str) -> list[str]:
        """Send one command line; its reply's lines. A 4xx/5xx reply raises ``SsipError``."""
        self.sock.sendall(line.encode() + b"\r\n")
        return self._reply(line)

    def _reply(self, what: str) -> list[str]:
        try:
            reply = self.replies.get(timeout=self.timeout)
        except queue.Empty:
            raise SsipError(f"no reply to {what!r} in {self.timeout:g} s") from None
        if reply[-1][:1] in "45":
            raise SsipError(f"{what!r} refused: {reply[-1]}")
        return reply

    def speak(self, text: str) -> str:
        """``SPEAK`` with ``text`` as its body; the message id."""
        self.command("SPEAK")
        body = "\r\n".join(".." + ln if ln.startswith(".") else ln for ln in text.splitlines())
        self.sock.sendall(body.encode() + b"\r\n.\r\n")
        return self._queued(self._reply("SPEAK body"))

    def char(self, c: str) -> str:
        return self._queued(self.command(f"CHAR {c}"))

    def _queued(self, reply: list[str]) -> str:
        msg_id = reply[0][4:]
        with self.changed:
            self.messages.setdefault(msg_id, Message())
        return msg_id

    def wait(self, msg_id: str, *codes: str, timeout: float = 30.0) -> tuple[str, float]:
        """The first of ``codes`` to arrive for ``msg_id``: (code, arrival time)."""
        deadline = time.monotonic() + timeout
        with self.changed:
            while True:
                msg = self.messages.get(msg_id)
                hits = [(msg.times[c], c) for c in codes if msg and c in msg.times]
                if hits:
                    at, code = min(hits)
                    return code, at
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"message {msg_id}: none of {codes} in {timeout:g} s")
                self.changed.wait(left)

    def finished(self, msg_id: str) -> bool:
        with self.changed:
            msg = self.messages.get(msg_id)
            return bool(msg and ("702" in msg.times or "703" in msg.times))
