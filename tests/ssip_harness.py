"""An in-process SSIP server (real scheduler, sink and front-end; tone engine) and a blocking
SSIP client that reads replies the way libspeechd does (events set aside, replies returned).

Shared by tests/test_ssip.py and tests/test_ssip_fuzz.py.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from speakd.audio.sinks import NullSink, Sink, WavSink
from speakd.control import Control
from speakd.frontends.ssip.frontend import SsipFrontend
from speakd.frontends.unixserver import AccessPolicy, start_unix_server
from speakd.request.resolver import Resolver
from speakd.request.scheduler import Scheduler
from tests.tone_engine import ToneEngine
from tests.waits import wait_until


class SsipServer:
    """Runs Control + Scheduler + SsipFrontend on an event loop in a background thread."""

    def __init__(
        self,
        path: Path,
        *,
        engine: ToneEngine | None = None,
        sink: Sink | None = None,
        max_line_bytes: int = 4096,
        max_queue: int = 32,
        block_ms: int = 20,
        policy: AccessPolicy | None = None,
    ) -> None:
        self.path = path
        self.policy = policy
        self.engine = engine or ToneEngine()
        self.sink = sink or NullSink()
        self.max_line_bytes = max_line_bytes
        self.max_queue = max_queue
        self.block_ms = block_ms
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.control: Control
        self.frontend: SsipFrontend

    def __enter__(self) -> SsipServer:
        self._thread.start()
        self.call(self._start)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.call(self._stop)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)

    async def _start(self) -> None:
        scheduler = Scheduler(
            Resolver(self.engine),
            self.sink,
            max_queue=self.max_queue,
            block_ms=self.block_ms,
        )
        self.control = Control(scheduler, max_text_chars=2000)
        self.frontend = SsipFrontend(self.control, self.max_line_bytes)
        self._task = asyncio.create_task(scheduler.run())
        self._server = await start_unix_server(
            self.frontend.handle,
            str(self.path),
            mode=0o666 if self.policy else 0o600,
            limit=self.max_line_bytes,
            policy=self.policy or AccessPolicy(),
            refusal=SsipFrontend.REFUSAL,
        )

    async def _stop(self) -> None:
        self._server.close()
        await self.control.scheduler.close()
        self._task.cancel()

    def call(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` (a coroutine function or a plain one) on the server's loop; its result."""

        async def run() -> Any:
            result = fn()
            return await result if asyncio.iscoroutine(result) else result

        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(10)

    def status(self) -> dict[str, Any]:
        return self.call(self.control.status)

    def wait_idle(self, timeout: float = 10.0) -> None:
        def idle() -> bool:
            s = self.status()
            return s["state"] == "idle" and not s["queue_length"]

        wait_until(idle, "the server to go idle", timeout)


def wav_server(path: Path, wav_dir: Path, **kw: Any) -> SsipServer:
    return SsipServer(path, sink=WavSink(wav_dir, realtime=True), **kw)


class SsipClient:
    """Blocking SSIP client: ``command()`` returns the next reply; events go to ``events``."""

    def __init__(self, path: Path, timeout: float = 5.0) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        self.sock.connect(str(path))
        self._buf = b""
        self.events: list[list[str]] = []

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> SsipClient:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def line(self) -> str:
        while b"\r\n" not in self._buf:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise EOFError("server closed the connection")
            self._buf += chunk
        raw, self._buf = self._buf.split(b"\r\n", 1)
        text = raw.decode()
        assert len(text) >= 4 and text[:3].isdigit() and text[3] in "- ", f"bad line {text!r}"
        return text

    def unit(self) -> list[str]:
        """The next complete reply or event: ``NNN-…`` lines up to the ``NNN …`` one."""
        lines = [self.line()]
        while lines[-1][3] == "-":
            lines.append(self.line())
            assert lines[-1][:3] == lines[0][:3], f"mixed codes in one reply: {lines}"
        return lines

    def reply(self) -> list[str]:
        while True:
            unit = self.unit()
            if unit[0].startswith("7"):
                self.events.append(unit)
            else:
                return unit

    def command(self, line: str) -> list[str]:
        self.send(line.encode() + b"\r\n")
        return self.reply()

    def code(self, line: str) -> int:
        return int(self.command(line)[-1][:3])

    def speak(self, text: str) -> int:
        """SPEAK with libspeechd's escaping; returns the message id."""
        assert self.code("SPEAK") == 230
        self.send(escape(text).encode() + b"\r\n.\r\n")
        unit = self.reply()
        assert unit[-1] == "225 OK MESSAGE QUEUED", unit
        return int(unit[0][4:])

    def wait_event(self, code: int, msg_id: int, timeout: float = 10.0) -> list[str]:
        """Read until the event ``code`` for ``msg_id`` arrived (or fail)."""
        deadline = time.monotonic() + timeout
        while True:
            for ev in self.events:
                if ev[0] == f"{code}-{msg_id}":
                    return ev
            if time.monotonic() > deadline:
                raise AssertionError(f"no {code} for message {msg_id}; events: {self.events}")
            unit = self.unit()
            assert unit[0].startswith("7"), f"unexpected reply {unit}"
            self.events.append(unit)

    def event_codes(self, msg_id: int) -> list[int]:
        return [int(ev[0][:3]) for ev in self.events if ev[0] == f"{ev[0][:3]}-{msg_id}"]


def escape(text: str) -> str:
    """What libspeechd does before sending (``escape_dot``): a leading ``.`` and every
    ``CRLF.`` get a second dot."""
    if text.startswith("."):
        text = "." + text
    return text.replace("\r\n.", "\r\n..")
