"""Run a real ``python -m speakd serve`` process for end-to-end tests, or the real ``Daemon`` in
this process (``InProcessDaemon``) when a test needs to swap the engine."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import speakd.lifecycle.service
from speakd.config import load_config
from speakd.library.client import Client, ClientError
from tests.waits import wait_until


def write_config(
    tmp_path: Path,
    extra: str = "",
    sink: str = "wav",
    realtime: bool = False,
    voices: str = "",
    prewarm_keys: bool = False,
    shipped_pack: str = "",
) -> Path:
    """A config with sockets, cache, state, voices folder and WAV output inside ``tmp_path``;
    ``extra`` appends TOML, ``voices`` adds keys to ``[voices]``. The key-echo prewarm is off
    unless asked for: it would load every test daemon with a few hundred syntheses. No shipped
    pack unless given: an installed package's would answer the test's key echo."""
    (tmp_path / "wav").mkdir(exist_ok=True)
    (tmp_path / "voices").mkdir(exist_ok=True)
    config = tmp_path / "speakd.toml"
    config.write_text(
        f"""
[audio]
sink = "{sink}"
wav_dir = "{tmp_path / "wav"}"
realtime = {"true" if realtime else "false"}

[socket]
path = "{tmp_path / "speakd.sock"}"
ssip_path = "{tmp_path / "ssip.sock"}"

[ssip]
prewarm_keys = {"true" if prewarm_keys else "false"}

[voices]
dir = "{tmp_path / "voices"}"
{voices}

[state]
dir = "{tmp_path / "state"}"

[cache]
path = "{tmp_path / "cache.db"}"
shipped_pack = "{shipped_pack}"
{extra}
"""
    )
    return config


def synth(text: str, out: Path, *args: str) -> Path:
    """``speakd synth`` in a fresh process (no daemon): the reference audio for a text."""
    r = subprocess.run(
        [sys.executable, "-m", "speakd", "synth", text, "-o", str(out), *args],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert r.returncode == 0, r.stderr
    return out


@dataclass
class DaemonProc:
    config: Path
    socket: str
    proc: subprocess.Popen[bytes]
    log: Path
    env: dict[str, str] = field(default_factory=dict)

    def client(self, timeout: float | None = 30.0) -> Client:
        return Client(self.socket, timeout=timeout)

    def cli(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "speakd", *args, "--socket", self.socket],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=self.env,
        )

    def say(self, text: str, **fields: Any) -> list[dict[str, Any]]:
        """A say with ``wait``: every event up to the terminal one."""
        with self.client() as c:
            return list(c.say({"text": text, "priority": "message", **fields}, wait=True))

    def reload(self, timeout: float = 60) -> None:
        """SIGHUP, then wait until the daemon says it reloaded (its status counts reloads)."""
        with self.client() as c:
            before = c.request({"op": "status"})["reloads"]
        self.proc.send_signal(signal.SIGHUP)

        def reloaded() -> bool:
            with self.client() as c:
                return c.request({"op": "status"})["reloads"] > before

        wait_until(reloaded, timeout=timeout, what="the reload")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 10) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        return self.proc.wait(timeout)

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")


READY_LINE = "speakd ready: "  # logged by Daemon.run right after READY=1


def start_daemon(
    config: Path,
    env: dict[str, str] | None = None,
    ready_timeout: float = 60,
    wrap: tuple[str, ...] = (),
    python: str = sys.executable,
) -> DaemonProc:
    """Start the daemon and wait until it says it is ready: READY comes after every listener
    (JSON, SSIP, HTTP, Wyoming, MQTT) is up, so a test may use any of them at once; the JSON
    socket answering alone says nothing of the listeners started after it. ``wrap`` runs it
    under a command (``setpriv …``); ``python`` is another install's (the package's)."""
    full_env = {**os.environ, **(env or {})}
    socket_path = load_config(config, env=full_env).socket.path
    log = config.with_suffix(".log")
    serve = [python, "-m", "speakd", "--log-level", "DEBUG", "serve", "--config"]
    proc = subprocess.Popen(
        [*wrap, *serve, str(config)],
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        env=full_env,
    )
    daemon = DaemonProc(config, socket_path, proc, log, full_env)

    def ready() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"speakd exited with {proc.returncode}:\n{daemon.log_text()}")
        return READY_LINE in daemon.log_text()

    try:
        wait_until(ready, "speakd to log that it is ready", ready_timeout)
    except AssertionError:
        daemon.stop(signal.SIGKILL)
        raise RuntimeError(f"speakd did not become ready:\n{daemon.log_text()}") from None
    return daemon


class InProcessDaemon:
    """``Daemon.run()`` on its own loop thread (signal handlers stay with pytest's main thread)."""

    def __init__(self, config_path: Path) -> None:
        self.config = load_config(config_path)
        self.daemon = speakd.lifecycle.service.Daemon(self.config, config_path)
        self.loop = asyncio.new_event_loop()
        self.loop.add_signal_handler = lambda *args: None  # type: ignore[method-assign]
        self.thread = threading.Thread(target=self._run, name="speakd-under-test")
        self.rc: int | None = None

    def _run(self) -> None:
        self.rc = self.loop.run_until_complete(self.daemon.run())

    def start(self) -> InProcessDaemon:
        self.thread.start()

        def ready() -> bool:
            assert self.thread.is_alive(), "the daemon died while starting"
            with contextlib.suppress(ClientError, OSError), self.client() as c:
                return c.request({"op": "status"})["fallback_ready"]  # made in the background
            return False

        wait_until(ready, "the in-process daemon and its fallback prompt", 120)
        return self

    def client(self) -> Client:
        return Client(self.config.socket.path, timeout=60)

    def say(self, text: str, **fields: Any) -> list[dict[str, Any]]:
        with self.client() as c:
            return list(c.say({"text": text, "priority": "message", **fields}, wait=True))

    def status(self) -> dict[str, Any]:
        with self.client() as c:
            return c.request({"op": "status"})

    def stop(self) -> int | None:
        self.loop.call_soon_threadsafe(self.daemon._stopping.set)
        self.thread.join(30)
        self.loop.close()
        return self.rc
