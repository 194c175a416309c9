"""SSIP ``CANCEL`` → ``703 CANCELED`` with and without MQTT says journaled at a steady rate, and
what an fsync costs on the disk the journal is on.

    speakd-tools bench journal [--n 100] [--rate 20] [--rounds 2] [--json]

One real daemon (the embedded voice, the realtime null sink, a real mosquitto, the MQTT journal
in the run's folder) and ``bench cancel``'s SSIP client. Each round measures ``--n`` cancels
quiet, then ``--n`` while a publisher sends ``--rate`` QoS 1 says per second: each is accepted
and journaled (its commit, its PUBACK, then its done mark: the journal's whole write path), as
``notification`` priority, so none takes the speaker from the SSIP message being cancelled (a
notification is discarded while anything plays; one that starts in a gap is interrupted by the
next message). Rounds alternate, so both sides see the same machine drift. Every say sent must
come back with a ``sayFinished`` and none with an error, or the run fails. The target: the p99
with says flowing is at most 1.2 × the quiet p99 and at most 10 ms.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from ..harness.daemon import serve
from ..harness.machine import describe
from ..harness.machine import line as machine_line
from ..harness.stats import loadavg, percentile, summary
from .cancel import measure as measure_cancels

SITE = "bench"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--n", type=int, default=100, help="cancels per side and round (100)")
    p.add_argument("--rate", type=float, default=20.0, help="MQTT says per second (20)")
    p.add_argument("--rounds", type=int, default=2, help="quiet/loaded rounds (2)")
    p.add_argument("--block-ms", type=int, default=50, help="audio.block_ms (default 50)")
    p.add_argument("--json", action="store_true", help="print the numbers as JSON")


def fsync_cost(folder: Path, n: int = 200) -> dict[str, float]:
    """ms per 4 KiB write + fsync of one file in ``folder`` (the journal's disk)."""
    path = folder / "fsync-probe"
    times = []
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for i in range(n):
            os.pwrite(fd, os.urandom(4096), (i % 16) * 4096)
            t0 = time.perf_counter()
            os.fsync(fd)
            times.append((time.perf_counter() - t0) * 1000)
    finally:
        os.close(fd)
        path.unlink()
    return summary(times, 3)


class Publisher:
    """QoS 1 says at a steady rate on a thread; counts their sayFinished and errors."""

    def __init__(self, port: int, rate: float) -> None:
        import paho.mqtt.client as mqtt
        from paho.mqtt.enums import CallbackAPIVersion

        self.rate = rate
        self.sent = self.finished = self.errors = 0
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.client = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
        subscribed = threading.Event()
        self.client.on_subscribe = lambda *_: subscribed.set()
        self.client.on_message = self._on_message
        self.client.connect("127.0.0.1", port)
        self.client.loop_start()
        self.client.subscribe([("hermes/tts/sayFinished", 1), ("hermes/error/tts", 1)])
        if not subscribed.wait(10):
            raise RuntimeError("the bench's MQTT client did not subscribe")
        self.thread: threading.Thread | None = None

    def _on_message(self, _c: Any, _u: Any, msg: Any) -> None:
        with self.lock:
            if msg.topic.endswith("sayFinished"):
                self.finished += 1
            else:
                self.errors += 1

    def start(self) -> None:
        self.stop.clear()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        period, next_at = 1 / self.rate, time.monotonic()
        while not self.stop.is_set():
            payload = {"text": "Door open.", "id": f"j{self.sent}", "priority": "notification"}
            self.client.publish(f"speakd/{SITE}/say", json.dumps(payload), qos=1)
            with self.lock:
                self.sent += 1
            next_at += period
            self.stop.wait(max(0.0, next_at - time.monotonic()))

    def halt(self, timeout: float = 30.0) -> None:
        """Stop sending; wait until every say sent has its sayFinished."""
        self.stop.set()
        assert self.thread is not None
        self.thread.join()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                if self.finished >= self.sent:
                    return
            time.sleep(0.05)

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def measure(args: argparse.Namespace) -> dict[str, Any]:
    from speakd_tools.soak.mosquitto import Mosquitto

    result: dict[str, Any] = {"machine": describe(bandwidth=True), "rate": args.rate}
    with tempfile.TemporaryDirectory(prefix="speakd-bench-journal-") as tmp:
        work = Path(tmp)
        broker = Mosquitto(work / "broker", log_types=("error", "information")).start()
        ssip = str(work / "ssip.sock")
        extra = (
            f'[state]\ndir = "{work / "state"}"\n'
            f'[mqtt]\nenabled = true\nhost = "127.0.0.1"\nport = {broker.port}\n'
            f'site_id = "{SITE}"\ndiscovery = false\n'
        )
        audio = f'sink = "null"\nrealtime = true\nblock_ms = {args.block_ms}\n'
        proc, _ = serve(work, audio=audio, ssip_path=ssip, extra=extra)
        publisher = Publisher(broker.port, args.rate)
        quiet: list[float] = []
        loaded: list[float] = []
        try:
            time.sleep(1.0)  # the daemon's MQTT session is up
            measure_cancels(ssip, 5, args.block_ms)  # warm: the sentence is a cache hit
            for _ in range(args.rounds):
                quiet += measure_cancels(ssip, args.n, args.block_ms)
                sent, t0 = publisher.sent, time.monotonic()
                publisher.start()
                loaded += measure_cancels(ssip, args.n, args.block_ms)
                rate = (publisher.sent - sent) / (time.monotonic() - t0)
                publisher.halt()
                result.setdefault("measured_rate_per_s", []).append(round(rate, 1))
            result["fsync_ms"] = fsync_cost(work / "state")
        finally:
            publisher.close()
            proc.terminate()
            proc.wait(30)
            broker.stop()
    result["quiet"], result["loaded"] = summary(quiet, 2), summary(loaded, 2)
    result["says"] = {
        "sent": publisher.sent,
        "finished": publisher.finished,
        "errors": publisher.errors,
    }
    result["loadavg"] = loadavg()
    q99, l99 = percentile(quiet, 99), percentile(loaded, 99)
    result["ratio_p99"] = round(l99 / q99, 2) if q99 else None
    result["ok"] = (
        publisher.errors == 0
        and publisher.finished == publisher.sent > 0
        and l99 <= 1.2 * q99
        and l99 <= 10.0
    )
    return result


def table(r: dict[str, Any]) -> str:
    rows = [
        machine_line(r["machine"]),
        "",
        f"CANCEL → 703 CANCELED, realtime null sink; MQTT says at {r['rate']:g}/s journaled "
        f"(QoS 1, WAL, synchronous=FULL) on the loaded side:",
        "",
        "| side | n | p50 ms | p99 ms | max ms |",
        "|---|---|---|---|---|",
    ]
    for side in ("quiet", "loaded"):
        s = r[side]
        rows.append(f"| {side} | {s['n']} | {s['p50']} | {s['p99']} | {s['max']} |")
    f, says = r["fsync_ms"], r["says"]
    rows += [
        "",
        f"p99 loaded / quiet: {r['ratio_p99']}; says sent {says['sent']} (measured "
        f"{', '.join(map(str, r['measured_rate_per_s']))}/s), sayFinished "
        f"{says['finished']}, errors {says['errors']}",
        f"fsync (4 KiB) on the journal's disk: p50 {f['p50']} ms, p99 {f['p99']} ms, "
        f"max {f['max']} ms",
        f"load average {' '.join(map(str, r['loadavg']))}; "
        f"target (p99 ≤ 1.2 × quiet and ≤ 10 ms, every say finished): "
        f"{'met' if r['ok'] else 'MISSED'}",
    ]
    return "\n".join(rows)
