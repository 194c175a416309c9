"""One blocking MQTT session for a host command, set up like the daemon's own client.

The broker URL (``mqtt://[user@]host[:port]``, ``mqtts://`` for TLS) becomes an ``MqttConfig``,
so TLS, the CA file and credentials (the password from ``$SPEAKD_MQTT_PASSWORD``, never the
command line) go through ``speakd.mqtt.client.new_client`` exactly as on a board.
"""

from __future__ import annotations

import os
import queue
import threading
import time
import uuid
from typing import Any
from urllib.parse import urlparse

import paho.mqtt.client as mqtt
from paho.mqtt.enums import MQTTErrorCode
from paho.mqtt.subscribeoptions import SubscribeOptions

from speakd.config import MqttConfig
from speakd.mqtt.client import new_client
from speakd.mqtt.messages import Message


class BrokerError(Exception):
    """The broker could not be reached or did not answer in time; the message says which."""


def broker_config(url: str, ca_file: str = "") -> MqttConfig:
    """``mqtt://user@host:1883`` or ``mqtts://host`` (port 8883) → the daemon's MQTT settings."""
    parsed = urlparse(url if "://" in url else f"mqtt://{url}")
    if parsed.scheme not in ("mqtt", "mqtts") or not parsed.hostname:
        raise ValueError(f"--broker: {url!r} is not mqtt://HOST[:PORT] or mqtts://HOST[:PORT]")
    tls = parsed.scheme == "mqtts"
    try:
        port = parsed.port or (8883 if tls else 1883)
    except ValueError:
        raise ValueError(f"--broker: {url!r} has a bad port") from None
    return MqttConfig(
        enabled=True,
        host=parsed.hostname,
        port=port,
        username=parsed.username or "",
        tls=tls,
        ca_file=ca_file,
    )


class Session:
    """A connected paho client whose network loop runs on paho's thread; the methods block."""

    def __init__(self, config: MqttConfig, timeout: float = 30.0) -> None:
        self.timeout = timeout
        self.client_id = f"speakd-tools-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.probe_topic = f"speakd-tools/{self.client_id}/probe"
        self._connected = threading.Event()
        self._refused: str | None = None
        self._subacks: dict[int, list[Any]] = {}
        self._subacked = threading.Condition()
        self._inbox: queue.Queue[mqtt.MQTTMessage] = queue.Queue()
        self.client = new_client(config, self.client_id)
        self.client.on_connect = self._on_connect
        self.client.on_subscribe = self._on_subscribe
        self.client.on_message = lambda _c, _u, msg: self._inbox.put(msg)
        where = f"{config.host}:{config.port}"
        try:
            self.client.connect(config.host, config.port, keepalive=30)
        except OSError as e:
            raise BrokerError(f"cannot connect to {where}: {e}") from None
        self.client.loop_start()
        if not self._connected.wait(timeout) or self._refused:
            self.close()
            raise BrokerError(f"{where} refused the connection: {self._refused or 'no CONNACK'}")

    def _on_connect(self, _c: Any, _u: Any, _flags: Any, reason: Any, _props: Any) -> None:
        if reason.is_failure:
            self._refused = str(reason)
        self._connected.set()

    def _on_subscribe(self, _c: Any, _u: Any, mid: int, reasons: list[Any], _p: Any) -> None:
        with self._subacked:
            self._subacks[mid] = reasons
            self._subacked.notify_all()

    def retained(self, filters: list[str]) -> list[mqtt.MQTTMessage]:
        """The retained messages on ``filters`` right now.

        Subscribe, then publish a probe to ourselves and read until it comes back: a broker
        handles one client's packets in order and sends the retained messages of a subscription
        before it handles our next publish, so nothing retained arrives after the probe
        (mosquitto does; docs/fleet.md says what to check with other brokers).
        """
        wanted = SubscribeOptions(qos=1, retainHandling=SubscribeOptions.RETAIN_SEND_ON_SUBSCRIBE)
        rc, mid = self.client.subscribe([(t, wanted) for t in [*filters, self.probe_topic]])
        if rc != MQTTErrorCode.MQTT_ERR_SUCCESS:
            raise BrokerError(f"cannot subscribe: {mqtt.error_string(rc)}")
        with self._subacked:
            if not self._subacked.wait_for(lambda: mid in self._subacks, self.timeout):
                raise BrokerError(f"no SUBACK for {', '.join(filters)}")
            reasons = self._subacks.pop(mid)
        refused = [f for f, r in zip(filters, reasons, strict=False) if r.is_failure]
        if refused:
            raise BrokerError(f"the broker refused the subscription to {', '.join(refused)}")
        self.wait(self.client.publish(self.probe_topic, b"", qos=1), self.probe_topic)
        found: list[mqtt.MQTTMessage] = []
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                msg = self._inbox.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise BrokerError("the probe message did not come back") from None
            if msg.topic == self.probe_topic:
                break
            if msg.retain:
                found.append(msg)
        self.client.unsubscribe([*filters, self.probe_topic])
        return found

    def publish(self, message: Message) -> mqtt.MQTTMessageInfo:
        """Queue a QoS 1 publish; ``wait`` for its PUBACK."""
        info = self.client.publish(message.topic(), message.payload(), qos=1, retain=message.retain)
        if info.rc != MQTTErrorCode.MQTT_ERR_SUCCESS:
            raise BrokerError(f"cannot publish to {message.topic()}: {mqtt.error_string(info.rc)}")
        return info

    def wait(self, info: mqtt.MQTTMessageInfo, topic: str) -> None:
        try:
            info.wait_for_publish(self.timeout)
        except (RuntimeError, ValueError) as e:
            raise BrokerError(f"publishing to {topic} failed: {e}") from None
        if not info.is_published():
            raise BrokerError(f"the broker did not acknowledge {topic} within {self.timeout} s")

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
