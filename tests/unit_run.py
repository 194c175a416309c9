"""An installed unit's daemon started as systemd would start it, where systemd is not PID 1.

Everything comes from the unit files as installed: ``ExecStart=`` and ``Environment=`` of the
service (and of its drop-ins), the directories of ``RuntimeDirectory=``/``StateDirectory=``/
``CacheDirectory=`` (made, and named in ``$RUNTIME_DIRECTORY``… as systemd names them), the user
of ``User=``/``Group=``/``SupplementaryGroups=``, and the sockets of ``Sockets=``: each socket
unit's ``ListenStream=`` bound by ``systemd-socket-activate`` and passed under its
``FileDescriptorName=`` (``--fdname``), owned and moded per ``SocketUser=``/``SocketMode=``.
Specifiers (``%t``, ``%C``, ``%S``, ``%h``) expand as the system or a user manager expands them.
Not emulated: the notify protocol and the watchdog (tests/test_systemd.py has them), the
sandboxing settings.
"""

from __future__ import annotations

import grp
import os
import pwd
import shlex
import shutil
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

from tests import setups
from tests.test_systemd import unit_settings
from tests.waits import wait_until

Settings = dict[tuple[str, str], list[str]]
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
DIRECTORIES = {"RuntimeDirectory": "t", "StateDirectory": "S", "CacheDirectory": "C"}


def socket_activate() -> str:
    path = shutil.which("systemd-socket-activate") or "/lib/systemd/systemd-socket-activate"
    if not Path(path).exists():
        raise FileNotFoundError("systemd-socket-activate (Debian package systemd)")
    return path


@dataclass(frozen=True)
class Manager:
    """The system manager, or one user's: its specifiers and the environment it gives services."""

    user: pwd.struct_passwd | None  # None: the system manager
    env: dict[str, str]

    @classmethod
    def system(cls) -> Manager:
        return cls(None, {"PATH": SYSTEM_PATH, "LANG": "C.UTF-8"})

    @classmethod
    def of_user(cls, name: str, env: dict[str, str]) -> Manager:
        """``env``: the session's XDG_* (systemd --user imports them), HOME and the rest added."""
        user = pwd.getpwnam(name)
        base = {"HOME": user.pw_dir, "USER": name, "LOGNAME": name, "PATH": SYSTEM_PATH}
        return cls(user, base | {"LANG": "C.UTF-8"} | env)

    def specifier(self, letter: str) -> str:
        if self.user is None:
            return {"t": "/run", "S": "/var/lib", "C": "/var/cache", "h": "/root"}[letter]
        home = self.env["HOME"]
        return {
            "t": self.env["XDG_RUNTIME_DIR"],
            "S": self.env.get("XDG_CONFIG_HOME", f"{home}/.config"),  # systemd 252's choice
            "C": self.env.get("XDG_CACHE_HOME", f"{home}/.cache"),
            "h": home,
        }[letter]

    def expand(self, value: str) -> str:
        out, i = [], 0
        while i < len(value):
            if value[i] == "%" and i + 1 < len(value):
                nxt = value[i + 1]
                out.append("%" if nxt == "%" else self.specifier(nxt))
                i += 2
            else:
                out.append(value[i])
                i += 1
        return "".join(out)


def settings_with_dropins(unit: Path, dropins: Path | None) -> Settings:
    """The unit's settings, then each ``*.conf`` of its drop-in folder's (later lines add)."""
    merged = unit_settings(unit)
    for conf in sorted(dropins.glob("*.conf")) if dropins and dropins.is_dir() else []:
        for key, values in unit_settings(conf).items():
            merged.setdefault(key, []).extend(values)
    return merged


def environment(settings: Settings, manager: Manager) -> dict[str, str]:
    """``Environment=`` lines: each holds one or more (quoted) VAR=value assignments."""
    env = {}
    for line in settings.get(("Service", "Environment"), []):
        for assignment in shlex.split(manager.expand(line)):
            name, _, value = assignment.partition("=")
            env[name] = value
    return env


def _one(settings: Settings, section: str, key: str, default: str | None = None) -> str:
    values = settings.get((section, key))
    if not values:
        assert default is not None, f"[{section}] {key}= missing"
        return default
    return values[-1]


def _ids(settings: Settings) -> tuple[int, int, list[int]] | None:
    """The service's uid, gid and groups (the user's own plus SupplementaryGroups=)."""
    if (name := _one(settings, "Service", "User", "")) == "":
        return None
    user = pwd.getpwnam(name)
    gid = grp.getgrnam(_one(settings, "Service", "Group", name)).gr_gid
    extra = [
        grp.getgrnam(g).gr_gid for g in _one(settings, "Service", "SupplementaryGroups", "").split()
    ]
    return user.pw_uid, gid, sorted(set(os.getgrouplist(name, gid)) | set(extra))


@dataclass
class Activated:
    """The listening sockets (fd name → path) and, after the first connection, the daemon."""

    proc: subprocess.Popen[bytes]
    sockets: dict[str, Path]
    log: Path

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self, timeout: float = 30) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise


def start(service: Path, manager: Manager, log: Path) -> Activated:
    """Bind ``service``'s sockets and start its ``ExecStart=`` on the first connection."""
    settings = settings_with_dropins(service, _dropin_dir(service, manager))
    ids = _ids(settings)
    env = dict(manager.env)
    if ids is not None:
        user = pwd.getpwuid(ids[0])
        env |= {"HOME": user.pw_dir, "USER": user.pw_name, "LOGNAME": user.pw_name}
    elif manager.user is not None:  # what a user manager makes is the user's
        ids = (manager.user.pw_uid, manager.user.pw_gid, [])
    for key, letter in DIRECTORIES.items():  # systemd makes them and says where
        if name := _one(settings, "Service", key, ""):
            path = Path(manager.specifier(letter)) / name
            mode = int(_one(settings, "Service", f"{key}Mode", "0755"), 8)
            _mkdir(path, mode, ids)
            env[f"{key.removesuffix('Directory').upper()}_DIRECTORY"] = str(path)
    env |= environment(settings, manager)
    sockets: dict[str, Path] = {}
    owners: list[tuple[Path, Settings]] = []
    for name in _one(settings, "Service", "Sockets").split():
        sock = unit_settings(service.parent / name)
        path = Path(manager.expand(_one(sock, "Socket", "ListenStream")))
        _mkdir(path.parent, int(_one(sock, "Socket", "DirectoryMode", "0755"), 8), ids)
        sockets[_one(sock, "Socket", "FileDescriptorName")] = path
        owners.append((path, sock))
    command = shlex.split(manager.expand(_one(settings, "Service", "ExecStart")))
    socket_units = [service.parent / name for name in _one(settings, "Service", "Sockets").split()]
    setups.started(service, *socket_units, *filter(None, [setups.config_of(command)]))
    if manager.user is None and ids is not None:  # root binds; the service runs as its user
        uid, gid, groups = ids
        command = ["setpriv", f"--reuid={uid}", f"--regid={gid}",
                   f"--groups={','.join(map(str, groups))}", "--", *command]  # fmt: skip
    activate = [socket_activate(), *(f"--listen={p}" for p in sockets.values())]
    activate.append(f"--fdname={':'.join(sockets)}")
    activate += [f"--setenv={k}={v}" for k, v in env.items()]
    if manager.user is not None:  # a user manager: all of it runs as that user
        pw = manager.user
        activate = ["setpriv", f"--reuid={pw.pw_uid}", f"--regid={pw.pw_gid}", "--init-groups",
                    "--", *activate]  # fmt: skip
    proc = subprocess.Popen(
        [*activate, *command], env={"PATH": SYSTEM_PATH}, cwd="/", stdin=subprocess.DEVNULL,
        stdout=log.open("wb"), stderr=subprocess.STDOUT,
    )  # fmt: skip
    activated = Activated(proc, sockets, log)
    try:
        for path, sock in owners:
            wait_until(lambda p=path: p.exists() or proc.poll() is not None, f"{path}", 30)
            assert proc.poll() is None, activated.log_text()
            owner = _one(sock, "Socket", "SocketUser", "")
            group = _one(sock, "Socket", "SocketGroup", owner)
            if owner:
                shutil.chown(path, owner, group)
            path.chmod(int(_one(sock, "Socket", "SocketMode", "0666"), 8))
    except BaseException:
        activated.stop()
        raise
    return activated


def _dropin_dir(service: Path, manager: Manager) -> Path:
    """Where an admin's drop-ins for ``service`` live (``systemctl edit``)."""
    kind = "system" if manager.user is None else "user"
    return Path(f"/etc/systemd/{kind}/{service.name}.d")


def _mkdir(path: Path, mode: int, ids: tuple[int, int, list[int]] | None) -> None:
    if path.is_dir():
        return
    path.mkdir(parents=True)
    path.chmod(mode)
    if ids is not None:
        os.chown(path, ids[0], ids[1])


def sound_server_priority() -> list[str]:
    """The prefix that runs a sound server as a desktop does, at real-time priority (rtkit gives
    PulseAudio and PipeWire that): without it, a busy machine starves the private PulseAudio of
    the tests for over a second, and speakd rightly takes its device for wedged. Empty where the
    kernel refuses (no CAP_SYS_NICE)."""
    prefix = ["chrt", "--rr", "5"]
    ok = shutil.which("chrt") and subprocess.run([*prefix, "true"]).returncode == 0
    return prefix if ok else []
