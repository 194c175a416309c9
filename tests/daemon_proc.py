"""Run a real ``python -m speakd serve`` process for end-to-end tests."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from speakd.client import Client, ClientError


def write_config(
    tmp_path: Path, extra: str = "", sink: str = "wav", realtime: bool = False
) -> Path:
    """A config with sockets, cache and WAV output inside ``tmp_path``; ``extra`` appends TOML."""
    (tmp_path / "wav").mkdir(exist_ok=True)
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

[cache]
path = "{tmp_path / "cache.db"}"
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

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 10) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        return self.proc.wait(timeout)

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")


def start_daemon(
    config: Path, env: dict[str, str] | None = None, ready_timeout: float = 60
) -> DaemonProc:
    """Start the daemon and wait until its JSON socket answers ``status``."""
    from speakd.config import load_config

    full_env = {**os.environ, **(env or {})}
    socket_path = load_config(config, env=full_env).socket.path
    log = config.with_suffix(".log")
    proc = subprocess.Popen(
        [sys.executable, "-m", "speakd", "--log-level", "DEBUG", "serve", "--config", str(config)],
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        env=full_env,
    )
    daemon = DaemonProc(config, socket_path, proc, log, full_env)
    deadline = time.monotonic() + ready_timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"speakd exited with {proc.returncode}:\n{daemon.log_text()}")
        try:
            with daemon.client(timeout=5) as c:
                c.request({"op": "status"})
            return daemon
        except (ClientError, OSError):
            time.sleep(0.1)
    daemon.stop(signal.SIGKILL)
    raise RuntimeError(f"speakd did not become ready:\n{daemon.log_text()}")
