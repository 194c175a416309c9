"""What speakd writes, read as another user of the machine would: a desktop user's daemon makes
everything private (0700 directories, 0600 files and sockets) whatever umask it starts under, the
system service's files have the modes docs/systemd.md states, nothing (onnxruntime's telemetry
database included) lands outside speakd's own directories, and the /tmp fallback for a session
without $XDG_RUNTIME_DIR is not a folder another user made. Real daemons, real syntheses, real
file modes; the desktop user is ``nobody``."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.daemon_proc import DaemonProc, start_daemon, write_config
from tests.desktop_user import USER, Session, start_user_daemon
from tests.mosquitto import Mosquitto

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="runs daemons as other users: root")


def _speak(daemon: DaemonProc) -> None:
    """A synthesis shifted in pitch (the resampler, then Rubber Band), and one streamed back."""
    for pitch in (2.5, 9.0):
        events = daemon.say(f"Private at pitch {pitch}.", pitch=pitch)
        assert events[-1]["event"] == "finished", events
    with daemon.client() as c:
        chunk, _ = c.synth({"text": "And streamed back."})
    assert chunk is not None and chunk.frames > 0


def _created(root: Path, before: set[Path]) -> dict[Path, os.stat_result]:
    return {p: p.lstat() for p in root.rglob("*") if p not in before}


@pytest.mark.parametrize("umask", [0o000, 0o022])
def test_a_desktop_users_files_are_private_and_stay_in_speakds_directories(
    shared_dir: Path, shared_broker: Mosquitto, umask: int
) -> None:
    session = Session.make(shared_dir)
    drop_in = {  # MQTT on: its journal is one of the files
        "SPEAKD_AUDIO_SINK": "null",
        "SPEAKD_SSIP_PREWARM_KEYS": "false",
        "SPEAKD_MQTT_ENABLED": "true",
        "SPEAKD_MQTT_HOST": shared_broker.host,
        "SPEAKD_MQTT_PORT": str(shared_broker.port),
    }
    older = session.home / ".local" / "share" / "speakd"  # an older speakd's, made under 022
    older.mkdir(mode=0o755)
    os.chown(older, session.home.stat().st_uid, session.home.stat().st_gid)
    before = set(session.home.rglob("*")) | set(session.run.rglob("*"))
    daemon = start_user_daemon(session, umask=umask, env=drop_in)
    try:
        _speak(daemon)
        made = _created(session.home, before) | _created(session.run, before)
    finally:
        daemon.stop()
    uid = os.stat(session.home).st_uid
    names = {p.name for p in made}
    assert {"cache.db", "cache.db-wal", "mqtt-journal.db"} <= names, sorted(names)
    ours = (
        session.home / ".cache" / "speakd",
        session.home / ".local" / "state" / "speakd",
        session.home / ".local" / "share" / "speakd",
        session.run / "speakd",
        session.run / "speech-dispatcher",
    )
    outside = sorted(str(p) for p in made if not any(p == o or o in p.parents for o in ours))
    assert outside == [], "written outside speakd's directories"
    open_to_others = sorted(
        f"{p} {stat.filemode(st.st_mode)}"
        for p, st in made.items()
        if st.st_uid != uid or st.st_mode & 0o077
    )
    assert open_to_others == [], f"not private to {USER} under umask {umask:03o}"
    assert stat.S_IMODE(older.stat().st_mode) == 0o700, "an older speakd's folder left open"


def test_the_system_services_files_have_the_modes_docs_systemd_states(shared_dir: Path) -> None:
    """docs/systemd.md: directories 0750 and files 0640 (the unit's UMask=0027, which speakd
    applies itself too), SQLite's -wal and -shm as their database; sockets as configured.
    Root stands in for user speakd: both are the system's account (speakd.paths)."""
    system = shared_dir / "system"
    system.mkdir()
    config = write_config(system, sink="null")
    before = set(system.rglob("*"))  # the test's: the config, the voices and wav folders
    daemon = start_daemon(config, wrap=("sh", "-c", 'umask 000 && exec "$@"', "sh"))
    try:
        _speak(daemon)
        made = _created(system, before | {daemon.log})
    finally:
        daemon.stop()
    modes = {
        str(p.relative_to(system)): oct(stat.S_IMODE(st.st_mode))
        for p, st in made.items()
        if not stat.S_ISSOCK(st.st_mode)
    }
    want = {p: oct(0o750 if (system / p).is_dir() else 0o640) for p in modes}
    assert modes == want
    assert {"cache.db", "cache.db-wal", "cache.db-shm"} <= set(modes), modes


def _as_uid(uid: int, *args: str) -> subprocess.CompletedProcess[str]:
    """``speakd ARGS`` run by ``uid`` (no passwd entry: a user no test shares), no
    $XDG_RUNTIME_DIR."""
    env = {"PATH": "/usr/bin:/bin", "HOME": "/nonexistent", "LANG": "C.UTF-8"}
    env |= {k: v for k, v in os.environ.items() if k == "PYTHONPATH"}  # the code under test
    as_uid = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--"]
    run = [*as_uid, sys.executable, "-m", "speakd", *args]
    return subprocess.run(run, capture_output=True, text=True, env=env, cwd="/", timeout=60)


def test_the_tmp_fallback_is_never_a_folder_someone_else_made() -> None:
    """Without $XDG_RUNTIME_DIR, /tmp/speakd-<uid> is where a user's sockets go, and anyone may
    make it first. Another user's folder, a symlink, or one's own open to others is refused
    with the reason (a daemon would listen, a client talk, in a folder someone else controls);
    an absent one is made 0700 and used."""
    uid = 4_200_000 + os.getpid() % 100_000
    path = Path(f"/tmp/speakd-{uid}")
    elsewhere = Path(tempfile.mkdtemp(prefix="speakd-elsewhere-"))
    try:
        path.mkdir(mode=0o700)
        os.chown(path, uid + 1, uid + 1)  # another user took it first
        r = _as_uid(uid, "say", "Hello.")
        assert r.returncode == 2 and f"{path}" in r.stderr and f"owner uid {uid + 1}" in r.stderr
        path.rmdir()
        path.symlink_to(elsewhere)
        os.lchown(path, uid, uid)
        r = _as_uid(uid, "say", "Hello.")
        assert r.returncode == 2 and "is not a private directory" in r.stderr, r.stderr
        path.unlink()
        path.mkdir()
        os.chown(path, uid, uid)
        path.chmod(0o755)
        r = _as_uid(uid, "say", "Hello.")
        assert r.returncode == 2 and "drwxr-xr-x" in r.stderr, r.stderr
        path.rmdir()
        r = _as_uid(uid, "say", "Hello.")  # absent: made and used (no daemon listens there)
        assert "is not a private directory" not in r.stderr and str(path) in r.stderr, r.stderr
        st = path.lstat()
        assert stat.S_ISDIR(st.st_mode) and st.st_uid == uid and stat.S_IMODE(st.st_mode) == 0o700
    finally:
        if path.is_symlink():
            path.unlink()
        elif path.exists():
            path.rmdir()
        elsewhere.rmdir()
