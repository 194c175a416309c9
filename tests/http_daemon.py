"""A real ``speakd serve`` with its HTTP API on a free loopback port, for the HTTP tests."""

from __future__ import annotations

import re
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from speakd_tools.bench.harness.daemon import free_port
from tests.daemon_proc import DaemonProc, start_daemon, write_config
from tests.waits import wait_until

TOKEN = "test-token-0123456789"


@dataclass
class HttpDaemon:
    proc: DaemonProc
    url: str  # http://127.0.0.1:PORT
    port: int
    token: str

    @property
    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    def stop(self) -> int:
        return self.proc.stop()

    def status(self) -> dict[str, Any]:
        return httpx.get(f"{self.url}/v1/status", headers=self.auth, timeout=10).json()

    def metric(self, name: str, **labels: str) -> float:
        """One sample of ``GET /metrics`` (0 when the series does not exist yet)."""
        text = httpx.get(f"{self.url}/metrics", headers=self.auth, timeout=10).text
        want = ",".join(f'{k}="{v}"' for k, v in labels.items())
        pattern = re.escape(name + (f"{{{want}}}" if want else "")) + r" (\S+)"
        match = re.search("^" + pattern + "$", text, re.M)
        return float(match.group(1)) if match else 0.0


def wav_samples(data: bytes) -> tuple[np.ndarray, int]:
    """A WAV whose sizes may say 'unknown' (streamed): the header is parsed, the rest is PCM."""
    assert data[:4] == b"RIFF" and data[8:12] == b"WAVE" and data[36:40] == b"data"
    rate = int.from_bytes(data[24:28], "little")
    return np.frombuffer(data[44:], dtype="<i2"), rate


def start_http_daemon(
    tmp_path: Path,
    extra: str = "",
    *,
    token: str = TOKEN,
    http: str = "",
    env: dict[str, str] | None = None,
    **config: Any,
) -> HttpDaemon:
    """``extra`` is more TOML, ``http`` more keys of the [http] section, ``config`` goes to
    ``write_config`` (sink, realtime)."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    port = free_port()
    section = f'[http]\nlisten = "127.0.0.1:{port}"\ntoken = "{token}"\n{http}\n'
    proc = start_daemon(write_config(tmp_path, extra + "\n" + section, **config), env)

    def listens() -> bool:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return True
        except OSError:
            return False

    try:  # the socket answers a moment before the HTTP port listens
        wait_until(listens, f"HTTP on port {port}", 10)
    except AssertionError:
        proc.stop()
        raise RuntimeError(f"no HTTP on port {port}:\n{proc.log_text()}") from None
    return HttpDaemon(proc, f"http://127.0.0.1:{port}", port, token)
