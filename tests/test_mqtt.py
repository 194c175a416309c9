"""MQTT front-end end to end: a real mosquitto, real ``speakd serve`` processes, the real voice.

Clients are paho (``Watcher``) and the mosquitto command-line tools, as users would drive it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import queue
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import speakd.lifecycle.service
from speakd.audio import read_wav
from speakd.audio.sinks import NullSink
from speakd.config import ConfigError, MqttConfig, load_config
from speakd.control import Control
from speakd.frontends.mqtt.frontend import MqttFrontend
from speakd.mqtt.messages import decode_object
from speakd.mqtt.topics import parse_command_topic
from speakd.request.messages import RequestError
from speakd.request.resolver import Resolver
from speakd.request.scheduler import Scheduler
from speakd.request.sounds import Sounds
from tests.daemon_proc import DaemonProc, InProcessDaemon, start_daemon, write_config
from tests.mosquitto import Mosquitto, Received, Watcher
from tests.test_scheduler import Recorder, settle
from tests.test_ssml_daemon import synth as socket_synth
from tests.tone_engine import ToneEngine
from tests.waits import until

LONG_TEXT = (
    "This is a long announcement for the stop test. It goes on for several sentences. "
    "The kitchen is closed for cleaning until further notice. Please use the side door. "
    "Thank you for your patience, and have a pleasant evening."
)
PAYLOAD_LIMIT = 4096


def mqtt_toml(broker: Mosquitto, site: str, extra: str = "") -> str:
    return f"""
[mqtt]
enabled = true
host = "{broker.host}"
port = {broker.port}
site_id = "{site}"
reconnect_min_s = 0.1
reconnect_max_s = 0.5
discovery_delay_s = 0.3
max_payload_bytes = {PAYLOAD_LIMIT}
{extra}
"""


def start_mqtt_daemon(
    tmp: Path, broker: Mosquitto, watcher: Watcher, site: str, extra: str = ""
) -> DaemonProc:
    """Start speakd and wait for its live (not retained) ``online``."""
    since = watcher.mark()
    config = write_config(tmp, mqtt_toml(broker, site, extra), realtime=True)
    daemon = start_daemon(config)
    watcher.wait(f"speakd/{site}/availability", lambda m: m.payload == b"online", since, timeout=30)
    return daemon


def finished(rid: str | None, site: str | None = None):
    return lambda m: m.json().get("id") == rid and (site is None or m.json()["siteId"] == site)


@pytest.fixture(scope="module")
def watcher(broker: Mosquitto) -> Iterator[Watcher]:
    w = Watcher(broker, "hermes/#", "rhasspy/#", "speakd/#", "homeassistant/#", "test/#")
    yield w
    w.close()


@pytest.fixture(scope="module")
def kitchen(
    tmp_path_factory: pytest.TempPathFactory, broker: Mosquitto, watcher: Watcher
) -> Iterator[DaemonProc]:
    d = start_mqtt_daemon(
        tmp_path_factory.mktemp("kitchen"),
        broker,
        watcher,
        "kitchen",
        'site_ids = ["downstairs"]\n[limits]\nmax_text_chars = 1000',
    )
    yield d
    assert d.stop() == 0, d.log_text()


def wav_dir(d: DaemonProc) -> Path:
    return d.config.parent / "wav"


class MosquittoSub:
    """``mosquitto_sub -v`` in the background, ready once it has seen its own marker message."""

    def __init__(self, broker: Mosquitto, watcher: Watcher, *topics: str) -> None:
        marker = f"test/ready/{id(self)}"
        args = [arg for t in (*topics, marker) for arg in ("-t", t)]
        self.proc = subprocess.Popen(
            mosquitto_cli("mosquitto_sub", broker, "-v", *args), stdout=subprocess.PIPE, text=True
        )
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            watcher.publish(marker, "ready")
            try:
                if self.lines.get(timeout=0.3).startswith(marker):
                    return
            except queue.Empty:
                continue
        raise RuntimeError("mosquitto_sub did not subscribe")

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))

    def next(self, topic: str, timeout: float = 30) -> str:
        deadline = time.monotonic() + timeout
        while True:
            line = self.lines.get(timeout=max(0.01, deadline - time.monotonic()))
            if line.startswith(topic + " "):
                return line[len(topic) + 1 :]

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(5)


def mosquitto_cli(tool: str, broker: Mosquitto, *args: str) -> list[str]:
    return [tool, "-h", broker.host, "-p", str(broker.port), "-V", "5", *args]


def mosquitto_pub(broker: Mosquitto, topic: str, message: str, *extra: str) -> None:
    subprocess.run(
        mosquitto_cli("mosquitto_pub", broker, "-q", "1", "-t", topic, "-m", message, *extra),
        check=True,
        timeout=10,
    )


# ---- the kitchen daemon ------------------------------------------------------------------------


def test_hermes_say_round_trip_with_mosquitto_clients(
    kitchen: DaemonProc, broker: Mosquitto, watcher: Watcher
) -> None:
    sub = MosquittoSub(broker, watcher, "hermes/tts/sayFinished")
    try:
        say = {"text": "Hello from the kitchen.", "siteId": "kitchen", "id": "rt1", "lang": "en"}
        mosquitto_pub(broker, "hermes/tts/say", json.dumps({**say, "sessionId": "sess-1"}))
        line = sub.next("hermes/tts/sayFinished")
    finally:
        sub.close()
    assert json.loads(line) == {"id": "rt1", "siteId": "kitchen", "sessionId": "sess-1"}
    audio = read_wav(wav_dir(kitchen) / "rt1.wav")
    assert audio.sample_rate == 22050 and 0.8 < audio.duration < 5.0
    # what we publish about a say is never retained; state is
    done = watcher.wait("hermes/tts/sayFinished", finished("rt1"))
    assert done.retain is False
    status = watcher.wait("speakd/kitchen/status", lambda m: m.retain)
    fields = status.json()
    assert {"state", "current", "queue_length", "engine", "audio", "source"} <= set(fields)
    assert fields["engine"]["kind"] == "vits" and fields["audio"]["sink"] == "wav"


def test_only_our_sites_are_spoken(kitchen: DaemonProc, watcher: Watcher) -> None:
    since = watcher.mark()
    watcher.publish(
        "hermes/tts/say", json.dumps({"text": "Not here.", "siteId": "bedroom", "id": "s-other"})
    )
    watcher.publish("hermes/tts/say", json.dumps({"text": "No site.", "id": "s-default"}))
    watcher.publish("speakd/bedroom/say", json.dumps({"text": "Not here.", "id": "s-topic"}))
    watcher.publish(
        "hermes/tts/say", json.dumps({"text": "Group.", "siteId": "downstairs", "id": "s-group"})
    )
    done = watcher.wait("hermes/tts/sayFinished", finished("s-group", "downstairs"), since)
    assert done.json()["siteId"] == "downstairs"
    assert (wav_dir(kitchen) / "s-group.wav").exists()
    for rid in ("s-other", "s-default", "s-topic"):
        assert not watcher.matching("hermes/tts/sayFinished", finished(rid), since)
        assert not (wav_dir(kitchen) / f"{rid}.wav").exists()


def test_cancel_queued_then_stop_mid_speech(kitchen: DaemonProc, watcher: Watcher) -> None:
    since = watcher.mark()
    for rid, text in (("long1", LONG_TEXT), ("next1", "Queued behind.")):
        watcher.publish(
            "speakd/kitchen/say",
            json.dumps({"text": text, "id": rid}),
            response_topic="test/replies",
            correlation=rid.encode(),
        )
    watcher.wait(
        "speakd/kitchen/status",
        lambda m: m.json()["state"] == "speaking" and m.json()["current"] == "long1",
        since,
    )
    watcher.publish("speakd/kitchen/cancel", json.dumps({"id": "next1"}))
    reply = watcher.wait(
        "test/replies",
        lambda m: m.correlation == b"next1" and m.json()["status"] != "queued",
        since,
    )
    assert reply.json() == {"id": "next1", "status": "cancelled"}
    sent = watcher.publish("speakd/kitchen/stop", b"")
    reply = watcher.wait(
        "test/replies",
        lambda m: m.correlation == b"long1" and m.json()["status"] != "queued",
        since,
    )
    assert reply.json() == {"id": "long1", "status": "stopped"}
    assert reply.at - sent < 1.0, "stop took effect too late"
    watcher.wait("hermes/tts/sayFinished", finished("long1", "kitchen"), since)
    assert watcher.matching("hermes/tts/sayFinished", finished("next1"), since)
    assert read_wav(wav_dir(kitchen) / "long1.wav").duration < 5.0  # the full text is ~12 s


BAD_PAYLOADS = [
    ("hermes/tts/say", b"not json", "bad_json", None),
    ("speakd/kitchen/say", b"[1, 2]", "bad_request", None),
    ("speakd/kitchen/say", b'{"text": "\xff\xfe"}', "bad_encoding", None),
    ("speakd/kitchen/say", b"{" + b" " * PAYLOAD_LIMIT + b"}", "payload_too_large", None),
    ("hermes/tts/say", b'{"siteId": "kitchen", "id": "m-notext"}', "bad_text", "m-notext"),
    (  # Hermes lang picks a voice that speaks it; the embedded voice speaks English only
        "hermes/tts/say",
        b'{"text": "Hi.", "siteId": "kitchen", "lang": "zh", "id": "m-lang"}',
        "unknown_language",
        "m-lang",
    ),
    (
        "speakd/kitchen/say",
        b'{"text": "Hi.", "voice": "nobody", "id": "m-voice"}',
        "unknown_voice",
        "m-voice",
    ),
    (
        "speakd/kitchen/say",
        b'{"text": "Hi.", "priority": "loud", "id": "m-prio"}',
        "bad_priority",
        "m-prio",
    ),
    (
        "speakd/kitchen/say",
        b'{"text": "Hi.", "speed": "fast", "id": "m-speed"}',
        "bad_field",
        "m-speed",
    ),
    ("speakd/kitchen/cancel", b"{", "bad_json", None),
]


def test_malformed_payloads_publish_errors_and_the_daemon_lives(
    kitchen: DaemonProc, watcher: Watcher
) -> None:
    for topic, payload, code, rid in BAD_PAYLOADS:
        since = watcher.mark()
        watcher.publish(topic, payload)
        error = watcher.wait("hermes/error/tts", lambda m: True, since, timeout=10).json()
        assert error["error"].startswith(f"{code}: "), (payload, error)
        assert error["siteId"] == "kitchen" and error["context"] == rid
        if topic.endswith("/say"):  # every say gets its sayFinished, failed ones too
            watcher.wait("hermes/tts/sayFinished", finished(rid, "kitchen"), since, timeout=10)
    assert kitchen.proc.poll() is None
    since = watcher.mark()
    watcher.publish("speakd/kitchen/say", json.dumps({"text": "Still here.", "id": "alive1"}))
    watcher.wait("hermes/tts/sayFinished", finished("alive1"), since)


def test_a_reused_id_is_a_new_say(kitchen: DaemonProc, watcher: Watcher) -> None:
    """ "Door open" twice is two says, even while the first is still queued: only a broker's
    redelivery is a duplicate (tests/test_mqtt_journal.py)."""
    since = watcher.mark()
    say = json.dumps({"text": "Door open.", "id": "dup1"})
    watcher.publish("speakd/kitchen/say", say)
    watcher.publish("speakd/kitchen/say", say)
    for _ in range(2):  # the same correlation data twice: two says too
        watcher.publish(
            "speakd/kitchen/say",
            json.dumps({"text": "Once more."}),
            response_topic="test/dup",
            correlation=b"corr-dup",
        )
    watcher.publish("speakd/kitchen/say", json.dumps({"text": "Marker.", "id": "dup-marker"}))
    watcher.wait("hermes/tts/sayFinished", finished("dup-marker"), since)
    assert len(watcher.matching("hermes/tts/sayFinished", finished("dup1"), since)) == 2
    replies = [m.json()["status"] for m in watcher.matching("test/dup", since=since)]
    assert sorted(replies) == ["done", "done", "queued", "queued"], replies
    assert not watcher.matching("hermes/error/tts", since=since)


def test_ssml_marks_are_replies_as_playback_reaches_them(
    kitchen: DaemonProc, watcher: Watcher
) -> None:
    since = watcher.mark()
    ssml = '<speak><mark name="a"/>Door <break time="200ms"/>open<mark name="b"/></speak>'
    watcher.publish(
        "speakd/kitchen/say",
        json.dumps({"text": ssml, "id": "marks1"}),
        response_topic="test/marks",
        correlation=b"marks1",
    )
    watcher.wait("test/marks", lambda m: m.json()["status"] == "done", since)
    replies = [m.json() for m in watcher.matching("test/marks", since=since)]
    assert [r["status"] for r in replies] == ["queued", "mark", "mark", "done"]
    played = read_wav(wav_dir(kitchen) / "marks1.wav").samples()
    _, timed = socket_synth(kitchen, text="Door", words=True)
    door = next(e["start"] for e in timed if e["event"] == "word")  # "a" is on its onset
    assert replies[1] == {"id": "marks1", "status": "mark", "name": "a", "sample": door}
    assert replies[2] == {"id": "marks1", "status": "mark", "name": "b", "sample": len(played)}


def test_a_clip_speakd_lacks_is_a_warning_reply_and_the_rest_is_spoken(
    kitchen: DaemonProc, watcher: Watcher
) -> None:
    since = watcher.mark()
    watcher.publish(
        "speakd/kitchen/say",
        json.dumps({"text": '<speak>Door <audio src="yo.wav"/> open</speak>', "id": "clip1"}),
        response_topic="test/clip",
        correlation=b"clip1",
    )
    watcher.wait("test/clip", lambda m: m.json()["status"] == "done", since)
    replies = [m.json() for m in watcher.matching("test/clip", since=since)]
    assert [r["status"] for r in replies] == ["warning", "queued", "done"]
    assert replies[0]["code"] == "unknown_clip" and "yo.wav" in replies[0]["message"]
    assert read_wav(wav_dir(kitchen) / "clip1.wav").duration > 0.3


def test_a_chime_plays_before_the_text_on_both_say_topics(
    kitchen: DaemonProc, watcher: Watcher
) -> None:
    """Hermes and speakd's own say take the socket's ``chime``; an unknown one is an error."""
    sounds = Sounds(loudness=-20.0)
    ding = sounds.audio(sounds.find("ding"), lambda key: None).samples()
    since = watcher.mark()
    watcher.publish(
        "hermes/tts/say",
        json.dumps({"text": "Dinner.", "siteId": "kitchen", "id": "ch1", "chime": "ding"}),
    )
    watcher.publish("speakd/kitchen/say", json.dumps({"text": "Dinner.", "id": "ch2"}))
    watcher.publish("speakd/kitchen/say", json.dumps({"text": "Hi.", "id": "ch3", "chime": "x"}))
    for rid in ("ch1", "ch2", "ch3"):
        watcher.wait("hermes/tts/sayFinished", finished(rid), since)
    chimed, plain = (read_wav(wav_dir(kitchen) / f"{r}.wav").samples() for r in ("ch1", "ch2"))
    assert np.array_equal(chimed, np.concatenate([ding, plain]))
    [error] = watcher.matching("hermes/error/tts", since=since)
    assert error.json()["error"].startswith("unknown_chime: unknown chime 'x'")
    assert not (wav_dir(kitchen) / "ch3.wav").exists()


def test_mosquitto_rr_request_response_with_correlation_data(
    kitchen: DaemonProc, broker: Mosquitto
) -> None:
    def rr(message: str, correlation: str) -> str:
        args = ["-q", "1", "-t", "speakd/kitchen/say", "-e", "test/rr", "-m", message]
        args += ["-D", "publish", "correlation-data", correlation, "-F", "%t %p | %D", "-W", "20"]
        r = subprocess.run(
            mosquitto_cli("mosquitto_rr", broker, *args),
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert r.returncode == 0, r.stderr
        return r.stdout.strip()

    topic, _, rest = rr('{"text": "Request.", "id": "rr1"}', "req-42").partition(" ")
    payload, _, correlation = rest.rpartition(" | ")
    assert (topic, correlation) == ("test/rr", "req-42")
    assert json.loads(payload)["id"] == "rr1" and json.loads(payload)["status"] == "queued"
    out = rr('{"text": "Request.", "voice": "nobody", "id": "rr2"}', "req-43")
    payload = json.loads(out.partition(" ")[2].rpartition(" | ")[0])
    assert (payload["status"], payload["code"]) == ("error", "unknown_voice")
    assert out.endswith("| req-43")


def test_rhasspy_get_voices(kitchen: DaemonProc, watcher: Watcher) -> None:
    since = watcher.mark()
    watcher.publish("rhasspy/tts/getVoices", json.dumps({"id": "gv-other", "siteId": "bedroom"}))
    watcher.publish("rhasspy/tts/getVoices", json.dumps({"id": "gv1", "siteId": "kitchen"}))
    answer = watcher.wait("rhasspy/tts/voices", since=since, timeout=10).json()
    assert (answer["id"], answer["siteId"]) == ("gv1", "kitchen")  # not bedroom's
    assert "en_US-joe-medium" in [v["voiceId"] for v in answer["voices"]]


def test_home_assistant_discovery(kitchen: DaemonProc, watcher: Watcher) -> None:
    since = watcher.mark()
    watcher.publish("homeassistant/status", "online")
    for component in ("notify", "button", "sensor", "select"):
        watcher.wait(f"homeassistant/{component}/+/config", since=since, timeout=10)
    configs = {m.topic: m for m in watcher.matching("homeassistant/+/+/config", since=since)}
    notify = configs["homeassistant/notify/speakd_kitchen_say/config"].json()
    button = configs["homeassistant/button/speakd_kitchen_stop/config"].json()
    sensor = configs["homeassistant/sensor/speakd_kitchen_state/config"].json()
    assert not any(m.retain for m in configs.values())
    for entity in (notify, button, sensor):
        assert entity["availability_topic"] == "speakd/kitchen/availability"
        assert entity["device"]["identifiers"] == ["speakd_kitchen"]
        assert entity["origin"]["name"] == "speakd"
        assert entity["unique_id"] in {
            "speakd_kitchen_say",
            "speakd_kitchen_stop",
            "speakd_kitchen_state",
        }
    assert button["command_topic"] == "speakd/kitchen/stop"
    assert sensor["state_topic"] == "speakd/kitchen/status"
    assert sensor["value_template"] == "{{ value_json.state }}"
    # The chimes a say may name are the sensor's attributes, from the status.
    assert '"chimes": value_json.chimes' in sensor["json_attributes_template"]
    status = watcher.wait("speakd/kitchen/status", lambda m: m.retain).json()
    assert status["chimes"] == ["ding", "ding-dong", "attention"]
    # What Home Assistant sends for notify.send_message: the template rendered around the text.
    message = 'Dinner "is" ready'
    rendered = notify["command_template"].replace("{{ value | to_json }}", json.dumps(message))
    since = watcher.mark()
    watcher.publish(notify["command_topic"], rendered)
    done = watcher.wait("hermes/tts/sayFinished", finished(None, "kitchen"), since)
    assert done.json()["siteId"] == "kitchen"
    assert not watcher.matching("hermes/error/tts", since=since)
    # The default voice as a select: every voice an option, the status its state.
    select = configs["homeassistant/select/speakd_kitchen_voice/config"].json()
    assert select["options"] == ["en_US-joe-medium"]
    assert select["value_template"] == "{{ value_json.voices.default }}"
    since = watcher.mark()
    watcher.publish(select["command_topic"], "en_US-joe-medium")
    status = watcher.wait("speakd/kitchen/status", lambda m: True, since).json()
    assert status["voices"]["default"] == "en_US-joe-medium"
    since = watcher.mark()
    watcher.publish(select["command_topic"], "nobody")
    status = watcher.wait("speakd/kitchen/status", lambda m: m.json()["last_error"], since).json()
    assert status["last_error"]["code"] == "unknown_voice"
    assert status["voices"]["default"] == "en_US-joe-medium"


# ---- lifecycle: SIGKILL, offline queue, retained commands, broker restart, remote speaker -------


def test_sigkill_will_offline_and_qos1_say_queued_while_down(
    tmp_path: Path, broker: Mosquitto, watcher: Watcher
) -> None:
    # A retained command must never be acted on (it would replay on every connect).
    watcher.publish(
        "speakd/hall/say", json.dumps({"text": "Stale.", "id": "retained1"}), retain=True
    )
    try:
        d = start_mqtt_daemon(tmp_path, broker, watcher, "hall")
        since = watcher.mark()
        watcher.publish("speakd/hall/say", json.dumps({"text": "First.", "id": "hall1"}))
        watcher.wait("hermes/tts/sayFinished", finished("hall1"), since)
        assert not watcher.matching("hermes/tts/sayFinished", finished("retained1"))

        since = watcher.mark()
        d.stop(signal.SIGKILL)
        offline = watcher.wait(
            "speakd/hall/availability", lambda m: m.payload == b"offline", since, timeout=10
        )
        assert offline.retain is True

        say = {"text": "Said while you were away.", "siteId": "hall", "id": "while-down"}
        mosquitto_pub(broker, "hermes/tts/say", json.dumps(say))
        since = watcher.mark()
        d = start_daemon(d.config)
        watcher.wait("hermes/tts/sayFinished", finished("while-down", "hall"), since, timeout=60)
        assert read_wav(wav_dir(d) / "while-down.wav").duration > 0.5
        assert not (wav_dir(d) / "retained1.wav").exists()

        since = watcher.mark()
        assert d.stop() == 0, d.log_text()  # SIGTERM: offline published before a clean disconnect
        watcher.wait(
            "speakd/hall/availability", lambda m: m.payload == b"offline", since, timeout=10
        )
    finally:
        watcher.publish("speakd/hall/say", b"", retain=True)  # clear the retained command


def test_reload_in_flight_says_finish_through_the_new_client(
    tmp_path: Path, broker: Mosquitto, watcher: Watcher, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reload that replaces the MQTT client mid-utterance: the sayFinished of the say playing
    and the error + sayFinished of the one queued behind it go out through the new client."""
    monkeypatch.setattr(
        speakd.lifecycle.service, "load_engine", lambda _config: ToneEngine(word_s=0.2)
    )
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    site = "reloading"
    config = write_config(tmp_path, mqtt_toml(broker, site), sink="null", realtime=True)
    since = watcher.mark()
    d = InProcessDaemon(config).start()
    online = lambda m: m.payload == b"online"  # noqa: E731
    try:
        watcher.wait(f"speakd/{site}/availability", online, since)
        since = watcher.mark()
        long_text = " ".join(["word"] * 15)  # 3 s of tone, played in real time
        for rid, text in (("long", long_text), ("failing", "FAIL after the reload")):
            say = {"text": text, "id": rid, "priority": "message"}
            watcher.publish(f"speakd/{site}/say", json.dumps(say))
        watcher.wait(
            f"speakd/{site}/status",
            lambda m: m.json()["state"] == "speaking" and m.json()["current"] == "long",
            since,
        )
        scheduler = d.daemon.control.scheduler
        old_client = d.daemon.mqtt

        config.write_text(config.read_text().replace("[mqtt]\n", "[mqtt]\nkeepalive = 20\n"))
        asyncio.run_coroutine_threadsafe(d.daemon.reload(), d.loop).result(10)
        assert d.daemon.mqtt is not old_client, "the reload must replace the MQTT front-end"
        status = scheduler.status()
        assert status["current"] == "long" and status["queue"] == ["failing"], status

        watcher.wait("hermes/tts/sayFinished", finished("long", site), since, timeout=15)
        error = watcher.wait("hermes/error/tts", since=since, timeout=15).json()
        assert error["context"] == "failing" and error["error"].startswith("synthesis_failed")
        watcher.wait("hermes/tts/sayFinished", finished("failing", site), since, timeout=15)
    finally:
        assert d.stop() == 0


def test_remote_speaker_broker_restart_and_reload(tmp_path: Path) -> None:
    broker = Mosquitto(tmp_path / "broker").start()
    watcher = Watcher(broker, "hermes/#", "speakd/#")
    d = None
    try:
        d = start_mqtt_daemon(tmp_path, broker, watcher, "porch", 'remote_speaker = "porch-spk"')

        def say_remote(rid: str) -> tuple[Received, Received]:
            since = watcher.mark()
            watcher.publish("speakd/porch/say", json.dumps({"text": "On the speaker.", "id": rid}))
            wav = watcher.wait(f"hermes/audioServer/porch-spk/playBytes/{rid}", since=since)
            watcher.publish("hermes/audioServer/porch-spk/playFinished", json.dumps({"id": rid}))
            done = watcher.wait("hermes/tts/sayFinished", finished(rid, "porch"), since)
            return wav, done

        wav, done = say_remote("rs1")
        assert wav.payload[:4] == b"RIFF" and wav.retain is False
        path = tmp_path / "rs1.wav"
        path.write_bytes(wav.payload)
        clip = read_wav(path)
        assert clip.sample_rate == 22050 and clip.duration > 0.5
        # playFinished ended the wait, not the duration + 1 s timeout
        assert done.at - wav.at < clip.duration + 0.5
        assert not list(wav_dir(d).glob("*.wav")), "remote mode must not play locally"

        broker.restart()
        say_remote("rs2")  # reconnected (and re-subscribed) on its own
        assert "MQTT: connected" in d.log_text().split("disconnected", 1)[1]

        # SIGHUP with the remote speaker gone: MQTT restarts, audio plays locally again.
        since = watcher.mark()
        write_config(tmp_path, mqtt_toml(broker, "porch"), realtime=True)
        d.proc.send_signal(signal.SIGHUP)
        watcher.wait("speakd/porch/availability", lambda m: m.payload == b"online", since)
        since = watcher.mark()
        watcher.publish("speakd/porch/say", json.dumps({"text": "Here.", "id": "local1"}))
        watcher.wait("hermes/tts/sayFinished", finished("local1", "porch"), since)
        assert (wav_dir(d) / "local1.wav").exists()
        assert not watcher.matching("hermes/audioServer/+/playBytes/local1")
    finally:
        if d is not None:
            assert d.stop() == 0, d.log_text()
        watcher.close()
        broker.stop()


# ---- in-process pieces -------------------------------------------------------------------------


def make_tls_files(d: Path) -> dict[str, Path]:
    """A throw-away CA, a server certificate for 127.0.0.1 and a mosquitto password file."""
    ec = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes"
    (d / "ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    for cmd in (
        f"openssl req -x509 {ec} -keyout ca.key -out ca.crt -subj /CN=speakd-test-ca -days 1",
        f"openssl req {ec} -keyout server.key -out server.csr -subj /CN=localhost",
        "openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial"
        " -out server.crt -days 1 -extfile ext",
        "mosquitto_passwd -c -b passwd speakd s3cret",
    ):
        subprocess.run(cmd.split(), cwd=d, check=True, capture_output=True, timeout=30)
    return {name: d / name for name in ("ca.crt", "server.crt", "server.key", "passwd")}


async def test_tls_and_password_in_process(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The front-end on its own (tone engine): TLS to the broker, user + password from a file."""
    files = make_tls_files(tmp_path)
    broker = Mosquitto(
        tmp_path / "broker",
        listener=f"cafile {files['ca.crt']}\ncertfile {files['server.crt']}\n"
        f"keyfile {files['server.key']}\npassword_file {files['passwd']}\n",
        anonymous=False,
    ).start()
    (tmp_path / "secret").write_text("s3cret\n")
    engine = ToneEngine()
    scheduler = Scheduler(Resolver(engine), NullSink())
    control = Control(scheduler, 1000)
    rec = Recorder()
    scheduler.listeners.append(rec)
    task = asyncio.create_task(scheduler.run())
    tls = MqttConfig(
        enabled=True,
        host=broker.host,
        port=broker.port,
        site_id="tls",
        username="speakd",
        password_file=str(tmp_path / "secret"),
        tls=True,
        ca_file=str(files["ca.crt"]),
        reconnect_min_s=0.1,
        reconnect_max_s=0.2,
    )
    tls.validate()
    frontends = [MqttFrontend(control, tls)]
    try:
        await frontends[0].start()
        await until(lambda: frontends[0].connected, "the TLS connection")
        say = ["-t", "speakd/tls/say", "-m", '{"text": "one two", "id": "tls1"}', "-q", "1"]
        auth = ["--cafile", str(files["ca.crt"]), "-u", "speakd", "-P", "s3cret"]
        await asyncio.to_thread(
            subprocess.run, mosquitto_cli("mosquitto_pub", broker, *say, *auth), check=True
        )
        await settle(rec, "tls1")
        assert [e.data.get("status") for e in rec.events if e.terminal] == ["done"]

        # A wrong password (the environment wins over the file): refused, logged, no crash.
        monkeypatch.setenv("SPEAKD_MQTT_PASSWORD", "wrong")
        bad = dataclasses.replace(tls, site_id="bad", client_id="bad")
        frontends.append(MqttFrontend(control, bad))
        with caplog.at_level(logging.ERROR, logger="speakd.mqtt.client"):
            await frontends[1].start()
            await until(lambda: "refused the connection" in caplog.text, "the refusal")
        assert not frontends[1].connected
        assert "refused the connection" in caplog.text
    finally:
        for frontend in frontends:
            await frontend.close()
        task.cancel()
        broker.stop()


def test_decode_object_and_command_topics() -> None:
    assert decode_object(b"", 10, empty_ok=True) == {}
    for payload, code in (
        (b"", "bad_json"),
        (b"x" * 11, "payload_too_large"),
        (b'"s"', "bad_request"),
    ):
        with pytest.raises(RequestError) as e:
            decode_object(payload, 10)
        assert e.value.code == code
    assert parse_command_topic("speakd", "speakd/kitchen/say") == ("kitchen", "say")
    assert parse_command_topic("home/speakd", "home/speakd/hall/stop") == ("hall", "stop")
    for topic in ("speakd/kitchen/status", "speakd/a/b/say", "other/kitchen/say", "speakd//say"):
        assert parse_command_topic("speakd", topic) is None


def test_mqtt_config_keys(tmp_path: Path) -> None:
    secret = tmp_path / "pw"
    secret.write_text("s3cret\n")
    path = tmp_path / "c.toml"
    path.write_text(
        f'[mqtt]\nenabled = true\nsite_id = "kitchen"\nsite_ids = ["downstairs", "kitchen"]\n'
        f'username = "speakd"\npassword_file = "{secret}"\n'
    )
    config = load_config(path, env={}).mqtt
    assert config.sites == ["kitchen", "downstairs"]
    assert config.password(env={}) == "s3cret"
    assert config.password(env={"SPEAKD_MQTT_PASSWORD": "from-env"}) == "from-env"
    credential = tmp_path / "mqtt_password"  # systemd: SPEAKD_MQTT_PASSWORD_FILE=%d/mqtt_password
    credential.write_text("from-credential")
    env = {"SPEAKD_MQTT_PASSWORD_FILE": str(credential)}
    assert load_config(path, env=env).mqtt.password(env=env) == "from-credential"
    env = {"SPEAKD_MQTT_SITE_IDS": '["a", "b"]'}
    assert load_config(path, env=env).mqtt.site_ids == ["a", "b"]
    for bad, key in (
        ('site_ids = ["ok", 3]', "mqtt.site_ids"),
        ('site_ids = ["a/b"]', r"mqtt.site_ids\[0\]"),
        ('site_id = "kit+chen"', "mqtt.site_id"),
        ('prefix = "a/#"', "mqtt.prefix"),
        ('cert_file = "/etc/hostname"', "mqtt.key_file"),
        ('ca_file = "/nonexistent"', "mqtt.ca_file"),
        ("reconnect_max_s = 0.01", "mqtt.reconnect_max_s"),
    ):
        path.write_text(f"[mqtt]\nenabled = true\n{bad}\n")
        with pytest.raises(ConfigError, match=key):
            load_config(path, env={})
