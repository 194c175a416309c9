"""A desktop user's daemon from the source tree, as the user unit starts it: ``speakd serve`` with
no ``--config``, as an ordinary user (``nobody``), its session's XDG directories and the unit's
socket paths in its environment, and, when given, a system file at /etc/speakd/speakd.toml seen
through an overlay in a private mount namespace (the real /etc is not touched)."""

from __future__ import annotations

import os
import pwd
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tests.daemon_proc import READY_LINE, DaemonProc
from tests.waits import wait_until

USER = "nobody"  # an ordinary user, in no group of speakd's


@dataclass(frozen=True)
class Session:
    """The user's home and XDG directories, made as a login makes them, inside ``base``."""

    base: Path
    home: Path
    run: Path  # $XDG_RUNTIME_DIR

    @classmethod
    def make(cls, base: Path) -> Session:
        pw = pwd.getpwnam(USER)
        home, run = base / "home", base / "run"
        for path, mode in ((home, 0o755), (run, 0o700)):
            path.mkdir(mode=mode)
            os.chown(path, pw.pw_uid, pw.pw_gid)
            path.chmod(mode)
        for sub in (".cache", ".config", ".local", ".local/state", ".local/share"):
            (home / sub).mkdir(mode=0o755)
            os.chown(home / sub, pw.pw_uid, pw.pw_gid)
        return cls(base, home, run)

    @property
    def env(self) -> dict[str, str]:
        """What a user manager gives the service (the user unit's Environment= included)."""
        return {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "LANG": "C.UTF-8",
            "HOME": str(self.home),
            "USER": USER,
            "XDG_RUNTIME_DIR": str(self.run),
            "XDG_CACHE_HOME": str(self.home / ".cache"),
            "XDG_CONFIG_HOME": str(self.home / ".config"),
            "XDG_STATE_HOME": str(self.home / ".local/state"),
            "XDG_DATA_HOME": str(self.home / ".local/share"),
            "SPEAKD_SOCKET_PATH": str(self.run / "speakd" / "speakd.sock"),
            "SPEAKD_SOCKET_SSIP_PATH": str(self.run / "speech-dispatcher" / "speechd.sock"),
        } | {k: v for k, v in os.environ.items() if k == "PYTHONPATH"}  # the code under test

    def own_config(self, text: str) -> Path:
        """The user's own file, $XDG_CONFIG_HOME/speakd/speakd.toml."""
        path = self.home / ".config" / "speakd" / "speakd.toml"
        path.parent.mkdir(mode=0o700)
        path.write_text(text)
        pw = pwd.getpwnam(USER)
        for p in (path.parent, path):
            os.chown(p, pw.pw_uid, pw.pw_gid)
        return path


def _with_system_file(system_file: Path, base: Path) -> list[str]:
    """A command prefix that shows ``system_file`` at /etc/speakd/speakd.toml to what it runs."""
    layers = Path(tempfile.mkdtemp(prefix="etc-", dir=base))  # an overlay's own, each start
    upper, work = layers / "upper", layers / "work"
    (upper / "speakd").mkdir(parents=True)
    work.mkdir()
    (upper / "speakd" / "speakd.toml").write_text(system_file.read_text())
    upper.chmod(0o755)  # the merged /etc's own mode, whatever the umask made it
    (upper / "speakd").chmod(0o755)
    (upper / "speakd" / "speakd.toml").chmod(0o644)
    mount = f"mount -t overlay overlay -o lowerdir=/etc,upperdir={upper},workdir={work} /etc"
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", f'{mount} && exec "$@"',
            "sh"]  # fmt: skip


def _as_user(session: Session, command: list[str], system_file: Path | None) -> list[str]:
    """``command`` run as ``USER``, with ``system_file`` at /etc/speakd/speakd.toml if given."""
    pw = pwd.getpwnam(USER)
    as_user = ["setpriv", f"--reuid={pw.pw_uid}", f"--regid={pw.pw_gid}", "--clear-groups", "--"]
    prefix = _with_system_file(system_file, session.base) if system_file else []
    return [*prefix, *as_user, *command]


def run_as_user(
    session: Session,
    args: list[str],
    system_file: Path | None = None,
    python: str = sys.executable,
) -> subprocess.CompletedProcess[str]:
    """A ``speakd`` client command as ``USER`` in the session, as a terminal of theirs runs it."""
    command = _as_user(session, [python, "-m", "speakd", *args], system_file)
    return subprocess.run(command, capture_output=True, text=True, env=session.env, cwd="/",
                          timeout=120)  # fmt: skip


def start_user_daemon(
    session: Session,
    umask: int = 0o022,
    system_file: Path | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 120,
    python: str = sys.executable,
) -> DaemonProc:
    """``speakd serve`` as ``USER`` under ``umask``, ready (its READY line logged); ``env`` adds
    to the session's (a drop-in's ``Environment=``); ``python``: another install's (the
    package's)."""
    command = [python, "-m", "speakd", "--log-level", "DEBUG", "serve"]
    log = session.base / f"user-daemon-{len(list(session.base.glob('user-daemon-*')))}.log"
    proc = subprocess.Popen(
        _as_user(session, command, system_file),
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        env=session.env | (env or {}),
        cwd="/",
        umask=umask,
    )
    daemon = DaemonProc(log, session.env["SPEAKD_SOCKET_PATH"], proc, log, session.env)

    def ready() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"speakd exited with {proc.returncode}:\n{daemon.log_text()}")
        return READY_LINE in daemon.log_text()

    wait_until(ready, "the desktop user's speakd to log that it is ready", timeout)
    return daemon
