"""MQTT say → first sample at the sink, for a cached clip (or, with --miss, a fresh synthesis).

    mosquitto -p 18830 &                      # any broker; localhost for the target numbers
    speakd-tools bench mqtt --port 18830 [--count 200] [--qos 1] [--miss]

Runs the daemon's real pieces in this process — the embedded VITS voice, the SQLite audio cache
(a temp file), the scheduler and the MQTT front-end — with a sink that timestamps the first PCM it
is handed. A separate client (``speakd.mqtt.client.new_client``, as ``speakd doctor`` and the fleet
tools connect) publishes ``speakd/bench/say`` and waits for ``sayFinished`` before the next say.
Latency = first ``Sink.write`` − the instant before ``publish()``, both
``time.monotonic()``; "in daemon" is the scheduler's own ``started`` latency (request built →
sink). Prints one JSON object. The first say of the text fills the cache and is not counted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import tempfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from speakd.audio.sinks import NullSink
from speakd.mqtt.topics import HERMES_SAY_FINISHED, SiteTopics

from ..harness.stats import loadavg, summary

if TYPE_CHECKING:
    from speakd.config import MqttConfig

TEXT = "The front door is open."


class TimingSink(NullSink):
    """A sink that consumes instantly and remembers when each utterance's first PCM arrived."""

    name = "timing"

    def __init__(self) -> None:
        super().__init__()
        self.first_write: dict[str, float] = {}
        self._id = ""

    def begin(self, utterance_id: str, sample_rate: int) -> None:
        self._id = utterance_id

    def write(self, pcm: bytes) -> None:
        self.first_write.setdefault(self._id, time.monotonic())


class Publisher:
    """The client side: publish a say, wait for its sayFinished."""

    def __init__(self, config: MqttConfig, qos: int, nodelay: bool) -> None:
        from speakd.mqtt.client import new_client

        self.qos, self.nodelay = qos, nodelay
        self.say_topic = SiteTopics(config.prefix, config.site_id).command("say")
        self.finished: dict[str, threading.Event] = {}
        self.client = new_client(config, client_id="")
        subscribed = threading.Event()
        self.client.on_connect = self._on_connect
        self.client.on_subscribe = lambda *_: subscribed.set()
        self.client.on_message = self._on_message
        self.client.connect(config.host, config.port)
        self.client.loop_start()
        if not subscribed.wait(10):
            raise SystemExit(f"cannot subscribe on {config.host}:{config.port}")

    def _on_connect(self, client: Any, *_: Any) -> None:
        if self.nodelay:  # a latency-minded client, like the daemon itself
            client.socket().setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        client.subscribe(HERMES_SAY_FINISHED, qos=1)

    def _on_message(self, _c: Any, _u: Any, msg: Any) -> None:
        event = self.finished.get(json.loads(msg.payload).get("id"))
        if event is not None:
            event.set()

    def say(self, request_id: str, text: str) -> float:
        """Publish and wait until it is finished; returns the publish instant."""
        done = self.finished[request_id] = threading.Event()
        payload = json.dumps({"text": text, "id": request_id})
        sent = time.monotonic()
        self.client.publish(self.say_topic, payload, qos=self.qos)
        if not done.wait(60):
            raise SystemExit(f"no sayFinished for {request_id}")
        return sent

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    from speakd.config import CacheConfig, Config, EngineConfig, MqttConfig
    from speakd.control import Control
    from speakd.engines import load_engine
    from speakd.frontends.mqtt.frontend import MqttFrontend
    from speakd.request.messages import EventType
    from speakd.request.resolver import Resolver
    from speakd.request.scheduler import Scheduler

    tmp = Path(tempfile.mkdtemp(prefix="speakd-bench-mqtt-"))
    config = Config(
        engine=EngineConfig(threads=args.threads),
        cache=CacheConfig(path=str(tmp / "cache.db")),
        mqtt=MqttConfig(
            enabled=True, host=args.host, port=args.port, site_id="bench", discovery=False
        ),
    )
    engine = await asyncio.to_thread(load_engine, config.engine)
    sink = TimingSink()
    scheduler = Scheduler(Resolver.from_config(engine, config.cache), sink, block_ms=50)
    control = Control(scheduler, 5000)
    in_daemon: dict[str, float] = {}

    def on_event(event: Any) -> None:
        if event.type == EventType.STARTED:
            in_daemon[event.request_id] = event.data["latency_ms"]

    control.listen(on_event)
    task = asyncio.create_task(scheduler.run())
    frontend = MqttFrontend(control, config.mqtt)
    await frontend.start()
    for _ in range(1000):
        if frontend.connected:
            break
        await asyncio.sleep(0.01)
    else:
        raise SystemExit(f"no broker at {args.host}:{args.port}")
    publisher = Publisher(config.mqtt, args.qos, not args.client_nagle)

    def bench() -> list[tuple[str, float]]:
        publisher.say("warm", TEXT)  # fills the cache (and warms onnxruntime)
        sent = []
        for i in range(args.count):
            rid = f"b{i}"
            sent.append((rid, publisher.say(rid, f"{TEXT} {i}" if args.miss else TEXT)))
        return sent

    sent = await asyncio.to_thread(bench)
    publisher.close()
    total = [(sink.first_write[rid] - t) * 1000 for rid, t in sent]
    inside = [in_daemon[rid] for rid, _ in sent]
    source_status = scheduler.resolver.status()
    await frontend.close()
    await scheduler.close()
    task.cancel()
    cache = source_status.get("cache") or {}
    return {
        "what": "MQTT say -> first sample at the sink",
        "clip": "fresh synthesis (cache miss)" if args.miss else "cached clip (SQLite hit)",
        "count": args.count,
        "qos": args.qos,
        "client_tcp_nodelay": not args.client_nagle,
        "broker": f"{args.host}:{args.port}",
        "say_to_first_sample_ms": summary(total, digits=2),
        "in_daemon_request_to_sink_ms": summary(inside, digits=2),
        "cache_hits": cache.get("hits"),
        "cache_misses": cache.get("misses"),
        "engine": f"{engine.kind} {engine.bundle_id}",
        "loadavg_1m": loadavg()[0],
        "cpus": os.cpu_count(),
    }


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=1883)
    p.add_argument("--count", type=int, default=200)
    p.add_argument("--qos", type=int, choices=(0, 1), default=1)
    p.add_argument("--threads", type=int, default=2, help="onnxruntime threads")
    p.add_argument(
        "--client-nagle", action="store_true", help="leave Nagle on in the publishing client"
    )
    p.add_argument("--miss", action="store_true", help="a new text each time (no cache hits)")


def run(args: argparse.Namespace) -> int:
    print(json.dumps(asyncio.run(measure(args)), indent=2))
    return 0
