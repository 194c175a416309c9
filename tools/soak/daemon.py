"""The daemon under soak: its config, its process (started, reloaded, SIGKILLed, stopped and
restarted like a supervisor would, upgraded like a package), its log, and what ``/proc`` says
about it. It runs from a copy of speakd's files, as a package installs them, so an upgrade can
replace them under it.

The process runs through ``speakd_tools.soak.faulty`` (engines that crash and hang on cue). Its
output comes through a pipe, not a file, so a file-size limit set on it (the full-disk fault)
cannot stop its log; the pump thread writes the log file and watches it for tracebacks and for
how much audio each played request had.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from speakd.library.client import Client, ClientError

from ..bench.harness.daemon import free_port
from .device import asoundrc

SITE = "soak"
MAX_QUEUE = 8  # small, so the kill's burst of MQTT says is a replay larger than the queue
TOKEN = "soak-token-0123456789"
FINISHED = re.compile(r"request (\S+) finished: ([\d.]+) s audio")
TRACEBACK = "Traceback (most recent call last):"


@dataclass
class Layout:
    """Every file of one soak run, inside ``work``."""

    work: Path
    wyoming_port: int = field(default_factory=free_port)
    http_port: int = field(default_factory=free_port)

    def __post_init__(self) -> None:
        for sub in ("home", "voices", "dev"):
            (self.work / sub).mkdir(parents=True, exist_ok=True)
        (self.work / "home" / ".asoundrc").write_text(asoundrc(self.fifo))

    socket = property(lambda self: str(self.work / "speakd.sock"))
    ssip = property(lambda self: str(self.work / "ssip.sock"))
    cache = property(lambda self: self.work / "cache.db")
    state = property(lambda self: self.work / "state")
    lib = property(lambda self: self.work / "lib")  # the installed copy of speakd
    config = property(lambda self: self.work / "speakd.toml")
    log = property(lambda self: self.work / "speakd.log")
    fifo = property(lambda self: self.work / "dev" / "pcm.fifo")
    http_url = property(lambda self: f"http://127.0.0.1:{self.http_port}")


def config_text(
    layout: Layout, broker_port: int, engine: str, variant: int, hang_timeout_s: float
) -> str:
    """The daemon's TOML. ``variant`` changes harmless keys (volume, text limit, cache TTL):
    what a SIGHUP reload picks up."""
    return f"""
[engine]
{engine}
hang_timeout_s = {hang_timeout_s}
fallback_text = "Sorry."

[audio]
sink = "sounddevice"
volume = {1.0 - 0.05 * (variant % 2)}

[socket]
path = "{layout.socket}"
ssip_path = "{layout.ssip}"

[voices]
dir = "{layout.work / "voices"}"

[cache]
path = "{layout.cache}"
ttl_s = {604800 + variant}

[state]
dir = "{layout.state}"

[limits]
max_text_chars = {2000 + variant % 2}
max_queue = {MAX_QUEUE}

[mqtt]
enabled = true
host = "127.0.0.1"
port = {broker_port}
site_id = "{SITE}"
reconnect_min_s = 0.5
reconnect_max_s = 2.0
discovery = false

[wyoming]
uri = "tcp://127.0.0.1:{layout.wyoming_port}"

[http]
listen = "127.0.0.1:{layout.http_port}"
token = "{TOKEN}"
"""


@dataclass
class Sample:
    t: float
    epoch: int
    rss_mb: float
    fds: int
    threads: int
    fd_kinds: dict[str, int] | None = None  # at quiet points: what the open fds are


def fd_kinds(pid: int) -> dict[str, int]:
    """Open fds by kind (socket, pipe, anon_inode:[eventfd], a file's path…): what a leak is."""
    kinds: dict[str, int] = {}
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                kind = target.split(":[")[0] if ":[" in target else target
                kinds[kind] = kinds.get(kind, 0) + 1
    except OSError:
        pass
    return dict(sorted(kinds.items()))


def proc_sample(pid: int, epoch: int) -> Sample | None:
    """RSS, open fds and threads of ``pid`` from /proc; None once it is gone, or killed and not
    yet reaped (a zombie's status has no ``VmRSS``)."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as f:
            status = dict(line.split(":", 1) for line in f if ":" in line)
        fds = len(os.listdir(f"/proc/{pid}/fd"))
        rss = int(status["VmRSS"].split()[0]) / 1024
    except (OSError, ValueError, KeyError):
        return None
    return Sample(time.monotonic(), epoch, round(rss, 1), fds, int(status["Threads"]))


class LogWatch:
    """The daemon's output: to the log file, tracebacks kept, played audio per request id."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.tracebacks: list[str] = []
        self.played_s: dict[str, float] = {}
        self.lock = threading.Lock()

    def pump(self, stream: Any) -> threading.Thread:
        thread = threading.Thread(target=self._pump, args=(stream,), name="log-pump", daemon=True)
        thread.start()
        return thread

    def _pump(self, stream: Any) -> None:
        pending: list[str] | None = None  # the traceback being read
        with self.path.open("a", encoding="utf-8", errors="replace") as out:
            for raw in stream:
                line = raw.decode("utf-8", "replace")
                out.write(line)
                out.flush()
                if pending is not None:
                    pending.append(line.rstrip())
                    if not line.startswith((" ", "\t")) or len(pending) > 40:
                        with self.lock:
                            self.tracebacks.append("\n".join(pending))
                        pending = None
                if TRACEBACK in line:
                    pending = [line.rstrip()]
                elif (m := FINISHED.search(line)) is not None:
                    with self.lock:
                        self.played_s[m.group(1)] = float(m.group(2))
            if pending is not None:
                self.tracebacks.append("\n".join(pending))


class Supervised:
    """``speakd serve`` as a supervisor runs it: started, reloaded, killed and started again."""

    def __init__(self, layout: Layout, env: dict[str, str], ready_timeout: float) -> None:
        self.layout = layout
        self.env = {**os.environ, **env, "HOME": str(layout.work / "home")}
        self.env.pop("NOTIFY_SOCKET", None)
        self.ready_timeout = ready_timeout
        self.log = LogWatch(layout.log)
        self.proc: subprocess.Popen[bytes] | None = None
        self.epoch = 0  # +1 for each start
        self._pump: threading.Thread | None = None

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def client(self, timeout: float | None = 30.0) -> Client:
        return Client(self.layout.socket, timeout=timeout)

    def status(self) -> dict[str, Any]:
        with self.client() as c:
            return c.request({"op": "status"})

    def start(self) -> float:
        """Start and wait until every listener is up; returns the seconds that took."""
        t0 = time.monotonic()
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "speakd_tools.soak.faulty",
                "serve",
                "--config",
                str(self.layout.config),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=self.env,
        )
        assert self.proc.stdout is not None
        self._pump = self.log.pump(self.proc.stdout)
        self.epoch += 1
        while time.monotonic() - t0 < self.ready_timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"speakd exited with {self.proc.returncode}; see {self.log.path}"
                )
            if self._serving():
                return time.monotonic() - t0
            time.sleep(0.1)
        self.kill()
        raise RuntimeError(f"speakd did not answer within {self.ready_timeout} s")

    def _serving(self) -> bool:
        """The JSON socket answers and the listeners started after it (Wyoming, HTTP) accept."""
        try:
            self.status()
            for port in (self.layout.wyoming_port, self.layout.http_port):
                socket.create_connection(("127.0.0.1", port), timeout=1.0).close()
        except (ClientError, OSError):
            return False
        return True

    def reload(self, timeout: float = 120) -> bool:
        """SIGHUP, then wait for the reload count to move (False: it did not in time)."""
        before = self.status()["reloads"]
        self.proc.send_signal(signal.SIGHUP)  # type: ignore[union-attr]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.status()["reloads"] > before:
                return True
            time.sleep(0.2)
        return False

    def kill(self) -> None:
        """SIGKILL and reap (the log pump reads to the end)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
        self._reap()

    def terminate(self, timeout: float = 60) -> int | None:
        """SIGTERM: the exit code, or None when it had to be killed."""
        if self.proc is None:
            return None
        self.proc.terminate()
        try:
            code: int | None = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = None
        self._reap()
        return code

    def _reap(self) -> None:
        if self.proc is not None:
            self.proc.wait()
        if self._pump is not None:
            self._pump.join(10)


def install_copy(lib: Path) -> dict[str, str]:
    """speakd's files under ``lib``, as a package installs them; the environment that runs
    the daemon from there (before the editable checkout on the path)."""
    import speakd

    shutil.copytree(Path(speakd.__file__).parent, lib / "speakd")
    return {"PYTHONPATH": str(lib)}


def upgrade(lib: Path) -> int:
    """What dpkg does under a running daemon: each file unpacked beside the old one and renamed
    over it, so the running process's modules are gone from disk. Returns the files replaced."""
    new = lib.parent / f"{lib.name}.new"
    shutil.rmtree(new, ignore_errors=True)
    shutil.copytree(lib / "speakd", new)
    replaced = 0
    for path in sorted(new.rglob("*")):
        if path.is_file():
            target = lib / "speakd" / path.relative_to(new)
            unpacked = target.with_name(target.name + ".dpkg-new")
            path.rename(unpacked)
            unpacked.rename(target)
            replaced += 1
    shutil.rmtree(new)
    return replaced


def cache_check(path: Path, pinned: set[str]) -> dict[str, Any]:
    """``PRAGMA integrity_check`` of the cache file and which pinned clips are missing
    (the daemon is down: nothing else has it open)."""
    db = sqlite3.connect(path, timeout=30)
    try:
        integrity = [row[0] for row in db.execute("PRAGMA integrity_check")]
        present = {row[0] for row in db.execute("SELECT key FROM clips WHERE pinned = 1")}
    finally:
        db.close()
    return {"integrity": integrity, "pinned_missing": sorted(pinned - present)}
