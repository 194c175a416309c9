"""Which daemon a client command (``speakd say``, ``status``, ``doctor``…) talks to: the one the
user actually runs, with no flag.

1. ``--socket PATH``;
2. ``--config FILE`` or ``$SPEAKD_SOCKET_PATH``: that ``socket.path``, as asked;
3. the user's own daemon, when its socket is there: ``$XDG_RUNTIME_DIR/speakd/speakd.sock``, where
   the user unit's ``speakd.socket`` listens (``speakd.paths.runtime_dir``);
4. else the configured ``socket.path``: ``/etc/speakd/speakd.toml`` pins the system service's
   ``/run/speakd/speakd.sock``, so every user of a board finds it.

A desktop user with the user units enabled therefore reaches their own daemon, and anyone without
them the system service. For root, step 3 is the system service's path itself.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from speakd.config import ENV_PREFIX, load_config
from speakd.paths import runtime_dir

SOCKET_ENV = f"{ENV_PREFIX}SOCKET_PATH"


def _is_socket(path: Path) -> bool:
    try:
        return stat.S_ISSOCK(path.stat().st_mode)
    except OSError:
        return False


def daemon_socket(socket: str | None = None, config: Path | None = None) -> str:
    """The JSON socket of the daemon to talk to (the rule above)."""
    if socket:
        return socket
    if config is None and SOCKET_ENV not in os.environ:
        own = runtime_dir() / "speakd.sock"
        if _is_socket(own):
            return str(own)
    return load_config(config).socket.path
