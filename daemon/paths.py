"""Where the daemon keeps what it writes, for whoever runs it.

systemd hands a service its directories in ``RUNTIME_DIRECTORY``/``STATE_DIRECTORY``/
``CACHE_DIRECTORY`` (system and user units alike); without them root and the system service's
own user (``sudo -u speakd speakd cache …``) get the FHS paths, any other user the XDG base
directories. Sockets are runtime, clips are cache (rebuildable),
what must survive a cache wipe (the MQTT journal, pack anti-replay versions) is state, and voice
files a user adds are data.
"""

from __future__ import annotations

import os
import pwd
from pathlib import Path

SERVICE_USER = "speakd"  # User= in systemd/speakd.service


def _system() -> bool:
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
    if _system():
        return Path("/run/speakd")
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    return Path(xdg) / "speakd" if xdg else Path(f"/tmp/speakd-{os.geteuid()}")


def _chosen(systemd: str, system: str, xdg: str, home: str) -> Path:
    """systemd's directory for the service, else the FHS one (root, user speakd), else XDG's."""
    if given := _systemd_dir(systemd):
        return given
    return Path(system) if _system() else _xdg(xdg, home)


def state_dir() -> Path:
    """State that must outlive the cache: /var/lib/speakd, else $XDG_STATE_HOME/speakd."""
    return _chosen("STATE_DIRECTORY", "/var/lib/speakd", "XDG_STATE_HOME", ".local/state")


def data_dir() -> Path:
    """Files a user adds (voices): /var/lib/speakd, else $XDG_DATA_HOME/speakd."""
    return _chosen("STATE_DIRECTORY", "/var/lib/speakd", "XDG_DATA_HOME", ".local/share")


def cache_dir() -> Path:
    """Rebuildable clips: /var/cache/speakd, else $XDG_CACHE_HOME/speakd."""
    return _chosen("CACHE_DIRECTORY", "/var/cache/speakd", "XDG_CACHE_HOME", ".cache")
