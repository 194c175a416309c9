"""A pack rollout to N simulated boards on one real mosquitto (loopback), signed and verified.

Each simulated board is the board's real pack code (``speakd.mqtt.packs.PackReceiver``: signature
check, chunk checks, the import into SQLite with the pin bookkeeping) with its own paho MQTT 5
client (persistent session, as a board's) and its own cache file; a hundred run in each worker
process (``--per-process``), not N daemons. mosquitto runs from a temporary folder on a free
loopback port.

Two rollouts: the first to every board connected and idle; the second with a third of the boards
disconnecting once a tenth of the fleet has the pack and reconnecting together (a storm: they
resume from their persistent sessions, mid-fetch or done). Printed per rollout: seconds from the
start of the publish until 50 %, 99 % and 100 % of boards hold the pack, the broker's peak RSS
(sampled from /proc every 50 ms), its CPU time and the bytes it sent ($SYS/broker/bytes/sent).

  speakd-tools bench fleet --boards 1000
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import multiprocessing
import os
import random
import resource
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from multiprocessing.queues import Queue
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from speakd.cache.store import CacheStore, Clip
from speakd.cache.trust import Trust, encode_public
from speakd.cache.versions import PackVersions
from speakd.config import MqttConfig
from speakd.mqtt.client import new_client
from speakd.mqtt.messages import Message, PackStatus
from speakd.mqtt.packs import PackReceiver
from speakd_tools.fleet.broker import Session
from speakd_tools.fleet.publish import publish_pack, read_pack, sign_manifest
from speakd_tools.soak.mosquitto import Mosquitto

from ..harness.machine import cpu
from ..harness.stats import loadavg

BUNDLE = "bench-fleet-1"
GROUP = "fleet"  # every simulated board acts on this site, as boards on a group


@dataclass
class Outcomes:
    """When each board reported ``ok`` (or a refusal) for each pack, by monotonic time."""

    cond: threading.Condition = field(default_factory=threading.Condition)
    ok: dict[str, dict[int, float]] = field(default_factory=dict)
    errors: dict[str, dict[int, str]] = field(default_factory=dict)

    def record(self, board: int, pack_id: str, state: str, reason: str, at: float) -> None:
        """A board's ``ok`` or ``error`` (``SimBoard``'s report, maybe from another process)."""
        with self.cond:
            if state == "ok":
                self.ok.setdefault(pack_id, {}).setdefault(board, at)
            else:
                self.errors.setdefault(pack_id, {})[board] = reason
            self.cond.notify_all()

    def wait(self, pack_id: str, count: int, timeout: float) -> bool:
        """True when ``count`` boards hold ``pack_id`` (or refused it) within ``timeout``."""

        def settled() -> bool:
            done = self.ok.get(pack_id, {}).keys() | self.errors.get(pack_id, {}).keys()
            return len(done) >= count

        with self.cond:
            return self.cond.wait_for(settled, timeout)


class SimBoard:
    """One board: a PackReceiver on its own client and its own cache file."""

    def __init__(
        self,
        index: int,
        broker: tuple[str, int],
        work: Path,
        trust: Trust,
        report: Callable[[int, str, str, str, float], None],
        sites: list[str] | None = None,
        name: str = "board",
    ) -> None:
        self.index = index
        self.site = f"{name}-{index:04d}"
        self.config = MqttConfig(
            enabled=True,
            host=broker[0],
            port=broker[1],
            site_id=self.site,
            site_ids=[GROUP] if sites is None else sites,
            max_payload_bytes=1 << 20,
        )
        # a folder each: a board's part file goes beside its cache, named by the pack
        self.store = CacheStore(work / self.site / "cache.db", max_bytes=1 << 30)
        self.subscribed = threading.Event()
        self._report = report
        self.refusals: Counter[str] = Counter()  # reason → count, as speakd_pack_refusals_total
        self.client = new_client(self.config, f"sim-{self.site}")
        self.client.on_connect = self._on_connect
        self.client.on_subscribe = lambda *_a: self.subscribed.set()
        self.client.on_message = lambda _c, _u, m: self.receiver.receive(m.topic, bytes(m.payload))
        self.receiver = PackReceiver(
            self.config,
            lambda: self.store,
            lambda: {BUNDLE},
            64 << 20,
            self._publish,
            lambda subs: self.client.subscribe(subs),
            lambda topics: self.client.unsubscribe(topics),
            trust.keys,
            lambda reason: self.refusals.update([reason]),
            PackVersions.in_state_dir(work / self.site / "state"),  # beside its cache, not in it
        )

    def connect(self) -> None:
        props = Properties(PacketTypes.CONNECT)
        props.SessionExpiryInterval = 3600
        self.client.connect_async(
            self.config.host, self.config.port, 60, clean_start=False, properties=props
        )
        self.client.loop_start()

    def disconnect(self) -> None:
        """Gone for a moment: the broker keeps the session (subscriptions, queued chunks)."""
        self.subscribed.clear()
        self.client.disconnect()
        self.client.loop_stop()

    def reconnect(self) -> None:
        self.client.reconnect()
        self.client.loop_start()

    def _on_connect(self, client: mqtt.Client, *_a: Any) -> None:
        client.subscribe(self.receiver.subscriptions())

    def _publish(self, message: Message) -> None:
        if isinstance(message, PackStatus) and message.pack_id and message.state != "importing":
            self._report(
                self.index, message.pack_id, message.state, str(message.reason), time.monotonic()
            )
        self.client.publish(message.topic(), message.payload(), qos=1, retain=message.retain)

    def pinned(self) -> set[str]:
        return {c.key for c in self.store.clips(pinned_only=True)}

    def close(self) -> None:
        self.receiver.close()
        self.client.disconnect()
        self.client.loop_stop()
        self.store.close()


class BrokerWatch:
    """The broker's peak RSS (from /proc, every 50 ms) and its $SYS bytes sent."""

    def __init__(self, broker: Mosquitto) -> None:
        assert broker.proc is not None
        self.pid = broker.proc.pid
        self.peak_kb = 0
        self._stop = threading.Event()
        self._cond = threading.Condition()
        self._sent: tuple[int, float] | None = None  # (bytes, arrival)
        self.client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
        self.client.on_connect = lambda c, *_a: c.subscribe("$SYS/broker/bytes/sent")
        self.client.on_message = self._on_sys
        self.client.connect(broker.host, broker.port)
        self.client.loop_start()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _on_sys(self, _c: Any, _u: Any, msg: mqtt.MQTTMessage) -> None:
        with self._cond:
            self._sent = (int(msg.payload), time.monotonic())
            self._cond.notify_all()

    def _sample(self) -> None:
        while not self._stop.wait(0.05):
            self.peak_kb = max(self.peak_kb, self.rss_kb())

    def cpu_s(self) -> float:
        """The broker's user + system CPU seconds so far (/proc/<pid>/stat)."""
        fields = Path(f"/proc/{self.pid}/stat").read_text().rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def rss_kb(self) -> int:
        with contextlib.suppress(OSError, ValueError):
            for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        return 0

    def bytes_sent(self) -> int:
        """The broker's count published after now (it publishes $SYS every second)."""
        asked = time.monotonic()
        with self._cond:
            if not self._cond.wait_for(lambda: self._sent and self._sent[1] > asked, 5):
                raise RuntimeError("mosquitto published no $SYS/broker/bytes/sent")
            assert self._sent is not None
            return self._sent[0]

    def close(self) -> None:
        self._stop.set()
        self.client.disconnect()
        self.client.loop_stop()


def make_pack(path: Path, kilobytes: int, clips: int, seed: int) -> Path:
    """A pack of ``clips`` clips of random 16-bit audio, ``kilobytes`` in all, for BUNDLE."""
    rng = random.Random(seed)
    size = max(2, kilobytes * 1024 // clips) & ~1
    with CacheStore(path, recover=False, ttl_s=0, max_bytes=1 << 62) as store:
        store.put_many(
            [
                Clip(
                    key=f"{seed:04d}{i:060d}",
                    text=f"announcement {seed}.{i}",
                    voice="bench",
                    params={"voice": "bench"},
                    bundle=BUNDLE,
                    sample_rate=22050,
                    audio=rng.randbytes(size),
                    pinned=True,
                )
                for i in range(clips)
            ]
        )
    return path


def raise_fd_limit(boards: int) -> int:
    """Each board holds a socket and its cache file's three descriptors; mosquitto, started
    after this, inherits the limit for its side of the sockets."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = min(hard, max(soft, boards * 6 + 256))
    resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    if wanted < boards * 5:
        raise RuntimeError(f"RLIMIT_NOFILE hard limit {hard} is too low for {boards} boards")
    return wanted


def _board_worker(
    indices: range,
    broker: tuple[str, int],
    work: Path,
    keys: tuple[str, ...],
    commands: Connection,
    results: Queue[tuple[int, str, str, str, float] | None],
) -> None:
    """A process of boards. paho watches each client's socket and wake-up socket pair with
    select(), which cannot take a descriptor above 1023; with the cache file's three, a board
    holds six, so one process takes at most about 150 boards."""
    logging.getLogger("speakd").setLevel(logging.WARNING)
    trust = Trust(keys)
    boards = [SimBoard(i, broker, work, trust, lambda *r: results.put(r)) for i in indices]
    while True:
        command, arg = commands.recv()
        if command == "connect":
            for board in boards:
                board.connect()
            commands.send(all(board.subscribed.wait(arg) for board in boards))
        elif command == "drop":  # every third board of the fleet
            third = [board for board in boards if board.index % 3 == 0]
            for board in third:
                board.disconnect()
            for board in third:
                board.reconnect()
            commands.send(len(third))
        elif command == "pinned":
            commands.send(all(board.pinned() == arg for board in boards))
        elif command == "close":
            for board in boards:
                board.close()
            commands.send(None)
            return


class Rollout:
    """A broker, N boards in worker processes trusting one key, and the key to sign packs with."""

    def __init__(self, work: Path, boards: int, per_process: int, chunk_bytes: int) -> None:
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

        self.work = work
        self.boards = boards
        self.chunk_bytes = chunk_bytes
        self.key = Ed25519PrivateKey.generate()
        self.outcomes = Outcomes()
        self.broker = Mosquitto(
            work / "broker",
            listener="max_connections -1\nsys_interval 1\n",
            log_types=("error", "warning", "notice", "information"),
        ).start()
        # Processes first, threads after: spawn, so no worker inherits a half-held lock.
        context = multiprocessing.get_context("spawn")
        self.results: Queue[tuple[int, str, str, str, float] | None] = context.Queue()
        self.workers: list[tuple[BaseProcess, Connection]] = []
        address = (self.broker.host, self.broker.port)
        keys = (encode_public(self.key.public_key()),)
        for first in range(0, boards, per_process):
            ours, theirs = context.Pipe()
            indices = range(first, min(boards, first + per_process))
            proc = context.Process(
                target=_board_worker,
                args=(indices, address, work / "boards", keys, theirs, self.results),
                daemon=True,
            )
            proc.start()
            self.workers.append((proc, ours))
        self._collector = threading.Thread(target=self._collect, daemon=True)
        self._collector.start()
        self.watch = BrokerWatch(self.broker)
        self.session = Session(
            MqttConfig(enabled=True, host=self.broker.host, port=self.broker.port), timeout=120
        )

    def _collect(self) -> None:
        while (result := self.results.get()) is not None:
            self.outcomes.record(*result)

    def _all(self, command: str, arg: Any = None) -> list[Any]:
        for _proc, pipe in self.workers:
            pipe.send((command, arg))
        return [pipe.recv() for _proc, pipe in self.workers]

    def connect(self, timeout: float) -> float:
        started = time.monotonic()
        if not all(self._all("connect", timeout)):
            raise RuntimeError(f"not every board connected within {timeout} s")
        return time.monotonic() - started

    def publish(
        self, pack: Path, timeout: float, during: Callable[[str], None] | None = None
    ) -> dict[str, Any]:
        """Publish ``pack`` signed; the time until 50/99/100 % of boards hold it, broker figures."""
        manifest, chunks = read_pack(pack, "speakd", GROUP, self.chunk_bytes)
        manifest = sign_manifest(manifest, self.key)
        sent_before = self.watch.bytes_sent()
        self.watch.peak_kb = self.watch.rss_kb()
        cpu_before = self.watch.cpu_s()
        started = time.monotonic()
        publish_pack(self.session, manifest, chunks)
        if during is not None:
            during(manifest.pack_id)
        complete = self.outcomes.wait(manifest.pack_id, self.boards, timeout)
        with self.outcomes.cond:
            ok = sorted(t - started for t in self.outcomes.ok.get(manifest.pack_id, {}).values())
            refused = sorted(set(self.outcomes.errors.get(manifest.pack_id, {}).values()))

        def until(percent: int) -> float | None:
            need = max(1, -(-percent * self.boards // 100))
            return round(ok[need - 1], 3) if len(ok) >= need else None

        return {
            "pack_id": manifest.pack_id,
            "pack_bytes": manifest.size,
            "chunks": len(chunks),
            "boards_ok": len(ok),
            "refused": refused,
            "complete": complete,
            "s_to_50pct": until(50),
            "s_to_99pct": until(99),
            "s_to_100pct": until(100),
            "broker_peak_rss_mb": round(self.watch.peak_kb / 1024, 1),
            "broker_cpu_s": round(self.watch.cpu_s() - cpu_before, 2),
            "broker_bytes_sent_mb": round((self.watch.bytes_sent() - sent_before) / 1e6, 1),
        }

    def drop_a_third_when(self, share: float) -> Callable[[str], None]:
        """For ``publish(during=…)``: once ``share`` of the boards hold the pack, a third of them
        (every third board) disconnect and reconnect together."""

        def during(pack_id: str) -> None:
            self.outcomes.wait(pack_id, max(1, int(share * self.boards)), 600)
            self._all("drop")

        return during

    def pinned_is(self, keys: set[str]) -> bool:
        return all(self._all("pinned", keys))

    def close(self) -> None:
        self.session.close()
        self._all("close")
        for proc, _pipe in self.workers:
            proc.join(30)
        self.results.put(None)
        self._collector.join(10)
        self.watch.close()
        self.broker.stop()


def measure(args: argparse.Namespace) -> dict[str, Any]:
    logging.getLogger("speakd").setLevel(logging.WARNING)  # a line per board and pack otherwise
    fds = raise_fd_limit(args.boards)
    with tempfile.TemporaryDirectory(prefix="speakd-bench-fleet-") as tmp:
        work = Path(tmp)
        packs = [make_pack(work / f"pack-{n}.db", args.pack_kb, args.clips, n) for n in (1, 2)]
        rollout = Rollout(work, args.boards, args.per_process, args.chunk_bytes)
        try:
            connect_s = rollout.connect(args.timeout)
            idle = rollout.publish(packs[0], args.timeout)
            storm = rollout.publish(packs[1], args.timeout, rollout.drop_a_third_when(0.1))
            with CacheStore(packs[1], recover=False, ttl_s=0) as last:
                pinned_ok = rollout.pinned_is(last.keys())
        finally:
            rollout.close()
    return {
        "what": "signed pack rollout to simulated boards on one mosquitto (loopback)",
        "boards": args.boards,
        "connect_s": round(connect_s, 2),
        "rollout": idle,
        "rollout_with_a_third_reconnecting": storm,
        "pinned_is_current_pack_only": pinned_ok,  # the first pack's clips were unpinned
        "rlimit_nofile": fds,
        "machine": cpu(),
        "loadavg": loadavg(),
    }


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--boards", type=int, default=1000, help="simulated boards (default 1000)")
    p.add_argument("--pack-kb", type=int, default=512, help="pack size in KiB (default 512)")
    p.add_argument(
        "--per-process", type=int, default=100, help="boards per worker process (default 100)"
    )
    p.add_argument("--clips", type=int, default=8, help="clips per pack (default 8)")
    p.add_argument("--chunk-bytes", type=int, default=256 * 1024, help="as pack publish")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per phase")
    p.add_argument("--json", type=Path, default=None, help="also write the result here")


def run(args: argparse.Namespace) -> int:
    result = measure(args)
    text = json.dumps(result, indent=2)
    print(text)
    if args.json is not None:
        args.json.write_text(text + "\n")
    ok = result["rollout"]["complete"] and result["rollout_with_a_third_reconnecting"]["complete"]
    return 0 if ok and result["pinned_is_current_pack_only"] else 1
