"""speakd's configuration: one TOML file, every key defaulted and validated at start-up.

Errors name the key (``mqtt.port: expected an integer…``). Environment variables
``SPEAKD_<SECTION>_<KEY>`` override the file, for containers and systemd drop-ins.

This module reads the file into the whole (``Config``); its sections, each a frozen dataclass
that validates its own keys, are those of what is said and how (``speech.py``) and those of the
ways in (``listeners.py``), checked with ``checks.py``.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, get_args, get_origin, get_type_hints

from speakd.config.checks import ENV_PREFIX, ConfigError
from speakd.config.listeners import (
    FleetConfig,
    HttpConfig,
    MqttConfig,
    SocketConfig,
    SsipConfig,
    WyomingConfig,
    ed25519_public_bytes,
)
from speakd.config.speech import (
    DEFAULT_LUFS,
    ENGINE_KINDS,
    AudioConfig,
    CacheConfig,
    EngineConfig,
    LexiconConfig,
    LimitsConfig,
    StateConfig,
    VoicesConfig,
)

__all__ = [  # the names the rest of speakd imports from speakd.config
    "DEFAULT_LUFS",
    "ENGINE_KINDS",
    "ENV_PREFIX",
    "AudioConfig",
    "CacheConfig",
    "Config",
    "ConfigError",
    "EngineConfig",
    "FleetConfig",
    "HttpConfig",
    "LexiconConfig",
    "LimitsConfig",
    "MqttConfig",
    "SocketConfig",
    "SsipConfig",
    "StateConfig",
    "VoicesConfig",
    "WyomingConfig",
    "ed25519_public_bytes",
    "load_config",
    "with_overrides",
]

DEFAULT_CONFIG_PATH = Path("/etc/speakd/speakd.toml")


@dataclass(frozen=True)
class Config:
    engine: EngineConfig = field(default_factory=EngineConfig)
    voices: VoicesConfig = field(default_factory=VoicesConfig)
    lexicon: LexiconConfig = field(default_factory=LexiconConfig)
    audio: AudioConfig = field(default_factory=AudioConfig)
    socket: SocketConfig = field(default_factory=SocketConfig)
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    state: StateConfig = field(default_factory=StateConfig)
    mqtt: MqttConfig = field(default_factory=MqttConfig)
    fleet: FleetConfig = field(default_factory=FleetConfig)
    wyoming: WyomingConfig = field(default_factory=WyomingConfig)
    http: HttpConfig = field(default_factory=HttpConfig)
    ssip: SsipConfig = field(default_factory=SsipConfig)
    source: str = ""  # the file it came from, for doctor and logs

    def validate(self) -> Config:
        for f in fields(self):
            section = getattr(self, f.name)
            if hasattr(section, "validate"):
                section.validate()
        return self

    def to_dict(self) -> dict[str, Any]:
        return {
            f.name: {
                g.name: getattr(getattr(self, f.name), g.name)
                for g in fields(getattr(self, f.name))
            }
            for f in fields(self)
            if f.name != "source"
        }


def _coerce(key: str, value: Any, typ: type, from_env: bool = False) -> Any:
    """Check a TOML value (or an environment string, read as TOML) against the field's type."""
    if from_env and typ is not str:
        try:
            value = tomllib.loads(f"v = {value}")["v"]
        except tomllib.TOMLDecodeError:
            raise ConfigError(f"{key}: cannot read {value!r} as {typ.__name__}") from None
    if typ is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if get_origin(typ) is dict:  # dict[str, str]: a TOML table of strings
        _, item = get_args(typ)
        if not isinstance(value, dict) or not all(isinstance(v, item) for v in value.values()):
            raise ConfigError(f"{key}: expected a table of {item.__name__}, got {value!r}")
        return value
    if get_origin(typ) is list:  # list[str]: a TOML array of strings
        (item,) = get_args(typ)
        if not isinstance(value, list) or not all(isinstance(v, item) for v in value):
            raise ConfigError(f"{key}: expected a list of {item.__name__}, got {value!r}")
        return value
    if (typ is int and isinstance(value, bool)) or not isinstance(value, typ):
        raise ConfigError(f"{key}: expected {typ.__name__}, got {type(value).__name__} {value!r}")
    return value


def _section(name: str, cls: type, data: Any, env: dict[str, str]) -> Any:
    if not isinstance(data, dict):
        raise ConfigError(f"{name}: expected a table")
    hints = get_type_hints(cls)
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ConfigError(f"{name}.{unknown[0]}: unknown key (known: {', '.join(sorted(known))})")
    values = {k: _coerce(f"{name}.{k}", v, hints[k]) for k, v in data.items()}
    for k in known:
        env_key = f"{ENV_PREFIX}{name}_{k}".upper()
        if env_key in env:
            values[k] = _coerce(f"{name}.{k} (from ${env_key})", env[env_key], hints[k], True)
    return cls(**values)


def load_config(
    path: Path | str | None = None,
    env: dict[str, str] | None = None,
    only: tuple[str, ...] | None = None,
) -> Config:
    """Read ``path`` (or /etc/speakd/speakd.toml when it exists, else defaults) and validate;
    with ``only``, the file's other sections are left at their defaults."""
    env = dict(os.environ) if env is None else env
    data: dict[str, Any] = {}
    source = ""
    if path is None and DEFAULT_CONFIG_PATH.is_file():
        path = DEFAULT_CONFIG_PATH
    if path is not None:
        path = Path(path)
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ConfigError(f"{path}: no such config file") from None
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
            raise ConfigError(f"{path}: not valid TOML: {e}") from None
        source = str(path)
    hints = get_type_hints(Config)
    sections = {f.name for f in fields(Config)} - {"source"}
    unknown = sorted(set(data) - sections)
    if unknown:
        raise ConfigError(f"{unknown[0]}: unknown section (known: {', '.join(sorted(sections))})")
    if only is not None and data:
        data = {name: data[name] for name in only if name in data}
        source += f" ([{'], ['.join(only)}] only)"
    config = Config(
        **{name: _section(name, hints[name], data.get(name, {}), env) for name in sections},
        source=source,
    )
    return config.validate()


def with_overrides(config: Config, **sections: dict[str, Any]) -> Config:
    """A copy with some keys changed (used by the CLI's --socket and the tests)."""
    changed = {name: replace(getattr(config, name), **vals) for name, vals in sections.items()}
    return replace(config, **changed).validate()
