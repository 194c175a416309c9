"""Which configuration a daemon serves with, so that a desktop user's daemon is its own and never
the system service's twin (docs/configuration.md, "A desktop user's daemon").

The system unit names /etc/speakd/speakd.toml; the user unit names nothing, and the same file,
read whole, gave every desktop user's daemon the system service's MQTT client id (each broker
connection then closes the other's, and both take the same says), its TCP ports and a
``token_file`` the user may not read.
"""

from __future__ import annotations

import os
import pwd
from pathlib import Path
from typing import Any

from speakd.config import Config, SocketConfig, load_config, with_overrides
from speakd.paths import system_account

# What a desktop user's daemon takes from the system's file: how speech sounds. Never [mqtt]
# (the system service's client id: the two would take each other's session and says), [wyoming]
# and [http] (its ports, its token_file), [fleet], nor [socket], [cache] and [state] (its paths).
USER_DAEMON_SECTIONS = ("engine", "voices", "lexicon", "audio", "limits", "ssip")


def user_config_path(env: dict[str, str] | None = None) -> Path:
    """A desktop user's own file: $XDG_CONFIG_HOME/speakd/speakd.toml (~/.config by default)."""
    env = dict(os.environ) if env is None else env
    base = env.get("XDG_CONFIG_HOME") or str(Path(env.get("HOME") or Path.home()) / ".config")
    return Path(base) / "speakd" / "speakd.toml"


def load_daemon_config(path: Path | str | None = None, env: dict[str, str] | None = None) -> Config:
    """The configuration ``speakd serve`` runs with (docs/configuration.md, "A desktop user's
    daemon"): ``path`` when given (the system unit names /etc/speakd/speakd.toml); for root and
    user speakd, the system's file; for anyone else, their own file when it exists, else only
    ``USER_DAEMON_SECTIONS`` of the system's, so that it never takes the system service's MQTT
    client id, ports or secrets."""
    if path is not None or system_account():
        return load_config(path, env)
    own = user_config_path(env)
    config = (
        load_config(own, env) if own.is_file() else load_config(None, env, USER_DAEMON_SECTIONS)
    )
    return for_one_user(config)


def for_one_user(config: Config) -> Config:
    """A desktop user's defaults where the system's would be shared or open: its own MQTT client
    id (``speakd-<site_id>-<user>``: the broker closes one of two connections with the same id),
    and sockets that only the user may open (0600; the user units' ``SocketMode=``)."""
    changes: dict[str, dict[str, Any]] = {}
    if not config.mqtt.client_id:
        try:
            user = pwd.getpwuid(os.geteuid()).pw_name
        except KeyError:  # a uid with no name (a container's)
            user = str(os.geteuid())
        changes["mqtt"] = {"client_id": f"speakd-{config.mqtt.site_id}-{user}"}
    if config.socket.mode == SocketConfig.mode:
        changes["socket"] = {"mode": "0600"}
    return with_overrides(config, **changes) if changes else config
