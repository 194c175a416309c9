"""Who may use the sockets: file mode and group, and the SO_PEERCRED allow-lists."""

from __future__ import annotations

import contextlib
import grp
import os
import shutil
import socket
import stat
import tempfile
from pathlib import Path

import pytest

from tests.daemon_proc import start_daemon, write_config

NOBODY = 65534
pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another user")


def as_nobody(socket_path: str) -> str:
    """Connect as uid/gid nobody in a forked child; returns its reply line or the error."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: drop privileges, try the socket, report through the pipe
        try:
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            s = socket.socket(socket.AF_UNIX)
            s.settimeout(10)
            s.connect(socket_path)
            with contextlib.suppress(BrokenPipeError):  # a refused peer is closed at once
                s.sendall(b'{"op": "status"}\n')
            result = s.makefile().readline()
        except OSError as e:
            result = f"{type(e).__name__}: {e}"
        os.write(write_fd, result.encode())
        os._exit(0)
    os.close(write_fd)
    with os.fdopen(read_fd) as f:
        result = f.read()
    os.waitpid(pid, 0)
    return result


@pytest.fixture
def public_config(tmp_path: Path):
    """A config whose socket lives in a directory every user can reach (pytest's tmp is 0700)."""
    public = Path(tempfile.mkdtemp(prefix="speakd-access-"))
    public.chmod(0o755)
    config = write_config(tmp_path)
    config.write_text(
        config.read_text().replace(str(tmp_path / "speakd.sock"), str(public / "s.sock"))
    )
    yield config
    shutil.rmtree(public, ignore_errors=True)


def test_socket_mode_keeps_others_out(public_config: Path) -> None:
    d = start_daemon(public_config)
    try:
        mode = stat.S_IMODE(os.stat(d.socket).st_mode)
        assert mode == 0o660
        assert as_nobody(d.socket).startswith("PermissionError")
    finally:
        assert d.stop() == 0


def test_allow_list_refuses_other_uids_with_a_clear_error(public_config: Path) -> None:
    config = public_config
    text = config.read_text().replace(
        "[socket]", '[socket]\nmode = "0666"\nallow_uids = [4242]\nallow_gids = [4243]'
    )
    config.write_text(text)
    d = start_daemon(config)
    try:
        assert '"code":"forbidden"' in as_nobody(d.socket)
        assert "refused a connection from pid=" in d.log_text()
        assert d.cli("status").returncode == 0  # root (the operator) is always allowed
    finally:
        assert d.stop() == 0


def test_socket_group_lets_its_members_in(public_config: Path) -> None:
    """``socket.group``: the socket belongs to that group, whose members (here nobody's own group)
    may connect through mode 0660 while everyone else stays out (the test above)."""
    group = grp.getgrgid(NOBODY).gr_name
    public_config.write_text(
        public_config.read_text().replace("[socket]", f'[socket]\ngroup = "{group}"')
    )
    d = start_daemon(public_config)
    try:
        st = os.stat(d.socket)
        assert (stat.S_IMODE(st.st_mode), st.st_gid) == (0o660, NOBODY)
        assert '"event":"status"' in as_nobody(d.socket)
    finally:
        assert d.stop() == 0
