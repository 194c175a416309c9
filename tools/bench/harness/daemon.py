"""A real daemon to bench against, and the loopback ports its listeners take: one way for every
bench that starts ``python -m speakd serve`` (a null sink, its cache in the run's folder) or puts
a server on a free port and waits for it to listen."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

UNIT_NICE = -5  # systemd/speakd.service's Nice=


def serve(
    work: Path,
    engine: str = "",
    extra: str = "",
    env: dict[str, str] | None = None,
    audio: str = 'sink = "null"',
    ssip_path: str = "",
    nice: int = 0,
) -> Any:
    """A real daemon on a null sink (``audio``: other [audio] lines), cache in ``work``;
    ``engine`` holds [engine] lines, ``extra`` more TOML sections (``bench wyoming`` adds
    [wyoming]), ``env`` more environment variables, ``ssip_path`` an SSIP socket (none by
    default), ``nice`` its nice value where the bench may set it (root: ``UNIT_NICE`` is the
    systemd unit's). Returns the Popen and socket path."""
    from speakd.library.client import Client, ClientError

    sock = work / "speakd.sock"
    config = work / "speakd.toml"
    config.write_text(
        f"[engine]\n{engine}\n[audio]\n{audio}\n\n"
        f'[socket]\npath = "{sock}"\nssip_path = "{ssip_path}"\n\n'
        f'[cache]\npath = "{work / "cache.db"}"\n'
        f"{extra}"
    )
    log = (work / "speakd.log").open("wb")
    at = nice - os.getpriority(os.PRIO_PROCESS, 0)
    if at < 0 and os.geteuid() != 0:
        at = 0  # only root may raise a priority: the daemon runs at the bench's
    proc = subprocess.Popen(
        ["nice", "-n", str(at), sys.executable, "-m", "speakd", "serve", "--config", str(config)],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "SPEAKD_LOG_LEVEL": "WARNING", **(env or {})},
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"speakd exited: {(work / 'speakd.log').read_text()}")
        try:
            with Client(str(sock), timeout=5) as c:
                c.request({"op": "status"})
            return proc, str(sock)
        except (ClientError, OSError):
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("speakd did not start")


def free_port() -> int:
    """A loopback TCP port nothing listens on now (the kernel's pick)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for_port(port: int, timeout: float = 10.0) -> None:
    """Return once a server accepts on loopback ``port``; the last error after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
