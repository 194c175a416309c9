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

At-least-once, spoken once: a QoS 1 say is acknowledged (PUBACK) only after it is written to the
journal (``mqtt/journal.py``), and leaves it at its outcome; the daemon replays what is left when
it starts (``start(replay=True)``). Its ``id`` (else its correlation data) stays in the journal
for a while after, so a QoS 1 re-delivery, across a restart too, is spoken once. Every other
message is acknowledged once handled; a refused say is acknowledged and not journaled.

Threads: every incoming message arrives on paho's network thread and is handed to the asyncio loop
with ``call_soon_threadsafe``, so Control is only touched from the loop, as with the socket
front-ends. Publishing only queues a packet for paho's thread, so the loop never waits on the
network.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import random
import time
import uuid
from dataclasses import dataclass
from typing import Any

from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.subscribeoptions import SubscribeOptions

from speakd import __version__
from speakd.audio.sinks.mqtt_speaker import RemoteSpeakerSink
from speakd.cache.versions import PackVersions
from speakd.config import FleetConfig, LimitsConfig, MqttConfig
from speakd.control import Control
from speakd.mqtt.client import Connection, Incoming, Subscriptions
from speakd.mqtt.journal import Journal, JournalFull
from speakd.mqtt.messages import (
    Availability,
    Reply,
    SayFinished,
    Status,
    TtsError,
    Voices,
    decode_object,
    discovery_messages,
    optional_str,
    say_fields,
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

log = logging.getLogger(__name__)

RETRYABLE = frozenset({"queue_full", "shutting_down"})


def _hex(correlation: bytes | None) -> str | None:
    return correlation.hex() if correlation else None


@dataclass(frozen=True)
class SayOrigin:
    """What a say's outcome is reported against: Hermes ids and the MQTT 5 reply address."""

    hermes_id: str | None
    site_id: str
    session_id: str | None
    response_topic: str | None
    correlation: bytes | None


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
        kept in memory only (not across a crash). ``versions``: the signed pack versions in the
        state directory (``speakd.cache.versions``); without it, in memory."""
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
        self._closing = False
        self._successor: MqttFrontend | None = None  # a reload's replacement (see close)
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
            self._replay()
        self.connection.start()

    def _replay(self) -> None:
        entries = self.journal.pending()
        if entries:
            log.info("MQTT: replaying %d says accepted before the last exit", len(entries))
        for entry in entries:
            parsed = parse_command_topic(self.config.prefix, entry.topic)
            site = parsed[0] if parsed else None
            msg = Incoming(entry.topic, entry.payload, entry.response_topic, entry.correlation)
            self._dispatch(msg, lambda m, e=entry, s=site: self._say(m, s, e.key))

    async def close(self, successor: MqttFrontend | None = None) -> None:
        """Publish ``offline`` (a clean DISCONNECT suppresses the will), then disconnect.

        Says accepted here may still be queued or playing (a reload replaces the front-end
        mid-utterance): their sayFinished and errors go out through ``successor`` from now on,
        queued by its client until it has connected.
        """
        self._successor = successor
        self._closing = True
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

    def _dispatch(self, incoming: Incoming, handle: Any = None) -> None:
        """Handle, then acknowledge: a say is journaled by then (or refused)."""
        try:
            (handle or self._handle)(incoming)
        except Exception:  # a bug here must never take the daemon down
            log.exception("MQTT: handling a message on %s failed", incoming.topic)
        finally:
            self.connection.ack(incoming)

    def _handle(self, msg: Incoming) -> None:
        c = self.config
        if self.packs.receive(msg.topic, msg.payload):
            return
        if msg.topic == HERMES_SAY:
            self._say(msg, None)
        elif msg.topic == RHASSPY_GET_VOICES:
            self._get_voices(msg)
        elif c.discovery and msg.topic == f"{c.discovery_prefix}/{HA_STATUS}":
            self._ha_status(msg)
        elif self.speaker is not None and msg.topic == play_finished_topic(c.remote_speaker):
            self._play_finished(msg)
        elif (parsed := parse_command_topic(c.prefix, msg.topic)) and parsed[0] in c.sites:
            site, command = parsed
            if command == "say":
                self._say(msg, site)
            elif command == "stop":
                self._stop(msg, site)
            elif command == "voice":
                self._set_voice(msg, site)
            else:
                self._cancel(msg, site)
        else:
            log.debug("MQTT: ignoring a message on %s", msg.topic)

    def _say(self, msg: Incoming, site: str | None, replayed: str | None = None) -> None:
        """A say on our own topic (``site``) or on Hermes' (site from the payload); ``replayed``:
        its key, when it comes from the journal."""
        if replayed is not None:  # whatever happens now is its outcome
            self.journal.finish(replayed)
        try:
            obj = decode_object(msg.payload, self.config.max_payload_bytes)
        except RequestError as e:
            self.control.refused(f"mqtt:{msg.topic}", e.code)
            # Unreadable, so we cannot tell whose it is: report it under our own site.
            origin = self._origin(msg, None, site or self.config.site_id, None)
            self._say_failed(origin, None, e)
            return
        site_id = site or optional_str(obj, "siteId") or "default"
        if site_id not in self.config.sites:
            log.debug("MQTT: say for site %r is not ours", site_id)
            return
        origin = self._origin(msg, optional_str(obj, "id"), site_id, optional_str(obj, "sessionId"))
        key = replayed or origin.hermes_id or _hex(msg.correlation)
        if replayed is None and key is not None and self.journal.seen(key):
            log.info("MQTT: say %s on %s is a duplicate; ignored", key, msg.topic)
            if not msg.dup:  # a retrying client hears why; the broker's re-send is not its own
                self._reply(origin, origin.hermes_id, "duplicate")
            return
        key = key or f"anon:{uuid.uuid4().hex}"  # no redelivery can be matched to it
        try:
            request = self.control.build_request(
                say_fields(obj),
                origin=f"mqtt:{msg.topic}",
                client=f"mqtt:{site_id}",
                on_event=functools.partial(self._say_event, origin, key),
            )
            try:  # committed before _dispatch acknowledges it
                self.journal.add(key, msg.topic, msg.payload, msg.response_topic, msg.correlation)
            except JournalFull as e:
                raise RequestError("queue_full", f"MQTT journal full: {e}") from e
        except RequestError as e:  # refused: acknowledged, not journaled
            self._say_failed(origin, None, e)
            return
        self.control.say(request)

    def _origin(
        self, msg: Incoming, hermes_id: str | None, site_id: str, session_id: str | None
    ) -> SayOrigin:
        response = msg.response_topic
        if response is not None and (not response or "+" in response or "#" in response):
            log.warning("MQTT: ignoring the invalid response topic %r", response)
            response = None
        return SayOrigin(hermes_id, site_id, session_id, response, msg.correlation)

    def _say_event(self, origin: SayOrigin, key: str, event: Event) -> None:
        if event.type == EventType.ERROR and event.data["code"] in RETRYABLE:
            self.journal.forget(key)  # the client is told to retry: that is not a duplicate
        elif event.terminal:
            self.journal.finish(key)
        if self._closing:  # our client is gone: the live front-end reports it
            if self._successor is not None:
                self._successor._say_event(origin, key, event)
            elif event.terminal:
                log.info(
                    "MQTT: outcome of say %s (%s) not published: the MQTT front-end was closed",
                    event.request_id,
                    event.type.value,
                )
            return
        if event.type == EventType.QUEUED:
            self._reply(origin, event.request_id, "queued", {"position": event.data["position"]})
        elif event.type in (EventType.MARK, EventType.WARNING):  # a <mark>; a part skipped
            self._reply(origin, event.request_id, event.type.value, event.data)
        elif event.type == EventType.FINISHED:
            self.connection.publish(
                SayFinished(origin.hermes_id, origin.site_id, origin.session_id)
            )
            self._reply(origin, event.request_id, event.data["status"])
        elif event.type == EventType.ERROR:
            error = RequestError(event.data["code"], event.data["message"])
            self._say_failed(origin, event.request_id, error)

    def _say_failed(self, origin: SayOrigin, request_id: str | None, e: RequestError) -> None:
        log.info("MQTT: say %s failed: %s: %s", request_id or origin.hermes_id, e.code, e)
        self.connection.publish(
            TtsError(f"{e.code}: {e}", origin.site_id, origin.hermes_id, origin.session_id)
        )
        self.connection.publish(SayFinished(origin.hermes_id, origin.site_id, origin.session_id))
        self._reply(
            origin, request_id or origin.hermes_id, "error", {"code": e.code, "message": str(e)}
        )

    def _reply(
        self,
        origin: SayOrigin,
        request_id: str | None,
        status: str,
        detail: dict[str, Any] | None = None,
    ) -> None:
        if origin.response_topic is None:
            return
        props = Properties(PacketTypes.PUBLISH)
        if origin.correlation is not None:
            props.CorrelationData = origin.correlation
        self.connection.publish(
            Reply(origin.response_topic, request_id, status, detail or {}), props
        )

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
        stopped = self.control.stop()
        log.info("MQTT: stop on %s (%d requests)", msg.topic, stopped)
        origin = self._origin(msg, None, site, None)
        self._reply(origin, None, "stopped", {"stopped": stopped})

    def _set_voice(self, msg: Incoming, site: str) -> None:
        """The default voice, as Home Assistant's voice ``select`` sends it (the bare name)."""
        name = msg.payload.decode("utf-8", "replace").strip()
        origin = self._origin(msg, None, site, None)
        try:
            self.control.set_default_voice(name)
        except RequestError as e:  # in the retained status, as a failed say's error is
            log.warning("MQTT: %s: %s", msg.topic, e)
            self._last_error = {"id": None, "code": e.code, "message": str(e)}
            self._last_error["at"] = round(time.time(), 3)
            self._reply(origin, None, "error", {"code": e.code, "message": str(e)})
        else:
            log.info("MQTT: default voice now %s (%s)", name, msg.topic)
            self._reply(origin, None, "voice", {"voice": name})
        self._publish_status()

    def _cancel(self, msg: Incoming, site: str) -> None:
        origin = self._origin(msg, None, site, None)
        try:
            obj = decode_object(msg.payload, self.config.max_payload_bytes, empty_ok=True)
        except RequestError as e:
            self.connection.publish(TtsError(f"{e.code}: {e}", site))
            self._reply(origin, None, "error", {"code": e.code, "message": str(e)})
            return
        request_id = optional_str(obj, "id")
        cancelled = self.control.cancel(request_id) if request_id else self.control.cancel()
        log.info(
            "MQTT: cancel %s on %s (%d requests)", request_id or "current", msg.topic, cancelled
        )
        self._reply(origin, request_id, "cancelled", {"cancelled": cancelled})

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
