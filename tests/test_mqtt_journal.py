"""MQTT at-least-once: no say speakd acknowledged is lost to a SIGKILL, a SIGTERM or an upgrade's
restart, a replay is never refused, only a broker's redelivery is a duplicate, and a say that
cannot be journaled is refused (retryably), not acknowledged as if it were durable.

A real mosquitto and real ``speakd serve`` processes with a realtime WAV sink: a long say plays
while the ones under test wait behind it, so the signal lands between arrival and playback.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from speakd.config import load_config
from speakd.lifecycle.doctor import _check_socket
from speakd.mqtt.journal import Journal, digest
from speakd_tools.soak.daemon import install_copy, upgrade
from tests.daemon_proc import DaemonProc, start_daemon, write_config
from tests.mosquitto import Mosquitto, Watcher
from tests.test_mqtt import finished, mqtt_toml, start_mqtt_daemon, wav_dir

REPLIES = "test/journal"
LONG = "The long announcement is playing now, for a few seconds."


@pytest.fixture(scope="module")
def watcher(broker: Mosquitto) -> Iterator[Watcher]:
    w = Watcher(broker, "hermes/#", "speakd/#", "test/#")
    yield w
    w.close()


def reply(rid: str, status: str):
    return lambda m: m.json().get("id") == rid and m.json().get("status") == status


def pending(d: DaemonProc) -> list[str]:
    """The ids of the says journaled and not finished (read while the daemon is down)."""
    with sqlite3.connect(d.config.parent / "state" / "mqtt-journal.db") as conn:
        rows = conn.execute("SELECT payload FROM says WHERE done IS NULL ORDER BY seq")
        return [json.loads(p)["id"] for (p,) in rows]


def say(watcher: Watcher, site: str, rid: str, text: str, **fields: str) -> None:
    payload = {"text": text, "id": rid, **fields}
    watcher.publish(f"speakd/{site}/say", json.dumps(payload), response_topic=REPLIES)


def spoken(watcher: Watcher, since: int) -> list[str]:
    return [m.json()["id"] for m in watcher.matching("hermes/tts/sayFinished", since=since)]


def queue_behind_a_long_say(watcher: Watcher, site: str, ids: list[str]) -> int:
    """A long say playing, ``ids`` queued behind it (as their replies say); returns the mark."""
    since = watcher.mark()
    say(watcher, site, f"{site}-long", LONG, priority="important")
    watcher.wait(REPLIES, reply(f"{site}-long", "queued"), since)
    for rid in ids:
        say(watcher, site, rid, f"Message {rid}.")
    for rid in ids:
        watcher.wait(REPLIES, reply(rid, "queued"), since)
    return since


def test_replay_larger_than_the_queue_after_sigkill(
    tmp_path: Path, broker: Mosquitto, watcher: Watcher
) -> None:
    """Four says acknowledged, one queue place: all four are spoken after the SIGKILL, in
    priority and then arrival order, each reported once (it was one refused before)."""
    d = start_mqtt_daemon(tmp_path, broker, watcher, "porch", "[limits]\nmax_queue = 3")
    ids = ["k-text", "k-m1", "k-m2"]
    since = watcher.mark()
    say(watcher, "porch", "k-long", LONG, priority="important")
    watcher.wait(REPLIES, reply("k-long", "queued"), since)
    say(watcher, "porch", "k-text", "A text say.", priority="text")
    for rid in ids[1:]:
        say(watcher, "porch", rid, f"Message {rid}.")
    for rid in ids:
        watcher.wait(REPLIES, reply(rid, "queued"), since)
    d.stop(signal.SIGKILL)
    assert not watcher.matching("hermes/tts/sayFinished", since=since)
    assert pending(d) == ["k-long", *ids]

    restart = watcher.mark()
    d = start_daemon(d.config)
    try:
        watcher.wait(REPLIES, reply("k-text", "done"), restart, timeout=90)
        assert spoken(watcher, restart) == ["k-long", "k-m1", "k-m2", "k-text"]
        assert not watcher.matching("hermes/error/tts", since=restart)
        for rid in ["k-long", *ids]:
            assert (wav_dir(d) / f"{rid}.wav").exists()
            assert len(watcher.matching(REPLIES, reply(rid, "done"), since)) == 1
    finally:
        assert d.stop() == 0, d.log_text()
    assert pending(d) == []


def test_sigterm_of_an_upgrade_keeps_unspoken_says(
    tmp_path: Path, broker: Mosquitto, watcher: Watcher
) -> None:
    """The package's upgrade: files replaced under the running daemon, then SIGTERM and a
    start. The says the stop cut short are neither reported nor forgotten: spoken after the
    start (the one cut mid-playback from its start), one sayFinished each."""
    env = install_copy(tmp_path / "lib")
    where = subprocess.run(
        [sys.executable, "-c", "import speakd; print(speakd.__file__)"],
        capture_output=True, text=True, env={**os.environ, **env}, check=True,
    )  # fmt: skip
    assert where.stdout.startswith(str(tmp_path / "lib" / "speakd")), where.stdout
    config = write_config(tmp_path, mqtt_toml(broker, "hall"), realtime=True)
    online = watcher.mark()
    d = start_daemon(config, env=env)
    watcher.wait("speakd/hall/availability", lambda m: m.payload == b"online", online)
    ids = ["t-1", "t-2"]
    since = queue_behind_a_long_say(watcher, "hall", ids)
    assert upgrade(tmp_path / "lib") > 50
    idle = d.client()  # a socket client still connected at the stop goes quietly
    idle.request({"op": "status"})
    assert d.stop(signal.SIGTERM, timeout=30) == 0, d.log_text()
    idle.close()
    assert "Traceback" not in d.log_text(), d.log_text()
    assert not watcher.matching("hermes/tts/sayFinished", since=since), "reported at the end"
    assert pending(d) == ["hall-long", *ids]
    assert "kept for the next start" in d.log_text()

    restart = watcher.mark()
    d = start_daemon(d.config, env=env)
    try:
        watcher.wait(REPLIES, reply("t-2", "done"), restart, timeout=90)
        assert spoken(watcher, restart) == ["hall-long", *ids]
        for rid in ["hall-long", *ids]:
            assert len(watcher.matching(REPLIES, reply(rid, "done"), since)) == 1
            assert not watcher.matching(REPLIES, reply(rid, "stopped"), since)
    finally:
        assert d.stop() == 0, d.log_text()
    assert pending(d) == []


class Impersonator:
    """The daemon's MQTT session taken over for a moment: it receives a say and never
    acknowledges it, as the daemon does when it dies between its commit and its PUBACK."""

    def __init__(self, broker: Mosquitto, client_id: str, topic: str) -> None:
        self.got: list[mqtt.MQTTMessage] = []
        self.event = threading.Event()
        self.client = mqtt.Client(
            CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv5, manual_ack=True
        )
        self.client.on_message = lambda _c, _u, msg: (self.got.append(msg), self.event.set())
        subscribed = threading.Event()
        self.client.on_subscribe = lambda *_: subscribed.set()
        props = Properties(PacketTypes.CONNECT)
        props.SessionExpiryInterval = 3600
        self.client.connect(broker.host, broker.port, clean_start=False, properties=props)
        self.client.loop_start()
        self.client.subscribe(topic, qos=1)
        assert subscribed.wait(10)

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def test_only_a_broker_redelivery_is_a_duplicate(
    tmp_path: Path, broker: Mosquitto, watcher: Watcher
) -> None:
    """A say journaled whose PUBACK never went out: replayed at start, and the broker's
    redelivery of it (DUP, same packet identifier) answered ``duplicate``, not spoken again;
    the same say published anew afterwards is a new say and is spoken."""
    config = write_config(tmp_path, mqtt_toml(broker, "attic"), realtime=True)
    payload = json.dumps({"text": "Door open.", "id": "r-door"}).encode()
    them = Impersonator(broker, "speakd-attic", "speakd/attic/say")
    watcher.publish("speakd/attic/say", payload, response_topic=REPLIES)
    assert them.event.wait(10)
    msg = them.got[0]
    journaled = threading.Event()
    journal = Journal(tmp_path / "state" / "mqtt-journal.db")
    journal.add(msg.topic, payload, REPLIES, None, msg.mid, lambda _e: journaled.set())
    assert journaled.wait(10)
    journal.close()
    them.close()  # no PUBACK: the broker redelivers it to the daemon's session

    since = watcher.mark()
    d = start_daemon(config)
    try:
        watcher.wait(REPLIES, reply("r-door", "done"), since, timeout=60)
        dup = watcher.wait("hermes/error/tts", lambda m: m.json()["context"] == "r-door", since)
        assert dup.json()["error"].startswith("duplicate:")
        watcher.wait(REPLIES, reply("r-door", "duplicate"), since)
        again = watcher.mark()  # a new say with the same id: spoken
        watcher.publish("speakd/attic/say", payload, response_topic=REPLIES, correlation=b"2")
        done = watcher.wait(REPLIES, reply("r-door", "done"), again, timeout=60)
        assert done.correlation == b"2"
        assert spoken(watcher, since) == ["r-door", "r-door"]
        assert len(watcher.matching("hermes/error/tts", since=since)) == 1
    finally:
        assert d.stop() == 0, d.log_text()


def test_a_say_that_cannot_be_journaled_is_refused_not_acknowledged_as_durable(
    tmp_path: Path, broker: Mosquitto, watcher: Watcher
) -> None:
    """The journal's file cannot be opened (a directory stands in its place): each say is
    refused with the retryable journal_unavailable on every reply path and not spoken; status
    and doctor say why; once the file can be made, says are journaled and spoken again."""
    blocker = tmp_path / "state" / "mqtt-journal.db"
    blocker.mkdir(parents=True)
    d = start_mqtt_daemon(tmp_path, broker, watcher, "cellar")
    try:
        since = watcher.mark()
        say(watcher, "cellar", "u-1", "Not durable.")
        error = watcher.wait(REPLIES, reply("u-1", "error"), since).json()
        assert error["code"] == "journal_unavailable", error
        tts = watcher.wait("hermes/error/tts", lambda m: m.json()["context"] == "u-1", since)
        assert tts.json()["error"].startswith("journal_unavailable:")
        watcher.wait("hermes/tts/sayFinished", finished("u-1"), since)
        assert not (wav_dir(d) / "u-1.wav").exists()
        with d.client() as c:
            status = c.request({"op": "status"})
        assert "cannot be opened" in status["mqtt_journal"]["error"], status["mqtt_journal"]
        assert status["mqtt_journal"]["failures"] >= 1
        ok, detail = _check_socket(load_config(d.config), d.socket)
        assert ok is False and "journal" in detail, detail
        blocker.rmdir()
        again = watcher.mark()
        say(watcher, "cellar", "u-2", "Durable again.")
        watcher.wait("hermes/tts/sayFinished", finished("u-2"), again, timeout=60)
        watcher.wait(REPLIES, reply("u-2", "done"), again)
        assert (wav_dir(d) / "u-2.wav").exists()
    finally:
        assert d.stop() == 0, d.log_text()


def test_journal_migrates_moves_in_and_remembers_redeliveries(tmp_path: Path) -> None:
    """A schema-1 journal beside the cache (rows keyed by id) is moved into the state
    directory at the first start with its pending rows, once; two pending says with one id
    are two rows; a redelivery is known by packet identifier and content, for window_s."""
    old = tmp_path / "cache" / "mqtt-journal.db"
    old.parent.mkdir()
    with sqlite3.connect(old) as conn:
        conn.execute(
            "CREATE TABLE says (key TEXT PRIMARY KEY, topic TEXT NOT NULL, payload BLOB NOT"
            " NULL, response_topic TEXT, correlation BLOB, done REAL)"
        )
        conn.execute("INSERT INTO says VALUES ('a', 't', x'7b7d', 'r', x'01', NULL)")
        conn.execute("INSERT INTO says VALUES ('b', 't', x'7b7d', NULL, NULL, 1.0)")
    conn.close()
    new = tmp_path / "state" / "mqtt-journal.db"
    j = Journal(new, legacy=old, max_done=1, window_s=60)
    assert not old.exists()
    assert [(e.topic, e.payload, e.response_topic, e.correlation) for e in j.replay] == [
        ("t", b"{}", "r", b"\x01")
    ]
    commits: list[object] = []
    done = threading.Event()
    first = j.add("t", b"x", None, None, 7, commits.append)
    second = j.add("t", b"x", None, None, 8, lambda e: (commits.append(e), done.set()))
    assert done.wait(10) and commits == [None, None]
    assert j.redelivery((7, digest("t", b"x"))) and not j.redelivery((7, digest("t", b"y")))
    j.finish(first)
    assert j.redelivery((7, digest("t", b"x"))), "a finished say is remembered"
    j.finish(second)
    assert not j.redelivery((7, digest("t", b"x"))), "only max_done finished ones"
    j.close()
    with sqlite3.connect(new) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 2
    conn.close()
    again = Journal(new, legacy=old)
    assert [e.payload for e in again.replay] == [b"{}"] and again.pending == 1
    assert again.redelivery((8, digest("t", b"x"))), "redeliveries known across a restart"
    # A commit that fails (another writer holds the lock) fails its say, not the journal.
    again._db.execute("PRAGMA busy_timeout=0")  # type: ignore[union-attr]
    lock = sqlite3.connect(new, isolation_level=None)
    lock.execute("BEGIN EXCLUSIVE")
    failed: list[BaseException | None] = []
    gone = threading.Event()
    again.add("t", b"z", None, None, 9, lambda e: (failed.append(e), gone.set()))
    assert gone.wait(10) and "cannot be written" in str(failed[0])
    assert again.status()["failures"] == 1 and again.status()["error"]
    lock.execute("ROLLBACK")
    lock.close()
    ok = threading.Event()
    again.add("t", b"w", None, None, 10, lambda e: ok.set() if e is None else None)
    assert ok.wait(10) and again.status()["error"] is None
    again.close()


def test_pubacks_leave_in_the_order_the_publishes_came() -> None:
    """A say's PUBACK waits for its commit; a later message's (a stop, or a say whose commit
    returned first) waits behind it: MQTT acknowledges in the order of the PUBLISHes."""
    from speakd.config import MqttConfig
    from speakd.mqtt.client import Connection, Incoming
    from speakd.mqtt.messages import Availability
    from speakd.mqtt.topics import SiteTopics

    config = MqttConfig(enabled=True)
    will = Availability(SiteTopics(config.prefix, config.site_id), online=False)
    conn = Connection(config, "order", will, list, lambda: None, lambda _m: None)
    sent: list[int] = []
    conn._client.ack = lambda mid, qos: sent.append(mid)  # type: ignore[method-assign]
    say, stop, say2 = (Incoming("t", b"", None, None, mid, 1) for mid in (1, 2, 3))
    qos0 = Incoming("t", b"", None, None, 0, 0)
    releases = [conn.hold(m) for m in (say, stop, say2, qos0)]
    releases[1]()  # the stop is handled at once
    releases[2]()  # the second say's commit returned first
    assert sent == []
    releases[0]()
    assert sent == [1, 2, 3]
    releases[3]()  # QoS 0: nothing to acknowledge
    releases[0]()  # twice: harmless
    assert sent == [1, 2, 3]
