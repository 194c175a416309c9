"""The MQTT client: credentials and TLS for every speakd client, and the daemon's session.

``new_client`` is the one place a paho client gets its credentials and TLS: the daemon's
session, ``speakd doctor`` and ``speakd_tools.fleet`` connect exactly alike.

``Connection`` is the daemon's session: MQTT 5 with the last will (``offline`` on the
availability topic), a persistent session (``clean_start=False`` + Session Expiry) that keeps QoS 1
commands the broker received while we were away, subscriptions renewed on every connect, and
reconnects with backoff. Incoming QoS 1 messages are acknowledged when the owner releases them
(``hold``), not on arrival, and in the order they came: a say is PUBACKed once it is journaled
(``mqtt/journal/``), so one the daemon did not keep is redelivered by the broker on the next
connection. Publishes made while the broker is away
are queued (up to ``MAX_QUEUED``) for the next connection; past that paho refuses them, and a
kept one (a say's outcome) waits in our own queue, in order, until paho takes it: its
``on_acked`` runs only once the broker acknowledged it, never because it was refused.

Threads: paho's network loop runs on its own thread (``loop_start``); ``on_connected`` and
``on_message`` are called there, and the owner hands them on (the front-end to its event loop).
Publishing and subscribing only queue a packet for paho's thread, so callers never wait on the
network.
"""

from __future__ import annotations

import logging
import socket
import threading
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion, MQTTErrorCode
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.subscribeoptions import SubscribeOptions

from speakd.config import ConfigError, MqttConfig
from speakd.mqtt.messages import Message

log = logging.getLogger(__name__)

MAX_QUEUED = 1000  # publishes paho queues while the broker is away; beyond, only kept ones wait
ACKED_WAIT_S = 3.0  # at close: how long the broker gets to acknowledge what waits for it
RECENT_ACKS = 256  # mids remembered (65535 publishes before one comes again)

Subscriptions = list[tuple[str, SubscribeOptions]]


@dataclass(frozen=True)
class _Kept:
    """A publish paho refused (its queue full) that must still reach the broker."""

    message: Message
    properties: Properties | None
    on_acked: Callable[[], None] | None


@dataclass(frozen=True)
class Incoming:
    """A received message, with its MQTT 5 reply address."""

    topic: str
    payload: bytes
    response_topic: str | None
    correlation: bytes | None
    mid: int = 0  # for ``Connection.ack``
    qos: int = 0
    connection: int = 0  # which connection it came on: an ack never goes out on a later one
    dup: bool = False  # the broker re-sends it (its PUBACK never came)


def new_client(config: MqttConfig, client_id: str, manual_ack: bool = False) -> mqtt.Client:
    """A paho MQTT 5 client with the configured credentials and TLS."""
    client = mqtt.Client(
        CallbackAPIVersion.VERSION2,
        client_id=client_id,
        protocol=mqtt.MQTTv5,
        manual_ack=manual_ack,
    )
    if config.username:
        client.username_pw_set(config.username, config.password())
    if config.tls:
        client.tls_set(
            ca_certs=config.ca_file or None,
            certfile=config.cert_file or None,
            keyfile=config.key_file or None,
        )
    return client


class Connection:
    """The daemon's MQTT session (see the module doc); ``subscriptions()`` is asked for the
    topics on every connect."""

    def __init__(
        self,
        config: MqttConfig,
        client_id: str,
        will: Message,
        subscriptions: Callable[[], Subscriptions],
        on_connected: Callable[[], None],
        on_message: Callable[[Incoming], None],
    ) -> None:
        self.config = config
        self.client_id = client_id
        self._subscriptions = subscriptions
        self._on_connected = on_connected
        self._on_incoming = on_message
        self._connected = False
        self._unreachable_logged = False
        self._refused = ""  # the last CONNACK refusal logged
        self._closing = False
        self._connection = 0  # counts connects (see Incoming.connection)
        self._acks: deque[list[Any]] = deque()  # [message, released] in arrival order (hold)
        self._sub_lock = threading.Lock()
        self._pub_lock = threading.Lock()
        self._on_acked: dict[int, Callable[[], None]] = {}  # publish mid → when the broker has it
        self._recent_acks: OrderedDict[int, bool] = OrderedDict()  # acked, nobody waiting (yet)
        self._all_acked = threading.Condition(self._pub_lock)
        # kept publishes paho refused, oldest first; the lock orders them with new ones and is
        # held while calling paho, so paho's thread only ever tries it (``_flush_kept``)
        self._kept: deque[_Kept] = deque()
        self._kept_lock = threading.Lock()
        self._sub_topics: dict[int, list[str]] = {}  # SUBSCRIBE message id → its topics
        self._password = config.password() if config.username else None  # see credentials_changed
        client = new_client(config, client_id, manual_ack=True)
        if log.isEnabledFor(logging.DEBUG):  # paho logs every failed retry as an error
            client.enable_logger(logging.getLogger("speakd.mqtt.paho"))
        client.will_set(will.topic(), will.payload(), qos=1, retain=will.retain)
        client.reconnect_delay_set(config.reconnect_min_s, config.reconnect_max_s)  # type: ignore[arg-type]
        client.max_queued_messages_set(MAX_QUEUED)
        client.on_connect = self._on_connect
        client.on_connect_fail = self._on_connect_fail
        client.on_disconnect = self._on_disconnect
        client.on_subscribe = self._on_subscribe
        client.on_message = self._on_message
        client.on_publish = self._on_publish
        self._client = client

    @property
    def connected(self) -> bool:
        return self._connected

    def credentials_changed(self) -> bool:
        """True when the password file (or $SPEAKD_MQTT_PASSWORD) no longer holds the password
        we connected with: SIGHUP then reconnects with the rotated one."""
        if not self.config.username:
            return False
        try:
            return self.config.password() != self._password
        except ConfigError as e:
            log.error("MQTT: keeping the current connection: %s", e)
            return False

    def start(self) -> None:
        """Connect in the background: a broker that is down now is retried with backoff."""
        c = self.config
        props = Properties(PacketTypes.CONNECT)
        props.SessionExpiryInterval = c.session_expiry_s
        self._client.connect_async(c.host, c.port, c.keepalive, clean_start=False, properties=props)
        self._client.loop_start()
        log.info(
            "MQTT: connecting to %s:%d%s as %s (sites %s)",
            c.host,
            c.port,
            " with TLS" if c.tls else "",
            self.client_id,
            ", ".join(c.sites),
        )

    def close(self, farewell: Message | None = None, wait_s: float = ACKED_WAIT_S) -> None:
        """Publish ``farewell`` (a clean DISCONNECT suppresses the will), then disconnect, once
        the broker has what waits for its acknowledgement (``on_acked``: a say's outcome) or
        ``wait_s`` passed. Blocks until paho's thread has stopped."""
        self._closing = True
        if self._connected:
            with self._all_acked:
                self._all_acked.wait_for(lambda: not self._on_acked and not self._kept, wait_s)
        if self._connected and farewell is not None:
            info = self.publish(farewell)
            try:
                info.wait_for_publish(3.0)
            except (RuntimeError, ValueError) as e:
                log.warning(
                    "MQTT: could not publish to %s before disconnecting: %s", farewell.topic(), e
                )
        self._client.disconnect()
        self._client.loop_stop()

    # ---- paho callbacks (paho's thread) -----------------------------------------------------

    def _on_connect(
        self, client: mqtt.Client, _userdata: Any, flags: Any, reason: Any, _props: Any
    ) -> None:
        if reason.is_failure:
            if str(reason) != self._refused:  # once per reason, not once per retry
                self._refused = str(reason)
                log.error(
                    "MQTT: broker %s:%d refused the connection: %s",
                    self.config.host,
                    self.config.port,
                    reason,
                )
            return
        sock = client.socket()
        try:  # MQTT packets are small: don't let Nagle hold them back (~40 ms stalls)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # type: ignore[union-attr]
        except (OSError, AttributeError):
            log.debug("MQTT: cannot set TCP_NODELAY", exc_info=True)
        self._connection += 1
        self.subscribe(self._subscriptions())
        self._connected = True
        self._unreachable_logged, self._refused = False, ""
        log.info(
            "MQTT: connected to %s:%d (session %s)",
            self.config.host,
            self.config.port,
            "resumed" if flags.session_present else "new",
        )
        self._flush_kept()
        self._on_connected()

    def _on_connect_fail(self, _client: Any, _userdata: Any) -> None:
        if not self._unreachable_logged:  # once per outage, not once per retry
            self._unreachable_logged = True
            log.warning(
                "MQTT: broker %s:%d unreachable; retrying every %.1f..%.1f s",
                self.config.host,
                self.config.port,
                self.config.reconnect_min_s,
                self.config.reconnect_max_s,
            )

    def _on_disconnect(
        self, _client: Any, _userdata: Any, _flags: Any, reason: Any, _props: Any
    ) -> None:
        self._connected = False
        if not self._closing:
            log.warning(
                "MQTT: disconnected (%s); reconnecting within %.1f..%.1f s",
                reason,
                self.config.reconnect_min_s,
                self.config.reconnect_max_s,
            )

    def _on_subscribe(
        self, _client: Any, _userdata: Any, _mid: int, reasons: list[Any], _props: Any
    ) -> None:
        with self._sub_lock:
            topics = self._sub_topics.pop(_mid, [])
        for topic, reason in zip(topics, reasons, strict=False):
            if reason.is_failure:
                log.error("MQTT: broker refused the subscription to %s: %s", topic, reason)

    def _on_message(self, _client: Any, _userdata: Any, msg: mqtt.MQTTMessage) -> None:
        props = getattr(msg, "properties", None)
        self._on_incoming(
            Incoming(
                msg.topic,
                bytes(msg.payload),
                getattr(props, "ResponseTopic", None),
                getattr(props, "CorrelationData", None),
                msg.mid,
                msg.qos,
                self._connection,
                bool(msg.dup),
            )
        )

    # ---- any thread -------------------------------------------------------------------------

    def subscribe(self, subscriptions: Subscriptions) -> None:
        """Subscribe, remembering the topics so a refusal in the SUBACK can name them. Offline,
        nothing is sent: the next connect subscribes to everything anew."""
        with self._sub_lock:
            rc, mid = self._client.subscribe(subscriptions)
            if rc == MQTTErrorCode.MQTT_ERR_SUCCESS and mid is not None:
                self._sub_topics[mid] = [topic for topic, _ in subscriptions]

    def hold(self, incoming: Incoming) -> Callable[[], None]:
        """Take ``incoming``'s place in the PUBACK order: its PUBACK goes out once the returned
        function is called and every earlier message's has gone (MQTT acknowledges in the order
        of the PUBLISHes). Call both from one thread (the front-end's event loop)."""
        slot = [incoming, False]
        self._acks.append(slot)

        def release() -> None:
            slot[1] = True
            while self._acks and self._acks[0][1]:
                self._ack(self._acks.popleft()[0])

        return release

    def _ack(self, incoming: Incoming) -> None:
        """PUBACK a QoS 1 message. One from an earlier connection is not acked: the broker
        redelivers it (with its DUP flag and packet identifier, which the journal knows)."""
        if incoming.qos and incoming.connection == self._connection:
            self._client.ack(incoming.mid, incoming.qos)

    def unsubscribe(self, topics: list[str]) -> None:
        self._client.unsubscribe(topics)

    def publish(
        self,
        message: Message,
        properties: Properties | None = None,
        on_acked: Callable[[], None] | None = None,
        kept: bool = False,
    ) -> Any:
        """Queue a QoS 1 publish; kept for the next connection when the broker is away.
        ``on_acked`` runs (on paho's thread) once the broker acknowledged it. A ``kept`` one
        (any with ``on_acked``) that paho refuses waits in our queue (module doc); another is
        dropped with a warning. Returns paho's MQTTMessageInfo, or None for one that waits."""
        item = _Kept(message, properties, on_acked)
        with self._kept_lock:
            if kept or on_acked is not None:
                if self._kept:  # behind those already waiting: outcomes keep their order
                    self._kept.append(item)
                    return None
                info = self._send(item)
                if info.rc == MQTTErrorCode.MQTT_ERR_QUEUE_SIZE:
                    log.warning(
                        "MQTT: paho's queue is full (%d): the outcome for %s waits for the broker",
                        MAX_QUEUED,
                        message.topic(),
                    )
                    self._kept.append(item)
                    return None
                return info
            info = self._send(item)
        if info.rc == MQTTErrorCode.MQTT_ERR_QUEUE_SIZE:
            log.warning(
                "MQTT: cannot publish to %s: %s", message.topic(), mqtt.error_string(info.rc)
            )
        return info

    def _send(self, item: _Kept) -> Any:
        """Hand ``item`` to paho (with ``_kept_lock`` held); register its ``on_acked`` when
        paho took it (QoS 1: anything but a full queue stays in paho's queue until acked)."""
        m = item.message
        info = self._client.publish(
            m.topic(), m.payload(), qos=1, retain=m.retain, properties=item.properties
        )
        if item.on_acked is not None and info.rc != MQTTErrorCode.MQTT_ERR_QUEUE_SIZE:
            with self._pub_lock:  # never held while calling paho: its thread takes it in turn
                acked = self._recent_acks.pop(info.mid, False)
                if not acked:
                    self._on_acked[info.mid] = item.on_acked
            if acked:
                item.on_acked()
        return info

    def _flush_kept(self) -> None:
        """Hand paho what waits in our queue, as far as its queue takes it (paho's thread, on a
        connect and on each acknowledgement; a publish under way on another thread holds the
        lock and sends its own, so it is only tried: paho may hold its lock while calling us)."""
        if not self._kept or not self._kept_lock.acquire(blocking=False):
            return
        try:
            while self._kept:
                if self._send(self._kept[0]).rc == MQTTErrorCode.MQTT_ERR_QUEUE_SIZE:
                    return
                self._kept.popleft()
        finally:
            self._kept_lock.release()

    def _on_publish(self, _c: Any, _u: Any, mid: int, _reason: Any, _props: Any) -> None:
        with self._all_acked:
            done = self._on_acked.pop(mid, None)
            if done is None:  # perhaps acknowledged before ``publish`` could register it
                self._recent_acks[mid] = True
                while len(self._recent_acks) > RECENT_ACKS:
                    self._recent_acks.popitem(last=False)
            if not self._on_acked and not self._kept:
                self._all_acked.notify_all()
        if done is not None:
            done()
        self._flush_kept()

    def publish_live(self, message: Message) -> bool:
        """Publish only while connected (status and audio are stale by the next connection)."""
        if not self._connected:
            return False
        return self.publish(message).rc == MQTTErrorCode.MQTT_ERR_SUCCESS
