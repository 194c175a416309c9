"""speakd's configuration: one TOML file, every key defaulted and validated at start-up.

Errors name the key (``mqtt.port: expected an integer…``). Environment variables
``SPEAKD_<SECTION>_<KEY>`` override the file, for containers and systemd drop-ins.
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
import os
import tomllib
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, get_args, get_origin, get_type_hints
from urllib.parse import urlparse

from speakd.machine.npu import ACCELERATORS
from speakd.paths import cache_dir, data_dir, runtime_dir, state_dir

DEFAULT_CONFIG_PATH = Path("/etc/speakd/speakd.toml")
# The engine kinds a file may name (engine.kind), as data: speakd.engines.registry says what each
# one is and how to load it, under these names (tests/test_config.py holds the two together).
# The registry imports this module's EngineConfig; this module never imports the registry.
ENGINE_KINDS = ("vits", "chattts")
DEFAULT_LUFS = -20.0  # audio.loudness_lufs: a broadcast-style level (EBU R 128 is -23)
ENV_PREFIX = "SPEAKD_"


class ConfigError(ValueError):
    """A config value is wrong; the message starts with the dotted key."""


@dataclass(frozen=True)
class EngineConfig:
    kind: str = "vits"  # "vits" (embedded default voice) | "chattts"
    bundle: str = ""  # path to a bundle; empty = the embedded default voice
    # "int8": load <bundle>-int8 instead when that calibrated sibling exists (the default that
    # ships); "exact": load exactly `bundle` (speakd.engines.resolve_bundle)
    precision: str = "int8"
    voice: str = "default"
    threads: int = 2  # onnxruntime intra-op threads (= cores on a Pi-class board)
    # ChatTTS: decode rows sharing one step (sentences of a request and concurrent requests,
    # docs/chattts-engine.md); 1 = one sentence at a time. Each row's KV slot costs memory.
    batch_size: int = 4
    # ChatTTS batching favours the sentence being played so it never runs dry (batch_scheduler.py,
    # "Pacing"); off = every row steps every time (throughput only: precompute)
    paced: bool = True
    # Degradation: a failing, hung or too slow engine opens a circuit breaker; while it is open
    # (and for requests the engine failed) the fallback prompt plays instead of silence.
    fallback_text: str = "Sorry, I cannot say that right now."
    hang_timeout_s: float = 30.0  # no audio for this long = the engine hung
    max_rtf: float = 3.0  # slower than this (compute s per audio s) counts as a failure
    breaker_failures: int = 3  # consecutive failures that open the breaker
    breaker_reset_s: float = 30.0  # how long it stays open before one trial request
    # A Rockchip NPU (docs/boards.md, "The RK3588's NPU"): "cpu" runs every graph on the CPU;
    # "rknn" and "auto" run the [engine] bundle's .rknn graphs (speakd-tools rknn convert) on the
    # NPU when its driver, librknnrt.so and rknn-toolkit-lite2 are there, else the CPU, saying why
    # in one line (a warning for "rknn"). NPU audio is another precision: its own bundle id.
    accelerator: str = "cpu"
    trace_parts: bool = False  # log each synthesis' parts in ms (speakd.engines.spans)

    def validate(self) -> None:
        _choice("engine.kind", self.kind, ENGINE_KINDS)
        _choice("engine.precision", self.precision, ("int8", "exact"))
        _choice("engine.accelerator", self.accelerator, ACCELERATORS)
        if self.kind == "chattts" and not self.bundle:
            raise ConfigError("engine.bundle: kind 'chattts' needs a bundle path")
        _range("engine.threads", self.threads, 1, 64)
        _range("engine.batch_size", self.batch_size, 1, 32)
        _range("engine.hang_timeout_s", self.hang_timeout_s, 0.5, 3600)
        _range("engine.max_rtf", self.max_rtf, 0.1, 1000)
        _range("engine.breaker_failures", self.breaker_failures, 1, 1000)
        _range("engine.breaker_reset_s", self.breaker_reset_s, 0.1, 86400)


@dataclass(frozen=True)
class VoicesConfig:
    """Every voice the board has (docs/models.md): the embedded one, [engine]'s, and a folder of
    Piper voices and bundles, loaded when first used."""

    dir: str = field(default_factory=lambda: str(data_dir() / "voices"))
    embedded: bool = True  # the embedded Piper voice is one of them
    default: str = ""  # the voice a request without voice or lang gets; empty = engine.voice
    default_speaker: str = ""  # that voice's speaker for a request naming none; empty = its first
    by_lang: dict[str, str] = field(default_factory=dict)  # lang = "voice name"
    preload: list[str] = field(default_factory=list)  # voices loaded at start, not on first use

    def validate(self) -> None:
        for lang, voice in self.by_lang.items():
            if not lang.strip() or not voice:
                raise ConfigError(
                    f"voices.by_lang: {lang!r} = {voice!r} needs a language and a voice"
                )


@dataclass(frozen=True)
class LexiconConfig:
    """Pronunciation lexicons, one TOML file per language (docs/ssml.md, "Lexicons")."""

    files: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class AudioConfig:
    sink: str = "sounddevice"  # "sounddevice" | "wav" | "null"
    device: str = ""  # sounddevice device name or index; empty = system default
    wav_dir: str = ""  # where sink = "wav" writes <request id>.wav
    volume: float = 1.0  # default gain; a request's volume multiplies it
    block_ms: int = 50  # playback granularity: a pause lands between blocks (a stop does not wait)
    realtime: bool = False  # pace the wav/null sinks like a device (soak tests, emulation)
    tail_ms: int = 200  # silence played after the last sample, before the device drains
    sentence_silence_ms: int = 0  # silence between sentences (voices with sentence_silence)
    loudness_lufs: float = DEFAULT_LUFS  # every voice's integrated loudness; 0 = as made

    @property
    def loudness(self) -> float | None:
        """The loudness target, None when off."""
        return self.loudness_lufs or None

    def validate(self) -> None:
        _choice("audio.sink", self.sink, ("sounddevice", "wav", "null"))
        if self.sink == "wav" and not self.wav_dir:
            raise ConfigError("audio.wav_dir: sink 'wav' needs a directory")
        _range("audio.volume", self.volume, 0.0, 4.0)
        _range("audio.block_ms", self.block_ms, 5, 1000)
        _range("audio.tail_ms", self.tail_ms, 0, 5000)
        _range("audio.sentence_silence_ms", self.sentence_silence_ms, 0, 10000)
        _range("audio.loudness_lufs", self.loudness_lufs, -70.0, 0.0)


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
class LimitsConfig:
    max_text_chars: int = 5000
    max_queue: int = 32
    max_line_bytes: int = 65536  # one JSON line / SSIP line on the sockets
    # Callers that take the audio back (socket synth, Wyoming, HTTP) streaming at once; one more
    # waits its turn (playback on the board has its own queue, max_queue)...
    max_streams: int = 4
    # ...for up to this many seconds, then is refused with "busy" (0: refused at once).
    stream_wait_s: float = 30.0
    # Exit (for systemd to restart speakd) when resident memory passes this many MiB; 0 = off.
    # For kernels where MemoryMax= does nothing (Raspberry Pi kernels disable the memory cgroup).
    max_rss_mb: int = 0
    # A prompt pack rolled out over MQTT (mqtt/packs.py) larger than this is refused
    # before a byte of it is fetched; it is written to disk beside the cache, then imported.
    max_pack_bytes: int = 67_108_864
    # Voices loaded at once (0 = no limit) and their resident bytes (0 = no limit): past either,
    # the least recently used idle voice is unloaded (a voice mid-synthesis never is).
    max_loaded_voices: int = 0
    max_voice_bytes: int = 0

    def validate(self) -> None:
        _range("limits.max_text_chars", self.max_text_chars, 1, 1_000_000)
        _range("limits.max_queue", self.max_queue, 1, 100_000)
        _range("limits.max_line_bytes", self.max_line_bytes, 1024, 16 * 1024 * 1024)
        _range("limits.max_streams", self.max_streams, 1, 1024)
        _range("limits.stream_wait_s", self.stream_wait_s, 0, 3600)
        _range("limits.max_rss_mb", self.max_rss_mb, 0, 1 << 20)
        _range("limits.max_pack_bytes", self.max_pack_bytes, 0, 1 << 40)
        _range("limits.max_loaded_voices", self.max_loaded_voices, 0, 1000)
        _range("limits.max_voice_bytes", self.max_voice_bytes, 0, 1 << 40)


SHIPPED_PACK = "/usr/share/speakd/key-echo.db"  # the Debian package's key-echo pack


@dataclass(frozen=True)
class CacheConfig:
    enabled: bool = True
    path: str = field(default_factory=lambda: str(cache_dir() / "cache.db"))
    max_bytes: int = 268_435_456
    ttl_s: int = 604_800
    ttl_jitter: float = 0.1  # fraction of ttl_s, random per entry
    prewarm_bytes: int = 67_108_864  # pinned clips held in RAM
    stale_while_revalidate: bool = False  # play an expired clip at once, re-synthesise behind
    shipped_pack: str = SHIPPED_PACK  # read-only clips consulted after the cache; "" = none

    def validate(self) -> None:
        _range("cache.max_bytes", self.max_bytes, 0, 1 << 40)
        _range("cache.ttl_s", self.ttl_s, 0, 10 * 365 * 86400)
        _range("cache.ttl_jitter", self.ttl_jitter, 0.0, 1.0)
        _range("cache.prewarm_bytes", self.prewarm_bytes, 0, 1 << 40)


@dataclass(frozen=True)
class StateConfig:
    """What must survive a cache wipe (docs/configuration.md, "[state]")."""

    dir: str = field(default_factory=lambda: str(state_dir()))


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
        _range("mqtt.port", self.port, 1, 65535)
        _range("mqtt.keepalive", self.keepalive, 5, 3600)
        _range("mqtt.session_expiry_s", self.session_expiry_s, 0, 0xFFFFFFFF)
        _range("mqtt.reconnect_min_s", self.reconnect_min_s, 0.05, 3600)
        _range("mqtt.reconnect_max_s", self.reconnect_max_s, self.reconnect_min_s, 3600)
        _range("mqtt.max_payload_bytes", self.max_payload_bytes, 256, 16 * 1024 * 1024)
        _range("mqtt.discovery_delay_s", self.discovery_delay_s, 0.0, 60.0)
        for key in ("site_id", "prefix", "discovery_prefix"):
            _topic_level(f"mqtt.{key}", getattr(self, key), allow_slash=key != "site_id")
        for i, site in enumerate(self.site_ids):
            _topic_level(f"mqtt.site_ids[{i}]", site)
        if self.remote_speaker:
            _topic_level("mqtt.remote_speaker", self.remote_speaker)
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
        _range("wyoming.sentence_hold_ms", self.sentence_hold_ms, 0, 10_000)
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
        _range("http.max_body_bytes", self.max_body_bytes, 1024, 16 * 1024 * 1024)
        _range("http.timeout_s", self.timeout_s, 0.1, 3600)
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
            _range("ssip.prewarm_rates/prewarm_pitches", value, -100, 100)


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


def _choice(key: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ConfigError(f"{key}: {value!r} is not one of {', '.join(allowed)}")


def _range(key: str, value: float, lo: float, hi: float) -> None:
    if not lo <= value <= hi:
        raise ConfigError(f"{key}: {value!r} is outside {lo}..{hi}")


def _topic_level(key: str, value: str, allow_slash: bool = False) -> None:
    """MQTT topic parts we build topics from: no wildcards, no empty levels."""
    bad = "+#\x00" if allow_slash else "+#/\x00"
    if not value or any(c in value for c in bad) or "//" in value or value.strip("/") != value:
        raise ConfigError(f"{key}: {value!r} is not usable in an MQTT topic")


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
