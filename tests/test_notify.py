"""speakd.lifecycle.notify against the real systemd tools: datagrams as systemd-notify sends them,
the watchdog interval rules, and the fds systemd-socket-activate passes."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from speakd.lifecycle.notify import listen_fds, notify, watchdog_interval
from tests.waits import wait_until


@pytest.fixture
def dgram(tmp_path: Path):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(tmp_path / "notify.sock"))
    sock.settimeout(5)
    yield sock
    sock.close()


def test_datagram_matches_systemd_notify(dgram: socket.socket, monkeypatch) -> None:
    """The bytes are what `systemd-notify --no-block` sends for the same assignments."""
    address = dgram.getsockname()
    r = subprocess.run(
        ["systemd-notify", "--no-block", "READY=1", "STATUS=serving on /run/x.sock"],
        env={**os.environ, "NOTIFY_SOCKET": address},
        capture_output=True,
        text=True,
        timeout=10,
    )
    assert r.returncode == 0, r.stderr
    theirs = dgram.recv(4096)
    monkeypatch.setenv("NOTIFY_SOCKET", address)
    assert notify("READY=1", "STATUS=serving on /run/x.sock") is True
    assert dgram.recv(4096) == theirs == b"READY=1\nSTATUS=serving on /run/x.sock"


def test_abstract_namespace_address(monkeypatch) -> None:
    name = f"speakd-test-{os.getpid()}-{time.monotonic_ns()}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name)
        sock.settimeout(5)
        monkeypatch.setenv("NOTIFY_SOCKET", "@" + name)
        assert notify("WATCHDOG=1") is True
        assert sock.recv(64) == b"WATCHDOG=1"


def test_no_notify_socket_is_a_no_op(monkeypatch) -> None:
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    assert notify("READY=1") is False


def test_unreachable_socket_is_reported_not_raised(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "nobody-listens"))
    assert notify("READY=1") is False


@pytest.mark.parametrize(
    ("usec", "pid", "expected"),
    [
        ("200000", None, 0.1),  # WATCHDOG_PID unset: the pings are ours
        ("200000", "self", 0.1),
        ("200000", "1", None),  # meant for another process (we are a child of the service)
        ("30000000", None, 15.0),  # WatchdogSec=30 -> ping every 15 s
        ("banana", None, None),
        (None, None, None),
    ],
)
def test_watchdog_interval(monkeypatch, usec: str | None, pid: str | None, expected) -> None:
    for name, value in (("WATCHDOG_USEC", usec), ("WATCHDOG_PID", pid)):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, str(os.getpid()) if value == "self" else value)
    assert watchdog_interval() == expected


PROBE = """
import json, os, socket
from speakd.lifecycle.notify import listen_fds
fds = listen_fds()
print(json.dumps({
    "fds": {n: [s.family == socket.AF_UNIX, s.type == socket.SOCK_STREAM, s.getsockname(),
                 os.get_inheritable(s.fileno())] for n, s in fds.items()},
    "env_left": [v for v in ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES") if v in os.environ],
}))
"""


def _activate(tmp_path: Path, names: str) -> dict:
    """Run PROBE under the real systemd-socket-activate, which execs it on the first connection."""
    activate = shutil.which("systemd-socket-activate")
    assert activate, "systemd-socket-activate not found (Debian package systemd)"
    paths = [tmp_path / "a.sock", tmp_path / "b.sock"]
    listen = [arg for p in paths for arg in ("-l", str(p))]
    proc = subprocess.Popen(
        [activate, *listen, *([f"--fdname={names}"] if names else []), sys.executable, "-c", PROBE],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_until(paths[1].exists, "systemd-socket-activate's sockets")
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(str(paths[0]))
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 0, err
    return json.loads(out)


def test_listen_fds_named_by_listen_fdnames(tmp_path: Path) -> None:
    got = _activate(tmp_path, "json:ssip")
    assert got["fds"] == {
        "json": [True, True, str(tmp_path / "a.sock"), False],
        "ssip": [True, True, str(tmp_path / "b.sock"), False],
    }
    assert got["env_left"] == []  # children of the daemon do not see them


def test_listen_fds_unnamed_fall_back_to_fd_numbers(tmp_path: Path) -> None:
    got = _activate(tmp_path, "")
    assert sorted(got["fds"]) == ["fd3", "fd4"]


def test_listen_fds_repeated_name_keeps_every_socket(tmp_path: Path) -> None:
    """systemd-socket-activate repeats the last name (LISTEN_FDNAMES=json:json); so does a
    .socket unit with two ListenStream= lines. Neither socket may be dropped (and closed)."""
    got = _activate(tmp_path, "json")
    assert got["fds"]["json"][2] == str(tmp_path / "a.sock")
    assert got["fds"]["json#2"][2] == str(tmp_path / "b.sock")


def test_listen_fds_for_another_pid_are_ignored(monkeypatch) -> None:
    monkeypatch.setenv("LISTEN_PID", "1")
    monkeypatch.setenv("LISTEN_FDS", "1")
    monkeypatch.setenv("LISTEN_FDNAMES", "json")
    assert listen_fds() == {}
