"""The sections of the ways in: the sockets ([socket], [ssip]'s key echo), MQTT ([mqtt] and the
packs it takes, [fleet]), Wyoming ([wyoming]) and HTTP ([http]); each validates its own keys."""

from __future__ import annotations

import base64
import binascii
import ipaddress
import os
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

from speakd.config.checks import ENV_PREFIX, ConfigError, in_range, topic_level
from speakd.paths import runtime_dir


@dataclass(frozen=True)
class SocketConfig:
    path: str = field(default_factory=lambda: str(runtime_dir() / "speakd.sock"))
    ssip_path: str = field(default_factory=lambda: str(runtime_dir() / "ssip.sock"))
    mode: str = "0660"
    group: str = ""  # group that may connect; empty = the daemon's own group
    # Peer-credential allow-lists (SO_PEERCRED); empty = whoever the file mode lets in.
    allow_uids: list[int] = field(default_factory=list)
    allow_gids: list[int] = field(default_factory=list)

    def validate(self) -> None:
        if not self.path:
            raise ConfigError("socket.path: must not be empty")
        try:
            mode = int(self.mode, 8)
        except ValueError:
            raise ConfigError(
                f"socket.mode: expected an octal string like '0660', got {self.mode!r}"
            ) from None
        if not 0 <= mode <= 0o777:
            raise ConfigError(f"socket.mode: {self.mode!r} is not a permission mode")

    @property
    def mode_bits(self) -> int:
        return int(self.mode, 8)


@dataclass(frozen=True)
class MqttConfig:
    enabled: bool = False
    host: str = "localhost"
    port: int = 1883
    site_id: str = "default"  # our own topics: <prefix>/<site_id>/status, /availability
    site_ids: list[str] = field(default_factory=list)  # more sites (groups) we also act on
    prefix: str = "speakd"
    client_id: str = ""  # empty = "speakd-<site_id>"; must be stable for the persistent session
    username: str = ""
    password_file: str = ""  # or $SPEAKD_MQTT_PASSWORD (never put the password in the TOML)
    tls: bool = False
    ca_file: str = ""  # empty = the system CAs
    cert_file: str = ""  # client certificate (mutual TLS)
    key_file: str = ""
    keepalive: int = 30
    session_expiry_s: int = 3600  # how long the broker keeps QoS 1 commands while we are away
    reconnect_min_s: float = 1.0
    reconnect_max_s: float = 60.0
    max_payload_bytes: int = 65536
    discovery: bool = True  # Home Assistant MQTT discovery
    discovery_prefix: str = "homeassistant"
    discovery_delay_s: float = 3.0  # upper bound of the random delay after HA's birth message
    remote_speaker: str = ""  # a Hermes audio-server site id: play there instead of locally

    def validate(self) -> None:
        in_range("mqtt.port", self.port, 1, 65535)
        in_range("mqtt.keepalive", self.keepalive, 5, 3600)
        in_range("mqtt.session_expiry_s", self.session_expiry_s, 0, 0xFFFFFFFF)
        in_range("mqtt.reconnect_min_s", self.reconnect_min_s, 0.05, 3600)
        in_range("mqtt.reconnect_max_s", self.reconnect_max_s, self.reconnect_min_s, 3600)
        in_range("mqtt.max_payload_bytes", self.max_payload_bytes, 256, 16 * 1024 * 1024)
        in_range("mqtt.discovery_delay_s", self.discovery_delay_s, 0.0, 60.0)
        for key in ("site_id", "prefix", "discovery_prefix"):
            topic_level(f"mqtt.{key}", getattr(self, key), allow_slash=key != "site_id")
        for i, site in enumerate(self.site_ids):
            topic_level(f"mqtt.site_ids[{i}]", site)
        if self.remote_speaker:
            topic_level("mqtt.remote_speaker", self.remote_speaker)
        if bool(self.cert_file) != bool(self.key_file):
            raise ConfigError("mqtt.key_file: cert_file and key_file go together")
        if self.enabled:
            for key in ("password_file", "ca_file", "cert_file", "key_file"):
                path = getattr(self, key)
                if path and not Path(path).is_file():
                    raise ConfigError(f"mqtt.{key}: {path} is not a readable file")

    @property
    def sites(self) -> list[str]:
        """Every site id we act on, ours first."""
        return list(dict.fromkeys([self.site_id, *self.site_ids]))

    def password(self, env: dict[str, str] | None = None) -> str | None:
        """$SPEAKD_MQTT_PASSWORD, else the first line of password_file (systemd credentials)."""
        env = dict(os.environ) if env is None else env
        if f"{ENV_PREFIX}MQTT_PASSWORD" in env:
            return env[f"{ENV_PREFIX}MQTT_PASSWORD"]
        if not self.password_file:
            return None
        try:
            return Path(self.password_file).read_text(encoding="utf-8").splitlines()[0]
        except (OSError, UnicodeDecodeError, IndexError) as e:
            raise ConfigError(f"mqtt.password_file: cannot read a password: {e}") from None


@dataclass(frozen=True)
class FleetConfig:
    # Ed25519 public keys (base64, `speakd-tools fleet keygen`) whose signed packs this board
    # takes; several at once so a key can be rotated. Empty: packs are taken unsigned.
    trusted_keys: list[str] = field(default_factory=list)

    def validate(self) -> None:
        for i, key in enumerate(self.trusted_keys):
            try:
                ed25519_public_bytes(key)
            except ValueError as e:
                raise ConfigError(f"fleet.trusted_keys[{i}]: {e}") from None


def ed25519_public_bytes(text: str) -> bytes:
    """The 32 bytes of a base64 Ed25519 public key (as ``fleet keygen`` prints it); checked here
    so that config needs no crypto library (``speakd.cache.trust`` makes the key of them)."""
    try:
        raw = base64.b64decode(text.strip(), validate=True)
    except (binascii.Error, ValueError):
        raise ValueError(f"{text!r} is not base64") from None
    if len(raw) != 32:
        raise ValueError(f"{text!r} is {len(raw)} bytes, an Ed25519 public key is 32")
    return raw


@dataclass(frozen=True)
class WyomingConfig:
    """The Wyoming TTS server Home Assistant talks to (docs/wyoming.md). It has no
    authentication: bind it to the interface Home Assistant reaches, not to every one."""

    uri: str = ""  # empty = off; "tcp://0.0.0.0:10200" or "unix:///run/speakd/wyoming.sock"
    zeroconf: str = ""  # empty = off; else the name Home Assistant's discovery shows (tcp only)
    # A streamed text that stops right after ".", "!" or "?" is spoken after this long without
    # more text (an LLM pausing after a sentence); 0 = wait for the next chunk or the end.
    sentence_hold_ms: int = 150

    def validate(self) -> None:
        in_range("wyoming.sentence_hold_ms", self.sentence_hold_ms, 0, 10_000)
        if self.zeroconf and not self.uri.startswith("tcp://"):
            raise ConfigError("wyoming.zeroconf: discovery needs a tcp:// wyoming.uri")
        if not self.uri:
            return
        url = urlparse(self.uri)
        try:
            port = url.port
        except ValueError:  # out of range
            port = None
        if not (
            (url.scheme == "tcp" and url.hostname and port) or (url.scheme == "unix" and url.path)
        ):
            raise ConfigError(f"wyoming.uri: {self.uri!r} is not tcp://HOST:PORT or unix:///PATH")


@dataclass(frozen=True)
class HttpConfig:
    """The HTTP API (docs/http.md): OpenAI's speech endpoint, say/stop, health, metrics, a page."""

    listen: str = ""  # empty = off; "127.0.0.1:5500", "[::1]:5500", "0.0.0.0:5500" (needs a token)
    token: str = ""  # Bearer token; rather $SPEAKD_HTTP_TOKEN or token_file than the TOML
    token_file: str = ""  # its first line is the token (systemd LoadCredential=)
    max_body_bytes: int = 65536  # a larger request body is refused (413)
    timeout_s: float = 30.0  # a body slower to arrive, or a reader stalled this long, is cut off
    # peers (IP addresses) whose requests need no token: a proxy that authenticates its own
    # users, e.g. Home Assistant's ingress at 172.30.32.2 (docs/home-assistant.md)
    no_token_from: list[str] = field(default_factory=list)

    def validate(self) -> None:
        in_range("http.max_body_bytes", self.max_body_bytes, 1024, 16 * 1024 * 1024)
        in_range("http.timeout_s", self.timeout_s, 0.1, 3600)
        for peer in self.no_token_from:
            try:
                ipaddress.ip_address(peer)
            except ValueError:
                raise ConfigError(
                    f"http.no_token_from: {peer!r} is not an IP address (e.g. 172.30.32.2)"
                ) from None
        if not self.listen:
            return
        host, _port = self.address
        if self.token_value() is None and not _loopback(host):
            raise ConfigError(
                f"http.token: listening on {self.listen!r} reaches beyond this machine, so a "
                "token is required: set http.token_file (or $SPEAKD_HTTP_TOKEN), or listen on "
                "127.0.0.1"
            )

    @property
    def address(self) -> tuple[str, int]:
        """(host, port) of ``listen``; host "" = every interface."""
        host, sep, port = self.listen.rpartition(":")
        if not sep or not port.isdigit() or not 1 <= int(port) <= 65535:
            raise ConfigError(
                f"http.listen: {self.listen!r} is not HOST:PORT (e.g. 127.0.0.1:5500)"
            )
        return host.removeprefix("[").removesuffix("]"), int(port)

    def token_value(self) -> str | None:
        """``token`` (the TOML or $SPEAKD_HTTP_TOKEN), else the first line of ``token_file``."""
        if self.token:
            return self.token
        if not self.token_file:
            return None
        try:
            lines = Path(self.token_file).read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as e:
            raise ConfigError(f"http.token_file: cannot read a token: {e}") from None
        if not lines or not lines[0].strip():
            raise ConfigError(f"http.token_file: {self.token_file} is empty")
        return lines[0].strip()


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # "" (every interface) or a name that may resolve anywhere
        return False


@dataclass(frozen=True)
class SsipConfig:  # key echo from the cache (docs/screen-readers.md), in SSIP's RATE/PITCH units
    prewarm_keys: bool = True
    prewarm_rates: list[int] = field(default_factory=lambda: [0])
    prewarm_pitches: list[int] = field(default_factory=lambda: [10, 50])

    def validate(self) -> None:
        for value in self.prewarm_rates + self.prewarm_pitches:
            in_range("ssip.prewarm_rates/prewarm_pitches", value, -100, 100)
