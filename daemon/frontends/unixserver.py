"""Unix-socket listeners shared by the JSON and SSIP front-ends.

A listener is either inherited from systemd (socket activation) or bound here: parent directory
created, a stale socket file from a crashed run replaced, but a live one (another daemon) refused;
then the configured mode and group applied. Peer credentials are read per connection.

The listen backlog is the system's largest (``net.core.somaxconn``), not asyncio's 100: a client
that connects without blocking, as asyncio clients do, is refused at once (EAGAIN) when the
backlog is full, and a burst of a few hundred connects outruns the accept loop. The HTTP and
Wyoming listeners take the same backlog.
"""

from __future__ import annotations

import asyncio
import contextlib
import grp
import logging
import os
import socket
import stat
import struct
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


SOMAXCONN = Path("/proc/sys/net/core/somaxconn")


class ListenError(Exception):
    pass


def listen_backlog() -> int:
    """The kernel's cap on a listen backlog (it silently truncates larger ones)."""
    try:
        return int(SOMAXCONN.read_text())
    except (OSError, ValueError):
        return socket.SOMAXCONN


def widen_backlog(server: asyncio.AbstractServer) -> None:
    """Give a server that a library started (with asyncio's backlog) ``listen_backlog()``."""
    for listening in getattr(server, "sockets", ()):
        with socket.socket(fileno=os.dup(listening.fileno())) as sock:  # the same socket
            sock.listen(listen_backlog())


@dataclass(frozen=True)
class Peer:
    pid: int
    uid: int
    gid: int

    def __str__(self) -> str:
        return f"pid={self.pid},uid={self.uid},gid={self.gid}"


def peer_of(writer: asyncio.StreamWriter) -> Peer | None:
    sock = writer.get_extra_info("socket")
    if sock is None:
        return None
    try:
        raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    except OSError:
        return None
    return Peer(*struct.unpack("3i", raw))


def _bind(path: Path, mode: int, group: str) -> socket.socket:
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists() or path.is_symlink():
        if not stat.S_ISSOCK(path.lstat().st_mode):
            raise ListenError(f"{path}: exists and is not a socket; refusing to replace it")
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(str(path))
        except OSError:
            path.unlink()  # stale: nothing listens there
        else:
            raise ListenError(f"{path}: another process is already listening there")
        finally:
            probe.close()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old_umask = os.umask(0o777 & ~mode)  # never expose the socket, even for an instant
    try:
        sock.bind(str(path))
        # at once: a client that waits for the path to appear must not find it refusing
        # (under qemu the rest of start-up between bind and asyncio's listen took long enough)
        sock.listen(listen_backlog())
    except OSError as e:
        sock.close()
        raise ListenError(f"{path}: cannot listen: {e.strerror}") from e
    finally:
        os.umask(old_umask)
    os.chmod(path, mode)
    if group:
        try:
            os.chown(path, -1, grp.getgrnam(group).gr_gid)
        except (KeyError, PermissionError) as e:
            sock.close()
            raise ListenError(f"{path}: cannot give the socket to group {group!r}: {e}") from e
    return sock


@dataclass(frozen=True)
class AccessPolicy:
    """Who may talk to a socket beyond its file mode: uid/gid allow-lists (empty = anyone)."""

    allow_uids: tuple[int, ...] = ()
    allow_gids: tuple[int, ...] = ()

    def allows(self, peer: Peer | None) -> bool:
        if not self.allow_uids and not self.allow_gids:
            return True
        if peer is None:
            return False
        return peer.uid in self.allow_uids or peer.gid in self.allow_gids or peer.uid == 0


def _guarded(handler: Handler, policy: AccessPolicy, refusal: bytes) -> Handler:
    async def guarded(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = peer_of(writer)
        if not policy.allows(peer):
            log.warning("refused a connection from %s: not in the allow-list", peer)
            # Half-close, then swallow what the peer already sent: closing a Unix socket with
            # unread data resets the peer before it can read the refusal.
            with contextlib.suppress(ConnectionError, TimeoutError):
                writer.write(refusal)
                writer.write_eof()
                await asyncio.wait_for(reader.read(1 << 16), timeout=1.0)
            writer.close()
            return
        try:
            await handler(reader, writer)
        except asyncio.CancelledError:
            # The daemon is stopping (asyncio.run cancels what is left): the connection goes
            # with it. Not re-raised: Python 3.11's stream callback logs a cancelled handler as
            # an "Exception in callback" traceback (a SIGTERM mid-traffic, the soak's stop).
            writer.close()

    return guarded


async def start_unix_server(
    handler: Handler,
    path: str,
    *,
    mode: int,
    group: str = "",
    inherited: socket.socket | None = None,
    limit: int = 65536,
    policy: AccessPolicy = AccessPolicy(),
    refusal: bytes = b"",
) -> asyncio.AbstractServer:
    """Listen on ``path`` (or the inherited socket); ``refusal`` is what a refused peer reads."""
    handler = _guarded(handler, policy, refusal)
    if inherited is not None:
        log.info("listening on inherited socket %s", inherited.getsockname() or path)
        sock = inherited
    else:
        sock = _bind(Path(path), mode, group)
        log.info("listening on %s (mode %o)", path, mode)
    return await asyncio.start_unix_server(
        handler, sock=sock, limit=limit, backlog=listen_backlog()
    )
