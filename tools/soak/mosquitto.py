"""A real mosquitto broker on a free loopback port, with its config and persistence in a folder
of its own: the soak's broker, and the tests' (tests/mosquitto.py adds a recording client).

``stop()``/``start()`` restart it on the same port with the same persistence file, so sessions,
subscriptions and retained messages survive a restart like on a real installation.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

from ..bench.harness.daemon import free_port

MOSQUITTO = shutil.which("mosquitto") or "/usr/sbin/mosquitto"


class Mosquitto:
    def __init__(
        self,
        directory: Path,
        port: int | None = None,
        listener: str = "",
        anonymous: bool = True,
        log_types: tuple[str, ...] = ("all",),
    ) -> None:
        """``listener``: more config lines for the listener (TLS files, password_file…);
        ``log_types``: what mosquitto logs (less than ``all`` for a bench with a thousand clients;
        ``information`` carries the "running" line ``start`` waits for)."""
        self.directory = directory
        self.port = port or free_port()
        self.host = "127.0.0.1"
        self.log = directory / "mosquitto.log"
        self.config = directory / "mosquitto.conf"
        directory.mkdir(parents=True, exist_ok=True)
        # As root, mosquitto drops to user "mosquitto", which could not write in our temp dir.
        user = "user root\n" if os.geteuid() == 0 else ""
        self.config.write_text(
            f"listener {self.port} 127.0.0.1\n"
            f"{listener}"
            f"allow_anonymous {'true' if anonymous else 'false'}\n"
            f"{user}"
            "persistence true\n"
            f"persistence_location {directory}/\n"
            f"log_dest file {self.log}\n" + "".join(f"log_type {t}\n" for t in log_types)
        )
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 10.0) -> Mosquitto:
        """Start and wait for *this* process to say it is running (not another broker's port)."""
        offset = self.log.stat().st_size if self.log.exists() else 0
        self.proc = subprocess.Popen(
            [MOSQUITTO, "-c", str(self.config)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"mosquitto exited:\n{self.log_text()[offset:]}")
            if " running" in self.log_text()[offset:]:
                return self
            time.sleep(0.02)
        self.stop()
        raise RuntimeError(f"mosquitto did not start on port {self.port}:\n{self.log_text()}")

    def stop(self) -> None:
        """SIGTERM: mosquitto writes its persistence file, then exits."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)
        self.proc = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""
