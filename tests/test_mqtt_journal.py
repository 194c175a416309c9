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
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.subscribeoptions import SubscribeOptions

from speakd.config import load_config
from speakd.lifecycle.doctor import _check_socket
from speakd.mqtt.journal import Journal, digest
from speakd_tools.soak.daemon import install_copy, upgrade
from tests.daemon_proc import DaemonProc, start_daemon, write_config
from tests.mosquitto import Mosquitto, Watcher
from tests.test_mqtt import finished, mqtt_toml, start_mqtt_daemon, wav_dir
from tests.waits import wait_until

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


def kept_session(client: mqtt.Client, broker: Mosquitto, *topics: str) -> None:
    """Connect ``client`` with a session the broker keeps for an hour (what comes while it is
    away waits for it), start its loop and subscribe to ``topics`` at QoS 1, acknowledged."""
    subscribed = threading.Event()
    client.on_subscribe = lambda *_: subscribed.set()
    props = Properties(PacketTypes.CONNECT)
    props.SessionExpiryInterval = 3600
    client.connect(broker.host, broker.port, clean_start=False, properties=props)
    client.loop_start()
    client.subscribe([(topic, 1) for topic in topics])
    assert subscribed.wait(10)


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
        kept_session(self.client, broker, topic)

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
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 3
    conn.close()
    again = Journal(new, legacy=old)
    assert [e.payload for e in again.replay] == [b"{}"] and again.pending == 1
    assert again.redelivery((8, digest("t", b"x"))), "redeliveries known across a restart"
    # A commit that fails (another writer holds the lock) fails its say, not the journal.
    again._writer.db.execute("PRAGMA busy_timeout=0")  # type: ignore[union-attr]
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


V1_SCHEMA = (  # the journal beside the cache, as the versions before the state directory had it
    "CREATE TABLE says (key TEXT PRIMARY KEY, topic TEXT NOT NULL, payload BLOB NOT NULL,"
    " response_topic TEXT, correlation BLOB, done REAL)"
)


def old_journal(path: Path, *keys: str, crashed: bool = False) -> None:
    """An old version's journal with these pending says; ``crashed``: its last commit is
    still in the WAL (the old daemon was killed), as a copy taken while it is open."""
    path.parent.mkdir(parents=True, exist_ok=True)
    live = path.with_name("live.db") if crashed else path
    conn = sqlite3.connect(live, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(V1_SCHEMA)
    for key in keys:
        payload = json.dumps({"text": f"Say {key}.", "id": key}).encode()
        conn.execute("INSERT INTO says VALUES (?, 'speakd/p/say', ?, NULL, NULL, NULL)",
                     (key, payload))  # fmt: skip
    if crashed:
        for suffix in ("", "-wal"):
            Path(f"{path}{suffix}").write_bytes(Path(f"{live}{suffix}").read_bytes())
    conn.close()
    live.with_name("live.db").unlink(missing_ok=True)


def ids(entries: list[Any]) -> list[str]:
    return [json.loads(e.payload)["id"] for e in entries]


def test_an_old_journal_is_moved_in_every_time(tmp_path: Path) -> None:
    """Upgrade, downgrade, upgrade: each start that finds an old journal beside the cache moves
    its pending says in (one reusing an id among them), with what was still in its WAL; a crash
    between the copy and the removal, or between the rename and the copy, copies each row once."""
    old = tmp_path / "cache" / "mqtt-journal.db"
    new = tmp_path / "state" / "mqtt-journal.db"
    old_journal(old, "a")
    Journal(new, legacy=old).close()  # the upgrade
    old_journal(old, "a", "b", crashed=True)  # the downgrade journals beside the cache again
    j = Journal(new, legacy=old)  # the upgrade again
    assert ids(j.replay) == ["a", "a", "b"] and not old.exists()
    assert not list(old.parent.iterdir()), "the old file and its WAL are gone"
    j.close()

    old_journal(old, "c")  # a crash after the commit, before the removal
    real_unlink = Path.unlink

    def crash(self: Path, missing_ok: bool = False) -> None:
        if ".moving-" in self.name:
            raise KeyboardInterrupt  # stands for a SIGKILL: nothing after it runs
        real_unlink(self, missing_ok)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Path, "unlink", crash)
        with pytest.raises(KeyboardInterrupt):
            Journal(new, legacy=old)
    assert len(list(old.parent.glob("mqtt-journal.db.moving-*"))) == 1
    old_journal(old, "d")  # and then a downgrade's daemon made a new one
    j = Journal(new, legacy=old)
    assert ids(j.replay) == ["a", "a", "b", "c", "d"]
    assert not list(old.parent.iterdir())
    j.close()

    old_journal(old, "e")  # a crash after the rename, before the copy's commit

    def killed(db: sqlite3.Connection, legacy: Path | None) -> list[Path]:
        raise KeyboardInterrupt

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("speakd.mqtt.journal.writer.move_in", killed)
        with pytest.raises(KeyboardInterrupt):
            Journal(new, legacy=old)
    assert not old.exists()
    j = Journal(new, legacy=old)
    assert ids(j.replay) == ["a", "a", "b", "c", "d", "e"]
    assert not list(old.parent.iterdir())
    j.close()


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


class Recorder:
    """A subscriber with a persistent session: the broker keeps what comes while it is away."""

    def __init__(self, broker: Mosquitto, *topics: str) -> None:
        self.got: list[bytes] = []
        self.cond = threading.Condition()
        self.client = mqtt.Client(
            CallbackAPIVersion.VERSION2, client_id="recorder", protocol=mqtt.MQTTv5
        )
        self.client.on_message = self._on_message
        self.client.reconnect_delay_set(0.1, 0.5)  # type: ignore[arg-type]
        kept_session(self.client, broker, *topics)

    def _on_message(self, _c: Any, _u: Any, msg: mqtt.MQTTMessage) -> None:
        with self.cond:
            self.got.append(bytes(msg.payload))
            self.cond.notify_all()

    def wait(self, count: int, timeout: float = 30) -> list[bytes]:
        return self.wait_for(lambda got: len(got) >= count, timeout)

    def wait_for(self, done: Callable[[list[bytes]], bool], timeout: float = 30) -> list[bytes]:
        with self.cond:
            assert self.cond.wait_for(lambda: done(self.got), timeout), self.got[-5:]
            return list(self.got)

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def test_an_outcome_paho_refuses_waits_for_the_broker(tmp_path: Path) -> None:
    """The broker goes away and paho's queue fills: an outcome published then is not taken
    as acknowledged; it waits, in order behind the rest, and goes once the broker is back,
    and only the broker's acknowledgement runs its on_acked."""
    from speakd.config import MqttConfig
    from speakd.mqtt.client import MAX_QUEUED, Connection
    from speakd.mqtt.messages import Availability, Reply
    from speakd.mqtt.topics import SiteTopics

    broker = Mosquitto(tmp_path / "broker").start()
    recorder = Recorder(broker, "test/outcome/#")
    config = MqttConfig(
        enabled=True, host=broker.host, port=broker.port, site_id="away",
        reconnect_min_s=0.1, reconnect_max_s=0.5,
    )  # fmt: skip
    connected = threading.Event()
    will = Availability(SiteTopics(config.prefix, config.site_id), online=False)
    subscriptions = [("test/none", SubscribeOptions(qos=1))]
    conn = Connection(
        config, "speakd-away", will, lambda: subscriptions, connected.set, lambda _m: None
    )
    conn.start()
    try:
        assert connected.wait(10)
        broker.stop()
        wait_until(lambda: not conn.connected, "the broker gone")
        for n in range(MAX_QUEUED):
            conn.publish(Reply("test/outcome/filler", str(n), "queued", {}))
        acked = threading.Event()
        outcome = Reply("test/outcome/say", "o-1", "done", {})
        conn.publish(outcome, on_acked=acked.set)
        after = Reply("test/outcome/say", "o-2", "done", {})
        conn.publish(after, kept=True)  # behind it, not before
        assert not acked.is_set(), "refused by paho, yet marked as acknowledged"
        connected.clear()
        broker.start()
        assert acked.wait(30), "never published after the broker came back"
        got = recorder.wait(MAX_QUEUED + 2)
        assert got[MAX_QUEUED:] == [outcome.payload(), after.payload()]
    finally:
        conn.close()
        recorder.close()
        broker.stop()


def test_a_late_outcome_is_published_after_a_restart_not_spoken_again(tmp_path: Path) -> None:
    """Says spoken while the broker is away, then the daemon restarted (an upgrade) before it
    returns: the journal keeps their outcomes; the next start publishes them once the broker
    is back, and does not speak the says again."""
    broker = Mosquitto(tmp_path / "broker").start()
    recorder = Recorder(broker, REPLIES)
    watcher = Watcher(broker, "speakd/#", "test/#")
    d = start_mqtt_daemon(tmp_path, broker, watcher, "loft")
    journal = d.config.parent / "state" / "mqtt-journal.db"
    try:
        queue_behind_a_long_say(watcher, "loft", ["l-1"])
        broker.stop()

        def ended() -> bool:
            with sqlite3.connect(journal) as conn:
                rows = conn.execute("SELECT count(*) FROM says WHERE outcome IS NOT NULL")
                return rows.fetchone()[0] == 2

        wait_until(ended, "both says spoken, their outcomes kept", timeout=60)
        assert d.stop() == 0, d.log_text()
        assert pending(d) == ["loft-long", "l-1"]
        spoken_at = {p.name: p.stat().st_mtime_ns for p in wav_dir(d).iterdir()}
        assert set(spoken_at) == {"loft-long.wav", "l-1.wav"}

        d = start_daemon(d.config)  # the broker still away
        broker.start()
        done = [reply_bytes("loft-long", "done"), reply_bytes("l-1", "done")]
        recorder.wait_for(lambda got: all(m in got for m in done), timeout=60)
        assert d.stop() == 0, d.log_text()
        assert "publishing the outcome of 2 says" in d.log_text()
        assert "replaying" not in d.log_text()
        assert pending(d) == []
        assert {p.name: p.stat().st_mtime_ns for p in wav_dir(d).iterdir()} == spoken_at
        assert [recorder.got.count(m) for m in done] == [1, 1]
    finally:
        d.stop()
        watcher.close()
        recorder.close()
        broker.stop()


def reply_bytes(rid: str, status: str) -> bytes:
    return json.dumps({"id": rid, "status": status}, separators=(",", ":")).encode()
