"""Where the daemon keeps what it writes, for whoever runs it.

systemd hands a service its directories in ``RUNTIME_DIRECTORY``/``STATE_DIRECTORY``/
``CACHE_DIRECTORY`` (system and user units alike); without them root and the system service's
own user (``sudo -u speakd speakd cache …``) get the FHS paths, any other user the XDG base
directories. Sockets are runtime, clips are cache (rebuildable),
what must survive a cache wipe (the MQTT journal, pack anti-replay versions) is state, and voice
files a user adds are data.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import stat
from pathlib import Path

SERVICE_USER = "speakd"  # User= in systemd/speakd.service


def system_account() -> bool:
    """Root, or the system service's user outside the service: the FHS paths are theirs."""
    if os.geteuid() == 0:
        return True
    try:
        return pwd.getpwuid(os.geteuid()).pw_name == SERVICE_USER
    except KeyError:
        return False


def _systemd_dir(variable: str) -> Path | None:
    """The first of the paths systemd gave the service in ``variable``."""
    value = os.environ.get(variable)
    return Path(value.split(":")[0]) if value else None


def _xdg(variable: str, fallback: str) -> Path:
    value = os.environ.get(variable)
    return (Path(value) if value else Path.home() / fallback) / "speakd"


def runtime_dir() -> Path:
    """Sockets: /run/speakd for the system service, else $XDG_RUNTIME_DIR/speakd."""
    if systemd := _systemd_dir("RUNTIME_DIRECTORY"):
        return systemd
    if system_account():
        return Path("/run/speakd")
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    return Path(xdg) / "speakd" if xdg else _own_tmp_dir(Path(f"/tmp/speakd-{os.geteuid()}"))


class UnsafePath(Exception):
    """A directory speakd would use that someone else could read or replace."""


def _own_tmp_dir(path: Path) -> Path:
    """``path`` in a shared /tmp, made 0700 when absent, else used only when it is a directory
    (not a link) of this user's that no one else may enter: anyone can create
    ``/tmp/speakd-<uid>`` first, and a daemon would then listen, or a client talk, in their
    folder."""
    uid = os.geteuid()
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700)
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != uid or st.st_mode & 0o077:
        raise UnsafePath(
            f"{path} (XDG_RUNTIME_DIR is unset) is not a private directory of uid {uid} "
            f"(owner uid {st.st_uid}, mode {stat.filemode(st.st_mode)}); set XDG_RUNTIME_DIR or "
            "socket.path, or remove it"
        )
    return path


def private_umask() -> None:
    """Set the process's umask so that what speakd and its libraries create is private whatever
    umask it was started with: 0077 for a desktop user (its cache holds every text it spoke),
    at least 0027 for the system service (group ``speakd`` reads; the unit's ``UMask=``)."""
    wanted = 0o027 if system_account() else 0o077
    os.umask(os.umask(0) | wanted)


def _chosen(systemd: str, system: str, xdg: str, home: str) -> Path:
    """systemd's directory for the service, else the FHS one (root, user speakd), else XDG's."""
    if given := _systemd_dir(systemd):
        return given
    return Path(system) if system_account() else _xdg(xdg, home)


def state_dir() -> Path:
    """State that must outlive the cache: /var/lib/speakd, else $XDG_STATE_HOME/speakd."""
    return _chosen("STATE_DIRECTORY", "/var/lib/speakd", "XDG_STATE_HOME", ".local/state")


def data_dir() -> Path:
    """Files a user adds (voices): /var/lib/speakd, else $XDG_DATA_HOME/speakd."""
    return _chosen("STATE_DIRECTORY", "/var/lib/speakd", "XDG_DATA_HOME", ".local/share")


def cache_dir() -> Path:
    """Rebuildable clips: /var/cache/speakd, else $XDG_CACHE_HOME/speakd."""
    return _chosen("CACHE_DIRECTORY", "/var/cache/speakd", "XDG_CACHE_HOME", ".cache")


def close_own_dirs() -> list[Path]:
    """A desktop user's speakd directories made 0700 when an older speakd left them open to
    others (made under the user's umask, 0755): their files (the cache's texts) then are private
    whatever their own modes. The system service's are the unit's and tmpfiles.d's. Returns the
    directories changed."""
    if system_account():
        return []
    changed = []
    for path in dict.fromkeys((cache_dir(), state_dir(), data_dir())):
        with contextlib.suppress(OSError):
            st = os.lstat(path)
            if stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and st.st_mode & 0o077:
                path.chmod(0o700)
                changed.append(path)
    return changed
