"""What every section of the configuration checks its keys with, and the error naming the key."""

from __future__ import annotations

ENV_PREFIX = "SPEAKD_"  # SPEAKD_<SECTION>_<KEY> overrides the file (speakd.config.load_config)


class ConfigError(ValueError):
    """A config value is wrong; the message starts with the dotted key."""


def choice(key: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ConfigError(f"{key}: {value!r} is not one of {', '.join(allowed)}")


def in_range(key: str, value: float, lo: float, hi: float) -> None:
    if not lo <= value <= hi:
        raise ConfigError(f"{key}: {value!r} is outside {lo}..{hi}")


def topic_level(key: str, value: str, allow_slash: bool = False) -> None:
    """MQTT topic parts we build topics from: no wildcards, no empty levels."""
    bad = "+#\x00" if allow_slash else "+#/\x00"
    if not value or any(c in value for c in bad) or "//" in value or value.strip("/") != value:
        raise ConfigError(f"{key}: {value!r} is not usable in an MQTT topic")
