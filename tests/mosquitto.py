"""A real mosquitto broker for tests (``speakd_tools.soak.mosquitto``: free localhost port, temp
config and persistence dir, restartable), and a recording MQTT 5 client to assert on what the
daemon publishes."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.subscribeoptions import SubscribeOptions

from speakd_tools.soak.mosquitto import MOSQUITTO, Mosquitto, free_port

__all__ = ["MOSQUITTO", "Mosquitto", "Received", "Watcher", "free_port"]


@dataclass(frozen=True)
class Received:
    topic: str
    payload: bytes
    retain: bool  # as published (the subscription asks for Retain As Published)
    correlation: bytes | None
    at: float  # time.monotonic() on arrival

    def json(self) -> Any:
        return json.loads(self.payload)


class Watcher:
    """A paho MQTT 5 client that records every message on some topics, for assertions."""

    def __init__(self, broker: Mosquitto, *topics: str) -> None:
        self.topics = topics
        self.messages: list[Received] = []
        self._cond = threading.Condition()
        self._subscribed = threading.Event()
        self.client = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
        self.client.on_connect = self._on_connect
        self.client.on_subscribe = lambda *_: self._subscribed.set()
        self.client.on_disconnect = lambda *_: self._subscribed.clear()
        self.client.on_message = self._on_message
        self.client.reconnect_delay_set(0.1, 0.5)  # type: ignore[arg-type]
        self.client.connect(broker.host, broker.port)
        self.client.loop_start()
        if not self._subscribed.wait(10):
            raise RuntimeError("test MQTT client did not subscribe")

    def _on_connect(self, client: mqtt.Client, *_: Any) -> None:
        options = SubscribeOptions(qos=1, retainAsPublished=True)
        client.subscribe([(t, options) for t in self.topics])

    def _on_message(self, _client: Any, _userdata: Any, msg: mqtt.MQTTMessage) -> None:
        props = getattr(msg, "properties", None)
        received = Received(
            msg.topic,
            bytes(msg.payload),
            bool(msg.retain),
            getattr(props, "CorrelationData", None),
            time.monotonic(),
        )
        with self._cond:
            self.messages.append(received)
            self._cond.notify_all()

    def publish(
        self,
        topic: str,
        payload: bytes | str,
        *,
        response_topic: str | None = None,
        correlation: bytes | None = None,
        retain: bool = False,
    ) -> float:
        """Publish at QoS 1 and wait for the broker's ack; returns the time it was sent."""
        if not self._subscribed.wait(10):  # (re)connected and subscribed again
            raise RuntimeError("test MQTT client is not connected")
        props = None
        if response_topic is not None or correlation is not None:
            props = Properties(PacketTypes.PUBLISH)
            if response_topic is not None:
                props.ResponseTopic = response_topic
            if correlation is not None:
                props.CorrelationData = correlation
        sent = time.monotonic()
        self.client.publish(
            topic, payload, qos=1, retain=retain, properties=props
        ).wait_for_publish(10)
        return sent

    def mark(self) -> int:
        with self._cond:
            return len(self.messages)

    def matching(
        self, topic: str, pred: Callable[[Received], bool] = lambda m: True, since: int = 0
    ) -> list[Received]:
        with self._cond:
            return [
                m
                for m in self.messages[since:]
                if mqtt.topic_matches_sub(topic, m.topic) and pred(m)
            ]

    def wait(
        self,
        topic: str,
        pred: Callable[[Received], bool] = lambda m: True,
        since: int = 0,
        timeout: float = 30.0,
    ) -> Received:
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                found = self.matching(topic, pred, since)
                if found:
                    return found[0]
                left = deadline - time.monotonic()
                if left <= 0:
                    seen = "\n".join(
                        f"{m.topic} {m.payload[:200]!r}" for m in self.messages[since:]
                    )
                    raise TimeoutError(
                        f"nothing on {topic} matched within {timeout} s; saw:\n{seen}"
                    )
                self._cond.wait(left)

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()
