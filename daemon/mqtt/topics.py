"""Every MQTT topic speakd subscribes to or publishes on, and the parsers for the ones it receives.

Hermes and Rhasspy topics are fixed; speakd's own live under ``<prefix>/<site>/…`` (``[mqtt]
prefix``, ``site_id`` and ``site_ids``), and so do the prompt packs ``speakd-tools pack publish``
rolls out.
"""

from __future__ import annotations

from dataclasses import dataclass

HERMES_SAY = "hermes/tts/say"
HERMES_SAY_FINISHED = "hermes/tts/sayFinished"
HERMES_TTS_ERROR = "hermes/error/tts"
RHASSPY_GET_VOICES = "rhasspy/tts/getVoices"
RHASSPY_VOICES = "rhasspy/tts/voices"
HA_STATUS = "status"  # under the discovery prefix: Home Assistant's birth/will topic
COMMANDS = ("say", "stop", "cancel", "voice")


@dataclass(frozen=True)
class SiteTopics:
    """speakd's own topics for one site: ``<prefix>/<site>/{say,stop,cancel,status,availability}``.

    $ mosquitto_pub -q 1 -t speakd/kitchen/say -m '{"text": "Dinner is ready", "id": "d1"}'
    $ mosquitto_pub -q 1 -t speakd/kitchen/stop -n
    $ mosquitto_pub -q 1 -t speakd/kitchen/cancel -m '{"id": "d1"}'
    """

    prefix: str
    site: str

    def command(self, name: str) -> str:
        return f"{self.prefix}/{self.site}/{name}"

    @property
    def status(self) -> str:
        return self.command("status")

    @property
    def availability(self) -> str:
        return self.command("availability")


def parse_command_topic(prefix: str, topic: str) -> tuple[str, str] | None:
    """``speakd/kitchen/say`` → ("kitchen", "say"); None for anything else."""
    if not topic.startswith(f"{prefix}/"):
        return None
    site, _, command = topic[len(prefix) + 1 :].partition("/")
    if not site or command not in COMMANDS:
        return None
    return site, command


def play_bytes_topic(site: str, request_id: str) -> str:
    """Where a Hermes audio server takes a WAV to play; it answers on ``play_finished_topic``."""
    return f"hermes/audioServer/{site}/playBytes/{request_id}"


def play_finished_topic(site: str) -> str:
    """Where a Hermes audio server reports ``{"id": <requestId>}`` after playing."""
    return f"hermes/audioServer/{site}/playFinished"


# ---- prompt packs (speakd_tools.fleet publishes, mqtt/packs.py receives) --------------------


def pack_manifest_topic(prefix: str, site: str) -> str:
    """Where the retained manifest of the pack for every board acting on ``site`` lives."""
    return f"{prefix}/{site}/pack/manifest"


def pack_chunk_topic(prefix: str, site: str, pack_id: str, index: int) -> str:
    """Where chunk ``index`` of a pack lives (retained, QoS 1)."""
    return f"{prefix}/{site}/pack/data/{pack_id}/{index}"


def pack_chunks_filter(prefix: str, site: str, pack_id: str) -> str:
    """The subscription a board makes for one pack's chunks, once it has decided to fetch it."""
    return f"{prefix}/{site}/pack/data/{pack_id}/+"


def parse_pack_topic(prefix: str, topic: str) -> tuple[str, str, int] | None:
    """``speakd/floor2/pack/manifest`` → ("floor2", "", -1); a chunk topic
    ``speakd/floor2/pack/data/<pack id>/7`` → ("floor2", "<pack id>", 7); None otherwise."""
    if not topic.startswith(f"{prefix}/"):
        return None
    parts = topic[len(prefix) + 1 :].split("/")
    if len(parts) == 3 and parts[1:] == ["pack", "manifest"]:
        return parts[0], "", -1
    if len(parts) == 5 and parts[1:3] == ["pack", "data"] and parts[4].isdigit():
        return parts[0], parts[3], int(parts[4])
    return None
