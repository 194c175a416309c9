"""``speakd doctor``'s paths check, run as an ordinary user (``nobody``) on real SQLite files with
real owners and modes: a database the daemon writes that root left behind (what ``sudo speakd
cache import`` leaves: ``pack-versions.db``, or a cache's ``-wal``/``-shm`` while it runs) fails
the check, naming the file; handed back to the user, it passes."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import sqlite3
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from speakd.cache.store import CacheStore
from speakd.cache.versions import FILE as VERSIONS
from speakd.cli import main as speakd_main
from speakd.config import load_config
from speakd.lifecycle.doctor import _check_paths
from speakd.lifecycle.writable import JOURNAL
from speakd_tools.cli import main as tools_main
from tests.test_fleet_trust import make_pack

USER = pwd.getpwnam("nobody")
AS_ROOT = pytest.mark.skipif(os.geteuid() != 0, reason="gives files to other uids, becomes one")


def doctor_paths_as(user: pwd.struct_passwd, config: Path) -> tuple[bool | str, str]:
    """The check in a child that has become ``user`` (a fork: the venv's interpreter lives in
    root's home, which ``user`` cannot enter; everything the check needs is imported already)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never back into pytest
        code = 1
        try:
            os.close(read)
            os.setgroups([])
            os.setgid(user.pw_gid)
            os.setuid(user.pw_uid)
            os.write(write, json.dumps(_check_paths(load_config(config))).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write)
    with os.fdopen(read, "rb") as f:
        answer = f.read()
    assert os.waitpid(pid, 0)[1] == 0, answer
    ok, detail = json.loads(answer)
    return ok, detail


@pytest.fixture
def home() -> Iterator[Path]:
    """The user's speakd directories, in a folder every user may enter (pytest's is 0700)."""
    path = Path(tempfile.mkdtemp(prefix="speakd-doctor-"))
    path.chmod(0o755)
    for sub in ("cache", "state"):
        (path / sub).mkdir()
        os.chown(path / sub, USER.pw_uid, USER.pw_gid)
    yield path
    shutil.rmtree(path)


def write_config(home: Path, cache: Path, state: Path, extra: str = "") -> Path:
    config = home / "speakd.toml"
    config.write_text(f'[cache]\npath = "{cache}"\n\n[state]\ndir = "{state}"\n{extra}')
    config.chmod(0o644)
    return config


def give(path: Path, uid: int, gid: int, mode: int) -> None:
    os.chown(path, uid, gid)
    path.chmod(mode)


@AS_ROOT
def test_doctor_names_each_database_the_users_daemon_cannot_write(home: Path) -> None:
    cache, state = home / "cache" / "cache.db", home / "state"
    config = write_config(home, cache, state)
    CacheStore(cache).close()
    versions = state / VERSIONS
    for db in (versions, state / JOURNAL):  # real SQLite files (their tables do not matter here)
        sqlite3.connect(db).execute("CREATE TABLE t (x)").connection.close()
    for db in (cache, versions, state / JOURNAL):
        give(db, USER.pw_uid, USER.pw_gid, 0o600)
    ok, detail = doctor_paths_as(USER, config)
    assert ok is True, detail

    # `sudo speakd cache import`: root's 0644 pack record, and the cache open as root meanwhile
    give(versions, 0, 0, 0o644)
    importing = sqlite3.connect(cache)
    importing.execute("PRAGMA journal_mode=WAL")
    importing.execute("SELECT COUNT(*) FROM clips").fetchone()  # its -wal and -shm
    # SQLite run as root gives them the database's owner; one made while root owned cache.db
    # stays root's when only cache.db is handed back
    give(Path(f"{cache}-shm"), 0, 0, 0o644)
    try:
        ok, detail = doctor_paths_as(USER, config)
    finally:
        importing.close()
    assert ok is False
    assert f"nobody cannot write {versions} (owner uid 0, mode 0644)" in detail
    assert f"nobody cannot write {cache}-shm" in detail
    give(versions, USER.pw_uid, USER.pw_gid, 0o600)

    give(state / JOURNAL, 0, 0, 0o644)  # the MQTT journal: the same
    ok, detail = doctor_paths_as(USER, config)
    assert ok is False and f"nobody cannot write {state / JOURNAL}" in detail
    assert "pack-versions" not in detail and "cache.db" not in detail


@AS_ROOT
def test_a_signed_import_run_as_root_leaves_files_the_users_daemon_can_write(
    home: Path, capsys
) -> None:
    """``sudo speakd cache import`` of a signed pack into the user's directories, the cache and
    the pack record both new: they take the directory's owner, and doctor passes as the user."""
    cache, state = home / "cache" / "cache.db", home / "state"
    key_file = home / "ops"
    assert tools_main(["fleet", "keygen", str(key_file)]) == 0
    public = capsys.readouterr().out.splitlines()[1]
    config = write_config(home, cache, state, f'\n[fleet]\ntrusted_keys = ["{public}"]\n')
    pack = make_pack(home / "pack.db", ["p1", "p2"])
    sign = ["pack", "sign", str(pack), "--key", f"{key_file}.key", "--site", "lobby"]
    assert tools_main([*sign, "--version", "5"]) == 0
    assert speakd_main(["cache", "--config", str(config), "import", str(pack)]) == 0
    assert (state / VERSIONS).is_file() and cache.is_file()
    owners = {p.name: (p.stat().st_uid, p.stat().st_gid) for p in (cache, state / VERSIONS)}
    assert owners == dict.fromkeys(("cache.db", VERSIONS), (USER.pw_uid, USER.pw_gid))
    ok, detail = doctor_paths_as(USER, config)
    assert ok is True, detail
