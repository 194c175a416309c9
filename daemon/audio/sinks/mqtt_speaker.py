"""Remote speaker: a sink that plays each utterance on a Hermes audio server instead of locally.

The whole utterance goes out as one WAV on ``hermes/audioServer/<site>/playBytes/<id>`` when it
is complete (Hermes has no standard streaming), and ``drain`` waits for the speaker's
``playFinished`` — or the clip's duration plus a margin, like Rhasspy's reference TTS service — so
``finished`` still means "heard". Hermes cannot stop a clip once sent: stop/cancel before the WAV
is out drop it; after that they take effect when the speaker finishes. Like every sink it knows
nothing of requests: it gets an utterance id, PCM, and a function that publishes.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from speakd.audio import AudioChunk, wav_bytes
from speakd.audio.sinks import SinkUnavailable
from speakd.mqtt.messages import Message, PlayBytes

log = logging.getLogger(__name__)


def topic_safe(utterance_id: str) -> str:
    """Request ids come from clients: no MQTT wildcards or level separators in our topics."""
    return "".join("_" if c in "/+#\x00" else c for c in utterance_id)


class RemoteSpeakerSink:
    name = "mqtt-speaker"

    def __init__(
        self, site: str, publish: Callable[[Message], bool], margin_s: float = 1.0
    ) -> None:
        self.site = site
        self.margin_s = margin_s
        self._publish = publish
        self._id = ""
        self._rate = 0
        self._pcm: list[bytes] = []
        self._played = threading.Event()
        self._error = ""

    def begin(self, utterance_id: str, sample_rate: int) -> None:
        self._id, self._rate, self._pcm = topic_safe(utterance_id), sample_rate, []
        self._played = threading.Event()

    def resume(self, utterance_id: str, sample_rate: int) -> None:
        """The part after a pause goes out as a clip of its own."""
        self.begin(utterance_id, sample_rate)

    def write(self, pcm: bytes) -> None:
        self._pcm.append(pcm)

    def interrupt(self) -> None:
        """Nothing to cut short: ``write`` only collects the clip."""

    def drain(self) -> None:
        chunk = AudioChunk(b"".join(self._pcm), self._rate)
        self._pcm = []
        if not self._publish(PlayBytes(self.site, self._id, wav_bytes(chunk))):
            self._error = "not connected to the broker"
            log.warning("remote speaker %s: %s; %s not played", self.site, self._error, self._id)
            raise SinkUnavailable(f"remote speaker {self.site}: {self._error}")
        self._error = ""
        if not self._played.wait(chunk.duration + self.margin_s):
            log.warning(
                "remote speaker %s did not report playFinished for %s within %.1f s",
                self.site,
                self._id,
                chunk.duration + self.margin_s,
            )

    def abort(self) -> None:
        self._pcm = []

    def play_finished(self, request_id: str) -> None:
        """The speaker's ``playFinished`` (any thread)."""
        if request_id == self._id:
            self._played.set()

    def status(self) -> dict[str, Any]:
        return {
            "sink": self.name,
            "speaker_site": self.site,
            "available": not self._error,
            "error": self._error or None,
        }

    def close(self) -> None:
        self._played.set()
