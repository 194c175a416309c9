"""MQTT front-end: Hermes ``hermes/tts/say`` plus speakd's own topics, status and HA discovery.

In (QoS 1; only for our site ids — ``site_id`` and ``site_ids``):
  ``hermes/tts/say``          ``{"text", "siteId"="default", "id"?, "sessionId"?, "lang"?,
                              "volume"?}`` plus speakd's say fields (voice, priority, chime, …)
  ``<prefix>/<site>/say``     the same JSON; the site comes from the topic
  ``<prefix>/<site>/stop``    any payload: stop speaking and drop the queue
  ``<prefix>/<site>/cancel``  empty (the current request) or ``{"id": …}``
  ``rhasspy/tts/getVoices``   ``{"id"?, "siteId"}`` → ``rhasspy/tts/voices``
Out:
  ``hermes/tts/sayFinished``  ``{"id", "siteId", "sessionId"}`` after every say, failed ones too
  ``hermes/error/tts``        ``{"error": "<code>: <message>", "siteId", "context": <say id>, …}``
  ``<prefix>/<site>/status``  retained ``Control.status()`` + version, last_error; re-published
                              on every state change
  ``<prefix>/<site>/availability``  retained ``online``; ``offline`` as will and on shutdown
  ``<prefix>/<site>/pack``    retained progress of prompt packs (``mqtt/packs.py``, which also
                              follows ``<prefix>/<site>/pack/manifest`` for every site of ours)
  MQTT 5 Response Topic       ``{"id", "status": "queued" | "done" | … | "error", …}`` carrying
                              the request's Correlation Data

The wire format, the topics and the session (TLS, reconnect, the last will, the persistent session
that keeps QoS 1 commands while we are away) are the ``speakd.mqtt`` package's; this module only
translates between those messages and Control. Commands are subscribed to with retained messages
never delivered (a retained command would replay forever).

At-least-once, spoken once: says go through ``says.py`` — journaled before their
PUBACK, replayed at start past every queue limit, kept across a clean stop, a broker's redelivery
recognised (``mqtt/journal/``). Every other message is acknowledged once handled, in its turn:
PUBACKs leave in the order the PUBLISHes came (``Connection.hold``).

Threads: every incoming message arrives on paho's network thread and is handed to the asyncio loop
with ``call_soon_threadsafe``, so Control is only touched from the loop, as with the socket
front-ends. Publishing only queues a packet for paho's thread, so the loop never waits on the
network.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from typing import TYPE_CHECKING, Any

from paho.mqtt.subscribeoptions import SubscribeOptions

from speakd import __version__
from speakd.audio.sinks.mqtt_speaker import RemoteSpeakerSink
from speakd.config import FleetConfig, LimitsConfig, MqttConfig
from speakd.control import Control
from speakd.frontends.mqtt.says import Says, origin_of
from speakd.mqtt.client import Connection, Incoming, Subscriptions
from speakd.mqtt.journal import Journal
from speakd.mqtt.messages import (
    Availability,
    Status,
    TtsError,
    Voices,
    decode_object,
    discovery_messages,
    optional_str,
)
from speakd.mqtt.packs import PackReceiver
from speakd.mqtt.topics import (
    COMMANDS,
    HA_STATUS,
    HERMES_SAY,
    RHASSPY_GET_VOICES,
    SiteTopics,
    parse_command_topic,
    play_finished_topic,
)
from speakd.request.messages import Event, EventType, RequestError

if TYPE_CHECKING:  # passed through to the pack receiver (mqtt/packs.py), never used here
    from speakd.cache.versions import PackVersions

log = logging.getLogger(__name__)


class MqttFrontend:
    def __init__(
        self,
        control: Control,
        config: MqttConfig,
        limits: LimitsConfig | None = None,
        fleet: FleetConfig | None = None,
        journal: Journal | None = None,
        versions: PackVersions | None = None,
    ) -> None:
        """``journal``: the daemon's, shared by a reload's successor; without one, says are
        journaled in memory only (not across a restart). ``versions``: the signed pack versions
        in the state directory (``speakd.cache.versions``); without it, in memory."""
        self.control = control
        self.config = config
        self.topics = SiteTopics(config.prefix, config.site_id)
        self.connection = Connection(
            config,
            config.client_id or f"speakd-{config.site_id}",
            Availability(self.topics, online=False),
            self._subscriptions,
            on_connected=lambda: self._call_on_loop(self._on_connected),
            on_message=lambda incoming: self._call_on_loop(self._dispatch, incoming),
        )
        self.speaker = (
            RemoteSpeakerSink(config.remote_speaker, self.connection.publish_live)
            if config.remote_speaker
            else None
        )
        self._loop: asyncio.AbstractEventLoop | None = None
        self.journal = journal or Journal(":memory:")
        self.says = Says(
            control,
            config.max_payload_bytes,
            config.sites,
            config.prefix,
            self.connection,
            self.journal,
            self._call_on_loop,
        )
        self._status_pending = False
        self._discovery_timer: asyncio.TimerHandle | None = None
        self._last_error: dict[str, Any] | None = None  # in the retained status (fleet status)
        self.packs = PackReceiver(
            config,
            control.cache_store,
            control.bundles,
            (limits or LimitsConfig()).max_pack_bytes,
            self.connection.publish,
            self.connection.subscribe,
            self.connection.unsubscribe,
            (fleet or FleetConfig()).trusted_keys,
            self._pack_refused,
            versions,
        )

    def _pack_refused(self, reason: str) -> None:
        """Counted like a refused request (speakd_pack_refusals_total); from the pack worker."""
        if self.control.observer is not None:
            self.control.observer.pack_refused(reason)

    @property
    def connected(self) -> bool:
        return self.connection.connected

    def credentials_changed(self) -> bool:
        """True when the password was rotated since we connected (SIGHUP then reconnects)."""
        return self.connection.credentials_changed()

    # ---- lifecycle --------------------------------------------------------------------------

    async def start(self, replay: bool = False) -> None:
        """Connect in the background: a broker that is down at start-up is retried with backoff.
        ``replay`` (the daemon's start, not a reload): first queue the journal's unfinished says,
        so a broker's re-delivery of one of them is recognised as a duplicate."""
        self._loop = asyncio.get_running_loop()
        self.control.listen(self._on_any_event)
        if replay:
            self.says.replay()
        self.connection.start()

    def hold(self) -> None:
        """The daemon is stopping: says it cuts short stay journaled for the next start."""
        self.says.hold()

    async def close(self, successor: MqttFrontend | None = None) -> None:
        """Publish ``offline`` (a clean DISCONNECT suppresses the will), then disconnect.

        Says whose commit is under way are queued and acknowledged first. Says accepted here
        may still be queued or playing (a reload replaces the front-end mid-utterance): their
        sayFinished and errors go out through ``successor`` from now on, queued by its client
        until it has connected.
        """
        await self.says.flush()
        self.says.close(successor.says if successor is not None else None)
        self.control.unlisten(self._on_any_event)
        if self._discovery_timer is not None:
            self._discovery_timer.cancel()
        if self.speaker is not None:
            self.speaker.close()
        await asyncio.to_thread(self.packs.close)  # an import under way finishes first
        await asyncio.to_thread(self.connection.close, Availability(self.topics, online=False))

    def _call_on_loop(self, func: Any, *args: Any) -> None:
        """From paho's thread: run ``func`` on the event loop."""
        assert self._loop is not None
        try:
            self._loop.call_soon_threadsafe(func, *args)
        except RuntimeError:  # the loop closed under us during shutdown
            log.debug("MQTT: event loop closed, dropping %s", func)

    # ---- subscriptions ----------------------------------------------------------------------

    def _subscription_topics(self) -> list[str]:
        c = self.config
        topics = [HERMES_SAY, RHASSPY_GET_VOICES]
        for site in c.sites:
            topics += [SiteTopics(c.prefix, site).command(name) for name in COMMANDS]
        if c.discovery:
            topics.append(f"{c.discovery_prefix}/{HA_STATUS}")
        if c.remote_speaker:
            topics.append(play_finished_topic(c.remote_speaker))
        return topics

    def _subscriptions(self) -> Subscriptions:
        # Never take retained messages: a retained command would be replayed on every connect.
        options = SubscribeOptions(qos=1, retainHandling=SubscribeOptions.RETAIN_DO_NOT_SEND)
        commands = [(topic, options) for topic in self._subscription_topics()]
        return commands + self.packs.subscriptions()  # packs are state: retained ones wanted

    # ---- dispatch (loop thread) -------------------------------------------------------------

    def _dispatch(self, incoming: Incoming) -> None:
        """Handle, then acknowledge in turn; a say acknowledges itself once journaled."""
        release = self.connection.hold(incoming)
        taken = False
        try:
            taken = self._handle(incoming, release)
        except Exception:  # a bug here must never take the daemon down
            log.exception("MQTT: handling a message on %s failed", incoming.topic)
        finally:
            if not taken:
                release()

    def _handle(self, msg: Incoming, release: Any) -> bool:
        """True when a say took over the message's PUBACK."""
        c = self.config
        if self.packs.receive(msg.topic, msg.payload):
            return False
        if msg.topic == HERMES_SAY:
            self.says.take(msg, None, release)
            return True
        if msg.topic == RHASSPY_GET_VOICES:
            self._get_voices(msg)
        elif c.discovery and msg.topic == f"{c.discovery_prefix}/{HA_STATUS}":
            self._ha_status(msg)
        elif self.speaker is not None and msg.topic == play_finished_topic(c.remote_speaker):
            self._play_finished(msg)
        elif (parsed := parse_command_topic(c.prefix, msg.topic)) and parsed[0] in c.sites:
            site, command = parsed
            if command == "say":
                self.says.take(msg, site, release)
                return True
            if command == "stop":
                self._stop(msg, site)
            elif command == "voice":
                self._set_voice(msg, site)
            else:
                self._cancel(msg, site)
        else:
            log.debug("MQTT: ignoring a message on %s", msg.topic)
        return False

    def _get_voices(self, msg: Incoming) -> None:
        try:
            obj = decode_object(msg.payload, self.config.max_payload_bytes, empty_ok=True)
        except RequestError as e:
            log.info("MQTT: unreadable getVoices: %s", e)
            return
        site_id = optional_str(obj, "siteId") or "default"
        if site_id in self.config.sites:
            voices = [
                {"voiceId": v["name"], "description": v["description"]}
                for v in self.control.voices()
            ]
            self.connection.publish(Voices(voices, optional_str(obj, "id"), site_id))

    def _stop(self, msg: Incoming, site: str) -> None:
        stopped = self.says.stop_committing() + self.control.stop()
        log.info("MQTT: stop on %s (%d requests)", msg.topic, stopped)
        self.says.reply(origin_of(msg, None, site, None), None, "stopped", {"stopped": stopped})

    def _set_voice(self, msg: Incoming, site: str) -> None:
        """The default voice, as Home Assistant's voice ``select`` sends it (the bare name)."""
        name = msg.payload.decode("utf-8", "replace").strip()
        origin = origin_of(msg, None, site, None)
        try:
            self.control.set_default_voice(name)
        except RequestError as e:  # in the retained status, as a failed say's error is
            log.warning("MQTT: %s: %s", msg.topic, e)
            self._last_error = {"id": None, "code": e.code, "message": str(e)}
            self._last_error["at"] = round(time.time(), 3)
            self.says.reply(origin, None, "error", {"code": e.code, "message": str(e)})
        else:
            log.info("MQTT: default voice now %s (%s)", name, msg.topic)
            self.says.reply(origin, None, "voice", {"voice": name})
        self._publish_status()

    def _cancel(self, msg: Incoming, site: str) -> None:
        origin = origin_of(msg, None, site, None)
        try:
            obj = decode_object(msg.payload, self.config.max_payload_bytes, empty_ok=True)
        except RequestError as e:
            self.connection.publish(TtsError(f"{e.code}: {e}", site))
            self.says.reply(origin, None, "error", {"code": e.code, "message": str(e)})
            return
        request_id = optional_str(obj, "id")
        if request_id:
            cancelled = self.says.stop_committing(request_id) + self.control.cancel(request_id)
        else:
            cancelled = self.control.cancel()
        log.info(
            "MQTT: cancel %s on %s (%d requests)", request_id or "current", msg.topic, cancelled
        )
        self.says.reply(origin, request_id, "cancelled", {"cancelled": cancelled})

    def _play_finished(self, msg: Incoming) -> None:
        assert self.speaker is not None
        try:
            request_id = optional_str(
                decode_object(msg.payload, self.config.max_payload_bytes), "id"
            )
        except RequestError as e:
            log.warning("MQTT: unreadable playFinished on %s: %s", msg.topic, e)
            return
        if request_id:
            self.speaker.play_finished(request_id)

    # ---- state: availability, status, discovery ---------------------------------------------

    def _on_connected(self) -> None:
        self.connection.publish(Availability(self.topics, online=True))
        self._publish_status()
        if self.config.discovery:
            self._publish_discovery()

    def _on_any_event(self, event: Event) -> None:
        """Scheduler listener: coalesce a burst of events into one status publish."""
        if event.type == EventType.ERROR:  # whichever front-end the request came from
            self._last_error = {
                "id": event.request_id,
                "code": event.data.get("code"),
                "message": event.data.get("message"),
                "at": round(time.time(), 3),
            }
        if not self._status_pending and self._loop is not None:
            self._status_pending = True
            self._loop.call_soon(self._publish_status)

    def _publish_status(self) -> None:
        self._status_pending = False
        status = {**self.control.status(), "version": __version__, "last_error": self._last_error}
        self.connection.publish_live(Status(self.topics, status))

    def _ha_status(self, msg: Incoming) -> None:
        """Home Assistant (re)started: re-send discovery after a random delay (spreads load)."""
        if msg.payload.strip() != b"online" or self._loop is None:
            return
        if self._discovery_timer is not None:
            self._discovery_timer.cancel()
        delay = random.uniform(0, self.config.discovery_delay_s)
        self._discovery_timer = self._loop.call_later(delay, self._publish_discovery)

    def _publish_discovery(self) -> None:
        self._discovery_timer = None
        voices = [v["name"] for v in self.control.voices()]
        for message in discovery_messages(
            self.config.discovery_prefix, self.topics, __version__, voices
        ):
            self.connection.publish(message)
