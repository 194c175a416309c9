"""Whose paths: a client finds the daemon the user runs (``speakd.library.find``), and `speakd
doctor` judges a path as the service's user would meet it (``speakd.lifecycle.writable``), on
real files and modes. The installed package does both for real in tests/test_deb.py."""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from speakd.library.find import daemon_socket
from speakd.lifecycle.writable import Account, unwritable

SERVICE = Account("svc", 54321, frozenset({54321}))
OTHER = Account("other", 54322, frozenset({54322}))


def test_the_users_own_daemon_comes_before_the_configs(tmp_path: Path, monkeypatch) -> None:
    """A desktop user (any uid but root) whose user unit listens: `speakd say` with no flag goes
    there, not to the config's socket; --socket, --config and $SPEAKD_SOCKET_PATH still win."""
    run = tmp_path / "run"
    (run / "speakd").mkdir(parents=True)
    config = tmp_path / "speakd.toml"
    config.write_text('[socket]\npath = "/run/speakd/speakd.sock"\n')
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setattr("speakd.config.DEFAULT_CONFIG_PATH", config)  # /etc/speakd/speakd.toml
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(run))
    for name in ("RUNTIME_DIRECTORY", "SPEAKD_SOCKET_PATH"):
        monkeypatch.delenv(name, raising=False)
    own = run / "speakd" / "speakd.sock"
    assert daemon_socket() == "/run/speakd/speakd.sock"  # no user daemon: the system's
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(own))
        assert daemon_socket() == str(own)
        assert daemon_socket(config=config) == "/run/speakd/speakd.sock"
        assert daemon_socket("/elsewhere.sock") == "/elsewhere.sock"
        monkeypatch.setenv("SPEAKD_SOCKET_PATH", "/env.sock")
        assert daemon_socket() == "/env.sock"
    own.unlink()
    own.write_text("not a socket")
    monkeypatch.delenv("SPEAKD_SOCKET_PATH")
    assert daemon_socket() == "/run/speakd/speakd.sock"


def _owned(path: Path, mode: int, uid: int, gid: int, folder: bool = True) -> Path:
    if folder:
        path.mkdir()
    os.chown(path, uid, gid)
    path.chmod(mode)
    return path


@pytest.fixture
def searchable() -> Iterator[Path]:
    """A folder every user may enter (pytest's own tmp_path is root's 0700)."""
    path = Path(tempfile.mkdtemp(prefix="speakd-paths-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path)


@pytest.mark.skipif(os.geteuid() != 0, reason="gives files to other uids: needs root")
def test_writable_is_judged_as_the_services_user(searchable: Path) -> None:
    tmp_path = searchable
    root_dir = _owned(tmp_path / "root", 0o755, 0, 0)
    assert "svc cannot create" in unwritable(root_dir / "speakd" / "cache.db", SERVICE)
    assert "svc cannot write in" in unwritable(root_dir / "cache.db", SERVICE)
    assert unwritable(root_dir / "cache.db", Account("root", 0)) == ""  # what os.access says
    mine = _owned(tmp_path / "mine", 0o750, SERVICE.uid, SERVICE.uid)
    assert unwritable(mine / "cache.db", SERVICE) == ""
    assert "other cannot write in" in unwritable(mine / "cache.db", OTHER)
    db = mine / "cache.db"
    db.write_bytes(b"")
    _owned(db, 0o644, 0, 0, folder=False)  # left behind by a daemon run as root
    assert "svc cannot read and write" in unwritable(db, SERVICE)
    assert unwritable(mine / "state", SERVICE, is_dir=True) == ""
    made = Account("svc", SERVICE.uid, SERVICE.gids, (root_dir / "speakd",))
    assert unwritable(root_dir / "speakd" / "cache.db", made) == ""  # CacheDirectory= makes it
    group = _owned(tmp_path / "group", 0o770, 0, SERVICE.uid)
    assert unwritable(group / "x", SERVICE) == ""
    assert "other cannot" in unwritable(group / "x", OTHER)


def test_the_service_user_outside_the_service_gets_the_services_paths(monkeypatch) -> None:
    """`sudo -u speakd speakd cache import` (docs/cache.md) writes the service's cache and state,
    with no path pinned in the config; any other user gets its XDG directories."""
    import pwd

    from speakd import paths

    for name in ("CACHE_DIRECTORY", "STATE_DIRECTORY", "RUNTIME_DIRECTORY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", "/home/alice/.cache")
    monkeypatch.setattr(os, "geteuid", lambda: 995)
    for user, cache, state in (
        ("speakd", "/var/cache/speakd", "/var/lib/speakd"),
        ("alice", "/home/alice/.cache/speakd", None),
    ):
        entry = pwd.struct_passwd((user, "x", 995, 995, "", f"/home/{user}", "/bin/sh"))
        monkeypatch.setattr(pwd, "getpwuid", lambda _uid, e=entry: e)
        assert str(paths.cache_dir()) == cache
        assert state is None or str(paths.state_dir()) == state
