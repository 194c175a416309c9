"""systemd integration without libsystemd: sd_notify datagrams (and the watchdog pings and STATUS=
updates a running daemon keeps sending) and socket activation fds."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Callable

log = logging.getLogger(__name__)

SD_LISTEN_FDS_START = 3
STATUS_INTERVAL_S = 1.0  # how often STATUS= may change (WatchdogSec/2 is far coarser)


def notify(*lines: str) -> bool:
    """Send ``READY=1``, ``STATUS=…``, ``WATCHDOG=1``… to $NOTIFY_SOCKET; a no-op without it."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return False
    if address.startswith("@"):
        address = "\0" + address[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
            s.sendto("\n".join(lines).encode(), address)
        return True
    except OSError as e:
        log.warning("sd_notify %s failed: %s", lines, e)
        return False


def watchdog_interval() -> float | None:
    """Seconds between WATCHDOG=1 pings (half of WatchdogSec), or None when not asked for."""
    usec = os.environ.get("WATCHDOG_USEC")
    pid = os.environ.get("WATCHDOG_PID")
    if not usec or (pid and pid != str(os.getpid())):
        return None
    try:
        return int(usec) / 1e6 / 2
    except ValueError:
        return None


async def keep_notifying(watchdog: float | None, status: Callable[[], str]) -> None:
    """WATCHDOG=1 and STATUS= changes, sent from the event loop: a wedged loop goes quiet.
    Ticks every STATUS_INTERVAL_S (or faster for a short WatchdogSec); extra pings are free.
    ``status()`` is the line READY=1 carried, and each change of it is sent."""
    last = status()
    while True:
        lines = ["WATCHDOG=1"] if watchdog else []
        line = status()
        if line != last:
            lines.append(f"STATUS={line}")
            last = line
        if lines:
            notify(*lines)
        await asyncio.sleep(min(watchdog or STATUS_INTERVAL_S, STATUS_INTERVAL_S))


def listen_fds() -> dict[str, socket.socket]:
    """Sockets passed by systemd (or systemd-socket-activate), keyed by their LISTEN_FDNAMES.

    Unnamed fds are keyed ``fd<N>``; a name given to several fds (a .socket unit with two
    ListenStream= lines) keys the later ones ``<name>#2``, ``#3``… so none is silently dropped.
    The variables are removed so child processes do not inherit them.
    """
    if os.environ.get("LISTEN_PID") != str(os.getpid()):
        return {}
    try:
        count = int(os.environ.get("LISTEN_FDS", "0"))
    except ValueError:
        return {}
    names = os.environ.get("LISTEN_FDNAMES", "").split(":") if count else []
    result: dict[str, socket.socket] = {}
    for i in range(count):
        fd = SD_LISTEN_FDS_START + i
        name = names[i] if i < len(names) and names[i] else f"fd{fd}"
        if name in result:
            name = f"{name}#{sum(k.split('#')[0] == name for k in result) + 1}"
        os.set_inheritable(fd, False)
        result[name] = socket.socket(fileno=fd)
    for var in ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"):
        os.environ.pop(var, None)
    return result
