"""MQTT at-least-once: a QoS 1 say acknowledged by speakd survives a SIGKILL and is spoken once.

A real mosquitto and real ``speakd serve`` processes with a realtime WAV sink: a long say plays
while the one under test waits behind it, so the kill lands between arrival and playback.
"""

from __future__ import annotations

import json
import logging
import signal
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from speakd.mqtt.journal import Journal
from tests.daemon_proc import start_daemon
from tests.mosquitto import Mosquitto, Received, Watcher
from tests.test_mqtt import LONG_TEXT, finished, start_mqtt_daemon, wav_dir

REPLIES = "test/journal"


@pytest.fixture(scope="module")
def watcher(broker: Mosquitto) -> Iterator[Watcher]:
    w = Watcher(broker, "hermes/#", "speakd/#", "test/#")
    yield w
    w.close()


def reply(rid: str, status: str):
    return lambda m: m.json().get("id") == rid and m.json().get("status") == status


def pending(db: Path) -> list[str]:
    with sqlite3.connect(db) as conn:
        return [k for (k,) in conn.execute("SELECT key FROM says WHERE done IS NULL")]


def test_acknowledged_say_is_spoken_once_after_sigkill(
    tmp_path: Path, broker: Mosquitto, watcher: Watcher
) -> None:
    d = start_mqtt_daemon(tmp_path, broker, watcher, "porch")
    since = watcher.mark()
    # Refused says are acknowledged and reported, never journaled.
    watcher.publish("speakd/porch/say", b"{not json")
    bad_voice = {"text": "No such voice.", "voice": "nobody", "id": "j-badvoice"}
    watcher.publish("speakd/porch/say", json.dumps(bad_voice))
    watcher.publish(
        "speakd/porch/say", json.dumps({"text": LONG_TEXT, "id": "j-long"}), response_topic=REPLIES
    )
    watcher.publish(  # Hermes' topic: the site is in the payload
        "hermes/tts/say",
        json.dumps({"text": "Still here after the crash.", "siteId": "porch", "id": "j-after"}),
        response_topic=REPLIES,
    )
    queued = watcher.wait(REPLIES, reply("j-after", "queued"), since)
    assert queued.json()["position"] >= 1, "j-after waits behind j-long"
    d.stop(signal.SIGKILL)  # j-long is playing, j-after queued: neither finished
    assert not watcher.matching("hermes/tts/sayFinished", finished("j-after"), since)
    errors = [m.json()["error"] for m in watcher.matching("hermes/error/tts", since=since)]
    assert len(errors) == 2 and errors[0].startswith("bad_json"), errors
    assert sorted(pending(tmp_path / "mqtt-journal.db")) == ["j-after", "j-long"]

    restart = watcher.mark()
    d = start_daemon(d.config)
    try:
        watcher.wait("hermes/tts/sayFinished", finished("j-after", "porch"), restart, timeout=90)
        again = watcher.mark()  # a client's retry after the restart: the id outlived the process
        say_again = {"text": "Still here after the crash.", "siteId": "porch", "id": "j-after"}
        watcher.publish("hermes/tts/say", json.dumps(say_again), response_topic=REPLIES)
        watcher.wait(REPLIES, reply("j-after", "duplicate"), again)
        # A say after the replayed ones: once it is spoken, any duplicate would have been too.
        watcher.publish("speakd/porch/say", json.dumps({"text": "Marker.", "id": "j-marker"}))
        watcher.wait("hermes/tts/sayFinished", finished("j-marker"), restart, timeout=90)
        spoken = watcher.matching("hermes/tts/sayFinished", since=restart)
        ids = [m.json()["id"] for m in spoken]
        assert ids.count("j-after") == 1 and ids.count("j-long") == 1, ids
        assert (wav_dir(d) / "j-after.wav").exists()
        assert not watcher.matching("hermes/error/tts", since=restart), "refused says not replayed"
        replies: list[Received] = watcher.matching(REPLIES, reply("j-after", "done"), since)
        assert len(replies) == 1, "its MQTT 5 reply address was journaled too"
        assert pending(tmp_path / "mqtt-journal.db") == []
    finally:
        assert d.stop() == 0, d.log_text()


def test_journal_dedupes_bounds_and_forgets(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    j = Journal(str(tmp_path / "j.db"), max_pending=2, max_done=1, window_s=60)
    j.add("a", "t", b"{}", None, None)
    j.add("b", "t", b"{}", "r", b"c")
    assert j.seen("a") and not j.seen("z")
    with pytest.raises(Exception, match="2 MQTT says"):
        j.add("c", "t", b"{}", None, None)
    j.finish("a")
    assert j.seen("a"), "a finished id is remembered"
    j.finish("b")
    assert not j.seen("a") and j.seen("b"), "only max_done finished ids are kept"
    j.forget("b")
    assert not j.seen("b")
    j.add("c", "t", b"x", None, None)
    j.close()
    again = Journal(str(tmp_path / "j.db"))
    assert [e.key for e in again.pending()] == ["c"] and again.pending()[0].payload == b"x"
    # A finish that cannot be written (here: another writer holds the lock) is written later.
    again._db.execute("PRAGMA busy_timeout=0")
    lock = sqlite3.connect(tmp_path / "j.db", isolation_level=None)
    lock.execute("BEGIN EXCLUSIVE")
    again.finish("c")
    lock.execute("ROLLBACK")
    assert [e.key for e in again.pending()] == ["c"]
    again.add("e", "t", b"{}", None, None)
    assert [e.key for e in again.pending()] == ["e"], "c marked done at the next write"
    again.close()  # a journal that cannot be written any more (as with a full disk)
    with caplog.at_level(logging.WARNING, logger="speakd.mqtt.journal"):
        again.add("d", "t", b"{}", None, None)  # logged, not raised: the say is spoken anyway
        again.finish("d")
    assert "say d not kept across a crash" in caplog.text
