"""The MQTT messages speakd publishes and parses: one dataclass per message, each with its topic.

Hermes messages (Rhasspy/Snips) use camelCase JSON keys, speakd's own topics snake_case; the
conversion happens once, in ``Message.payload``. The topics themselves are built in ``topics.py``.
Commands arrive as JSON objects and are checked by ``decode_object`` (size, UTF-8, JSON, object)
before ``Control.build_request`` checks the fields.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

from speakd.mqtt.topics import (
    HERMES_SAY_FINISHED,
    HERMES_TTS_ERROR,
    RHASSPY_VOICES,
    SiteTopics,
    pack_chunk_topic,
    pack_chunks_filter,
    pack_manifest_topic,
    play_bytes_topic,
)
from speakd.request.messages import RequestError, dump_json, parse_json


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(p.title() for p in rest)


class Message:
    """Something we publish: topic + JSON payload; ``retain`` is for state only, never commands."""

    retain: ClassVar[bool] = False

    def topic(self) -> str:
        raise NotImplementedError

    def to_dict(self) -> dict[str, Any]:
        raise NotImplementedError

    def payload(self) -> bytes:
        return dump_json(self.to_dict())


class HermesMessage(Message):
    """Hermes JSON: every dataclass field, camelCase keys, nulls kept (as Rhasspy sends them)."""

    def to_dict(self) -> dict[str, Any]:
        return {_camel(f.name): getattr(self, f.name) for f in fields(self)}  # type: ignore[arg-type]


@dataclass(frozen=True)
class SayFinished(HermesMessage):
    """After every say, also failed ones: ``{"id": "d1", "siteId": "kitchen", "sessionId": null}``.

    $ mosquitto_sub -t hermes/tts/sayFinished
    """

    id: str | None
    site_id: str
    session_id: str | None = None

    def topic(self) -> str:
        return HERMES_SAY_FINISHED


@dataclass(frozen=True)
class TtsError(HermesMessage):
    """``{"error": "unknown_voice: …", "siteId": "kitchen", "context": "d1", "sessionId": null}``.

    $ mosquitto_sub -t hermes/error/tts
    """

    error: str
    site_id: str
    context: str | None = None  # the say's id
    session_id: str | None = None

    def topic(self) -> str:
        return HERMES_TTS_ERROR


@dataclass(frozen=True)
class Voices(HermesMessage):
    """Rhasspy's answer to ``rhasspy/tts/getVoices`` ``{"id", "siteId"}``:
    ``{"voices": [{"voiceId": "en_US-joe-medium", "description": "…"}], "id", "siteId"}``.

    $ mosquitto_rr -t rhasspy/tts/getVoices -e rhasspy/tts/voices -m '{"siteId": "kitchen"}'
    """

    voices: list[dict[str, str]]
    id: str | None
    site_id: str

    def topic(self) -> str:
        return RHASSPY_VOICES


@dataclass(frozen=True)
class Reply(Message):
    """MQTT 5 answer on a request's Response Topic, sent with its Correlation Data.

    ``{"id": "r1", "status": "queued", "position": 0}`` then ``{"id": "r1", "status": "done"}``;
    status is a terminal status of the request (done, stopped, cancelled, interrupted, replaced,
    discarded), ``error`` with ``code`` and ``message``, ``warning`` with ``code`` and ``message``
    (a part skipped, the rest spoken; before ``queued``), ``mark``, or ``duplicate`` (already
    received).

    $ mosquitto_rr -t speakd/kitchen/say -e me/reply -q 1 -m '{"text": "hi"}' \\
        -D publish correlation-data req-42 -F '%t %p | %D'
    """

    response_topic: str
    id: str | None
    status: str
    detail: dict[str, Any] = field(default_factory=dict)

    def topic(self) -> str:
        return self.response_topic

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "status": self.status, **self.detail}


@dataclass(frozen=True)
class Status(Message):
    """Retained ``<prefix>/<site>/status``: ``Control.status()`` (state, current, queue, engine…).

    $ mosquitto_sub -t speakd/kitchen/status -C 1
    """

    retain: ClassVar[bool] = True
    topics: SiteTopics
    status: dict[str, Any]

    def topic(self) -> str:
        return self.topics.status

    def to_dict(self) -> dict[str, Any]:
        return self.status


@dataclass(frozen=True)
class Availability(Message):
    """Retained ``online``/``offline`` (plain text, Home Assistant's defaults); the will is offline.

    $ mosquitto_sub -t speakd/kitchen/availability -C 1
    """

    retain: ClassVar[bool] = True
    topics: SiteTopics
    online: bool

    def topic(self) -> str:
        return self.topics.availability

    def payload(self) -> bytes:
        return b"online" if self.online else b"offline"


@dataclass(frozen=True)
class PlayBytes(Message):
    """Remote speaker: a whole WAV file for a Hermes audio server to play; the id is in the topic.

    $ mosquitto_sub -t 'hermes/audioServer/+/playBytes/+' -C 1 > say.wav
    """

    site: str
    request_id: str
    wav: bytes

    def topic(self) -> str:
        return play_bytes_topic(self.site, self.request_id)

    def payload(self) -> bytes:
        return self.wav


# ---- prompt packs (speakd_tools.fleet publishes, mqtt/packs.py receives) --------------------

_HEX = re.compile(r"[0-9a-f]+")


@dataclass(frozen=True)
class PackManifest(Message):
    """Retained ``<prefix>/<site>/pack/manifest``: which pack every board acting on ``site`` should
    hold. ``pack_id`` is the start of the file's sha256, so the same file is the same pack and its
    chunk topics ``<prefix>/<site>/pack/data/<pack_id>/<n>`` (retained, QoS 1) stay put.

    $ mosquitto_sub -t 'speakd/+/pack/manifest' -v -W 2
    """

    retain: ClassVar[bool] = True
    prefix: str
    site: str
    pack_id: str
    sha256: str
    size: int
    clips: int
    bundles: list[str]
    chunk_bytes: int
    chunk_sha256: list[str]
    name: str = ""
    version: int = 0  # signed packs: grows per site, so an older one is refused as a replay
    key: str = ""  # signed packs: the public key (base64), and the signature (speakd.cache.trust)
    signature: str = ""

    def topic(self) -> str:
        return pack_manifest_topic(self.prefix, self.site)

    def chunk_topic(self, index: int) -> str:
        return pack_chunk_topic(self.prefix, self.site, self.pack_id, index)

    def chunks_filter(self) -> str:
        return pack_chunks_filter(self.prefix, self.site, self.pack_id)

    def to_dict(self) -> dict[str, Any]:
        skip = {"prefix", "site"}
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name not in skip}

    @classmethod
    def from_dict(cls, prefix: str, site: str, obj: dict[str, Any]) -> PackManifest:
        """Checked field by field: a board must never subscribe to a topic built from junk."""
        checks: dict[str, type] = {
            "pack_id": str,
            "sha256": str,
            "size": int,
            "clips": int,
            "bundles": list,
            "chunk_bytes": int,
            "chunk_sha256": list,
        }
        for key, typ in checks.items():
            value = obj.get(key)
            if isinstance(value, bool) or not isinstance(value, typ):
                raise ValueError(f"manifest field {key!r} must be {typ.__name__}, got {value!r}")
        optional: dict[str, Any] = {"name": "", "version": 0, "key": "", "signature": ""}
        for key, default in optional.items():
            value = obj.get(key, default)
            if isinstance(value, bool) or not isinstance(value, type(default)):
                raise ValueError(f"manifest field {key!r} must be {type(default).__name__}")
            optional[key] = value
        manifest = cls(prefix, site, **{k: obj[k] for k in checks}, **optional)
        hashes = [manifest.sha256, *manifest.chunk_sha256]
        if not (_HEX.fullmatch(manifest.pack_id) and len(manifest.pack_id) <= 64) or not all(
            isinstance(h, str) and len(h) == 64 and _HEX.fullmatch(h) for h in hashes
        ):
            raise ValueError("manifest pack_id and hashes must be lower-case hex sha256")
        if manifest.size < 0 or manifest.chunk_bytes < 1:
            raise ValueError("manifest size must be >= 0 and chunk_bytes >= 1")
        if len(manifest.chunk_sha256) != -(-manifest.size // manifest.chunk_bytes):
            raise ValueError("manifest chunk_sha256 does not cover size in chunk_bytes chunks")
        if not all(isinstance(b, str) for b in manifest.bundles):
            raise ValueError("manifest bundles must be strings")
        return manifest


@dataclass(frozen=True)
class PackChunk(Message):
    """Retained raw bytes of one chunk: a board that subscribes late still gets them all."""

    retain: ClassVar[bool] = True
    manifest: PackManifest
    index: int
    data: bytes

    def topic(self) -> str:
        return self.manifest.chunk_topic(self.index)

    def payload(self) -> bytes:
        return self.data


@dataclass(frozen=True)
class PackStatus(Message):
    """Retained ``<prefix>/<site>/pack``: ``{"state": "importing" | "ok" | "error", "pack_id",
    "from_site", "reason", "clips", "added", "unpinned", "cache_bytes", "installed": {site:
    pack_id}}``; after an error the packs in ``installed`` are still the ones the board holds.

    $ mosquitto_sub -t 'speakd/+/pack' -v -W 2
    """

    retain: ClassVar[bool] = True
    topics: SiteTopics
    state: str
    pack_id: str | None
    from_site: str | None
    installed: dict[str, str]
    reason: str | None = None
    clips: int | None = None
    added: int | None = None
    unpinned: int | None = None  # clips only the replaced pack held: now left to the LRU
    cache_bytes: int | None = None  # the board's cache after this (fleet status)

    def topic(self) -> str:
        return self.topics.command("pack")

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "topics"}


# ---- parsing ---------------------------------------------------------------------------------


def decode_object(payload: bytes, limit: int, *, empty_ok: bool = False) -> dict[str, Any]:
    """Size, UTF-8, JSON, object: each failure a RequestError naming what was wrong."""
    if len(payload) > limit:
        raise RequestError(
            "payload_too_large", f"payload has {len(payload)} bytes, the limit is {limit}"
        )
    if not payload.strip() and empty_ok:
        return {}
    try:
        text = payload.decode("utf-8")
    except UnicodeDecodeError as e:
        raise RequestError("bad_encoding", f"payload is not valid UTF-8 (byte {e.start})") from None
    obj = parse_json(text)
    if not isinstance(obj, dict):
        raise RequestError("bad_request", "payload must be a JSON object")
    return obj


def say_fields(obj: dict[str, Any]) -> dict[str, Any]:
    """Hermes/speakd say payload → ``Control.build_request`` fields (Hermes keys are camelCase).

    Priority defaults to ``message``: Hermes clients expect every say to be spoken in turn, not
    replaced by the next one as SSIP's default ``text`` would.
    """
    fields_ = {"priority": "message", **obj}
    if "cacheOnly" in fields_:
        fields_["cache_only"] = fields_.pop("cacheOnly")
    return fields_


def optional_str(obj: dict[str, Any], key: str) -> str | None:
    """A Hermes string field that may be absent or null; ids may come as numbers."""
    value = obj.get(key)
    if value is None or isinstance(value, bool):
        return None
    return str(value) if isinstance(value, str | int) else None


# ---- Home Assistant discovery ----------------------------------------------------------------


def object_id(text: str) -> str:
    """Home Assistant object ids allow [a-zA-Z0-9_-] only."""
    return re.sub(r"[^a-zA-Z0-9_-]", "_", text)


@dataclass(frozen=True)
class Discovery(Message):
    """``<discovery_prefix>/<component>/<unique_id>/config`` for one entity (not retained: re-sent
    on every connect and after Home Assistant's birth message, as its docs recommend).

    $ mosquitto_sub -t 'homeassistant/+/+/config' -v
    """

    discovery_prefix: str
    component: str
    config: dict[str, Any]

    def topic(self) -> str:
        return f"{self.discovery_prefix}/{self.component}/{self.config['unique_id']}/config"

    def to_dict(self) -> dict[str, Any]:
        return self.config


def discovery_messages(
    discovery_prefix: str, topics: SiteTopics, version: str, voices: list[str]
) -> list[Discovery]:
    """A notify entity that speaks, a stop button, a state sensor (its attributes list the
    chimes a say may name) and the default voice's select, on one device."""
    base = object_id(f"{topics.prefix}_{topics.site}")
    common = {
        "availability_topic": topics.availability,
        "device": {
            "identifiers": [base],
            "name": f"speakd {topics.site}",
            "manufacturer": "speakd",
            "model": "speakd",
            "sw_version": version,
        },
        "origin": {"name": "speakd", "sw_version": version},
    }
    entities = [
        (
            "notify",
            {
                "name": "Say",
                "unique_id": f"{base}_say",
                "command_topic": topics.command("say"),
                # HA renders the message as `value`; to_json quotes and escapes it.
                "command_template": '{"text": {{ value | to_json }}}',
                "qos": 1,
                "retain": False,
            },
        ),
        (
            "button",
            {
                "name": "Stop speaking",
                "unique_id": f"{base}_stop",
                "command_topic": topics.command("stop"),
                "qos": 1,
                "retain": False,
                "icon": "mdi:stop",
            },
        ),
        (
            "sensor",
            {
                "name": "State",
                "unique_id": f"{base}_state",
                "state_topic": topics.status,
                "value_template": "{{ value_json.state }}",
                "json_attributes_topic": topics.status,
                "json_attributes_template": (
                    '{{ {"current": value_json.current, "queue_length": value_json.queue_length,'
                    ' "chimes": value_json.chimes} | to_json }}'
                ),
                "icon": "mdi:account-voice",
            },
        ),
        (
            "select",
            {
                "name": "Voice",
                "unique_id": f"{base}_voice",
                "command_topic": topics.command("voice"),
                "state_topic": topics.status,
                "value_template": "{{ value_json.voices.default }}",
                "options": voices,
                "qos": 1,
                "retain": False,
                "icon": "mdi:account-voice",
            },
        ),
    ]
    return [
        Discovery(discovery_prefix, component, {**config, **common})
        for component, config in entities
    ]
