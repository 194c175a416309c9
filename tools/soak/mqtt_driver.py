"""The soak's MQTT client: Hermes ``hermes/tts/say`` (terminal: ``hermes/tts/sayFinished``) and
speakd's ``speakd/<site>/say`` with an MQTT 5 response topic (terminal: a reply that is not
``queued``), one say at a time like the other front-ends' drivers (tools/soak/traffic.py), and the
bursts the kill faults send.
"""

from __future__ import annotations

import json
import os
import random
import threading
import time
from typing import Any

from .ledger import Request
from .traffic import TIMEOUT_S, Context, pick


class MqttDriver:
    """One MQTT 5 client with a persistent session (replies published while the broker
    restarts are kept for it), and what it heard per request id."""

    def __init__(self, ctx: Context) -> None:
        import paho.mqtt.client as mqtt
        from paho.mqtt.enums import CallbackAPIVersion
        from paho.mqtt.packettypes import PacketTypes
        from paho.mqtt.properties import Properties

        self.ctx = ctx
        self.reply_topic = f"soak/replies/{os.getpid()}"
        self.heard: dict[str, list[str]] = {}  # id → terminal outcomes, in arrival order
        self.redeliveries = 0  # answered "duplicate": the broker's, dropped by the daemon
        self.cond = threading.Condition()
        self._props = lambda: Properties(PacketTypes.PUBLISH)
        connect = Properties(PacketTypes.CONNECT)
        connect.SessionExpiryInterval = 3600
        self.client = mqtt.Client(
            CallbackAPIVersion.VERSION2, client_id=f"soak-{os.getpid()}", protocol=mqtt.MQTTv5
        )
        self.client.on_connect = self._on_connect
        self.client.on_message = self._on_message
        self.client.reconnect_delay_set(0.2, 1)  # type: ignore[arg-type]
        self.client.connect("127.0.0.1", ctx.ep.broker_port, clean_start=False, properties=connect)
        self.client.loop_start()

    def _on_connect(self, client: Any, *_: Any) -> None:
        client.subscribe([("hermes/tts/sayFinished", 1), ("hermes/error/tts", 1),
                          (self.reply_topic, 1)])  # fmt: skip

    def _on_message(self, _c: Any, _u: Any, msg: Any) -> None:
        """A broker's redelivery the daemon drops is answered ``duplicate`` (on the error topic
        and the reply topic alike): counted apart, it is no outcome of the say."""
        try:
            data = json.loads(msg.payload)
        except ValueError:
            return
        with self.cond:
            if msg.topic == "hermes/tts/sayFinished" and str(data.get("id", "")).endswith("-h"):
                self.heard.setdefault(data["id"], []).append("sayFinished")
            elif msg.topic == "hermes/error/tts" and isinstance(data.get("context"), str):
                code = str(data.get("error", "")).split(":")[0]
                if code == "duplicate":
                    self.redeliveries += 1
                else:
                    self.heard.setdefault(data["context"] + "#error", []).append(code)
            elif msg.topic == self.reply_topic and data.get("status") == "duplicate":
                self.redeliveries += 1
            elif msg.topic == self.reply_topic and data.get("status") not in (None, "queued"):
                status = data["status"]
                outcome = data.get("code", "error") if status == "error" else status
                self.heard.setdefault(str(data.get("id")), []).append(outcome)
            self.cond.notify_all()

    def step(self, ctx: Context, rng: random.Random) -> None:
        voice, text = rng.choice(ctx.voices), pick(ctx, rng, "mqtt")
        self._end(self._send(rng.random() < 0.5, voice, text))

    def _send(self, hermes: bool, voice: str, text: str, **fields: Any) -> Request:
        req = self.ctx.ledger.begin("mqtt", "hermes-say" if hermes else "speakd-say",
                                    expect=[(voice, text)])  # fmt: skip
        req.tolerance_s = 0.02
        req.survives_kill = True  # journaled before its PUBACK: spoken after the restart
        payload = {"text": text, "voice": voice, **fields}
        if hermes:
            req.id += "-h"
            topic = "hermes/tts/say"
            payload.update(siteId=self.ctx.ep.site, id=req.id)
            props = None
        else:
            topic = f"speakd/{self.ctx.ep.site}/say"
            payload["id"] = req.id
            props = self._props()
            props.ResponseTopic = self.reply_topic
            props.CorrelationData = req.id.encode()
        req.info = self.client.publish(topic, json.dumps(payload), qos=1, properties=props)
        return req

    def _end(self, req: Request) -> None:
        deadline = time.monotonic() + TIMEOUT_S
        with self.cond:
            while not (got := req.id in self.heard) and time.monotonic() < deadline:
                self.cond.wait(1.0)
            outcomes = list(self.heard.get(req.id, []))
            errors = self.heard.get(req.id + "#error", [])
        if not got:
            req.note = "no sayFinished / reply"
            self.ctx.ledger.end(req, None)
            return
        outcome = (errors[0] if errors else "done") if req.id.endswith("-h") else outcomes[0]
        self.ctx.ledger.end(req, outcome, terminals=len(outcomes))

    def burst(self, n: int, text: str) -> int:
        """``n`` says at once, more than the queue holds (a fault's: the kill lands while they
        wait); returns when the daemon has acknowledged each (PUBACK). Their outcomes are
        awaited on a thread of their own."""
        reqs = [self._send(i % 2 == 0, self.ctx.voices[0], text) for i in range(n)]
        for req in reqs:
            req.info.wait_for_publish(30)
        threading.Thread(target=lambda: [self._end(r) for r in reqs], daemon=True).start()
        return len(reqs)

    def recount(self) -> None:
        """After the run: terminal events that came late, or twice."""
        with self.cond:
            for req in self.ctx.ledger.requests:
                if req.frontend == "mqtt" and req.id in self.heard:
                    req.terminals = len(self.heard[req.id])
                    req.outcome = req.outcome or f"late {self.heard[req.id][0]}"

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()
