"""End to end: a real ``speakd serve`` process with the embedded voice, driven over its socket."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from speakd.audio import read_wav
from tests.daemon_proc import DaemonProc, start_daemon, synth, write_config
from tests.waits import wait_until

HELLO = "Hello from speakd. The door is open."


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("daemon")
    d = start_daemon(write_config(tmp, "[limits]\nmax_text_chars = 200\nmax_line_bytes = 4096"))
    yield d
    assert d.stop() == 0, d.log_text()


@pytest.fixture(scope="module")
def hello_wav(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``speakd synth`` of the same text, no daemon: the reference the daemon must reproduce."""
    return synth(HELLO, tmp_path_factory.mktemp("synth") / "hello.wav")


def raw_exchange(d: DaemonProc, payload: bytes, replies: int = 1) -> list[dict]:
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(30)
        s.connect(d.socket)
        s.sendall(payload)
        f = s.makefile("rb")
        return [json.loads(f.readline()) for _ in range(replies)]


def test_synth_writes_real_speech(hello_wav: Path) -> None:
    audio = read_wav(hello_wav)
    assert audio.sample_rate == 22050
    assert 1.0 < audio.duration < 5.0
    rms = np.sqrt(np.mean(audio.samples().astype(np.float64) ** 2))
    assert rms > 300, "synthesized audio is (nearly) silent"


def test_say_wait_round_trip_events_in_order(daemon: DaemonProc, hello_wav: Path) -> None:
    r = daemon.cli("say", HELLO, "--wait", "--json", "--id", "door")
    assert r.returncode == 0, r.stderr
    events = [json.loads(line) for line in r.stdout.splitlines()]
    assert [e["event"] for e in events] == ["queued", "started", "finished"]
    assert all(e["id"] == "door" for e in events)
    assert events[-1]["status"] == "done"
    played = read_wav(daemon.config.parent / "wav" / "door.wav")
    # same text, same default seed → the daemon plays exactly what `speakd synth` wrote
    assert played.pcm == read_wav(hello_wav).pcm
    # what the cache logs from its synthesis thread says which request it was (journal lines)
    line = " speakd.request.resolver: [door voice=default] stored clip "
    wait_until(lambda: line in daemon.log_text(), f"{line!r} in the log")


def test_status_and_voices(daemon: DaemonProc) -> None:
    with daemon.client() as c:
        status = c.request({"op": "status"})
        voices = c.request({"op": "voices"})
    assert status["event"] == "status"
    assert status["state"] == "idle"
    assert status["engine"]["kind"] == "vits"
    assert status["audio"]["sink"] == "wav"
    names = {v["name"] for v in voices["voices"]}
    assert "en_US-joe-medium" in names
    assert all(v["languages"] == ["en-US"] for v in voices["voices"])
    options = {o["name"]: o for o in voices["options"]}  # the engine's own declarations
    assert set(options) == {"noise_scale", "noise_w", "sentence_silence"}
    assert options["sentence_silence"]["type"] == "float" and options["noise_w"]["help"]
    assert voices["id"] is None and status["id"] is None
    with daemon.client() as c:  # every reply carries the request's id
        replies = [c.request({"op": op, "id": f"x-{op}"}) for op in ("status", "voices", "stop")]
    assert [r["id"] for r in replies] == ["x-status", "x-voices", "x-stop"]


@pytest.mark.parametrize(
    ("payload", "code"),
    [
        (b"{not json\n", "bad_json"),
        (b"[1, 2]\n", "bad_request"),
        (b'{"op": "dance"}\n', "unknown_op"),
        (b'{"op": "say", "text": "   "}\n', "empty_text"),
        (b'{"op": "say", "text": "' + b"a" * 300 + b'"}\n', "text_too_long"),
        (b'{"op": "say", "text": 42}\n', "bad_text"),
        (b'{"op": "say", "text": "hi", "voice": "nobody"}\n', "unknown_voice"),
        (b'{"op": "say", "text": "hi", "priority": "urgent"}\n', "bad_priority"),
        (b'{"op": "say", "text": "hi", "speed": "fast"}\n', "bad_field"),
        (b'{"op": "say", "text": "hi", "params": {"noise_w": 9}}\n', "bad_field"),
        (b'{"op": "say", "text": "hi", "params": {"temperature": 0.3}}\n', "bad_field"),
        (b'{"op": "say", "text": "hi", "lang": "zh"}\n', "unknown_language"),
        (b'{"op": "synth", "text": ""}\n', "empty_text"),
    ],
)
def test_bad_requests_get_clear_errors(daemon: DaemonProc, payload: bytes, code: str) -> None:
    [reply] = raw_exchange(daemon, payload)
    assert reply["event"] == "error"
    assert reply["code"] == code
    assert reply["message"]


def test_connection_survives_a_bad_line(daemon: DaemonProc) -> None:
    replies = raw_exchange(daemon, b'{oops\n{"op": "status"}\n', replies=2)
    assert [r["event"] for r in replies] == ["error", "status"]


@pytest.mark.parametrize(
    ("payload", "code"),
    [
        (b'{"op": "say", "text": "\xff\xfe"}\n', "bad_encoding"),
        (b"x" * 10000 + b"\n", "line_too_long"),
    ],
)
def test_fatal_lines_close_only_that_connection(
    daemon: DaemonProc, payload: bytes, code: str
) -> None:
    [reply] = raw_exchange(daemon, payload)
    assert reply["code"] == code
    with daemon.client() as c:  # the next client is served
        assert c.request({"op": "status"})["event"] == "status"


def test_client_vanishing_mid_stream_loses_nothing(daemon: DaemonProc) -> None:
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(daemon.socket)
        s.sendall(b'{"op": "say", "text": "Goodbye.", "id": "ghost", "wait": true}\n')
    # the request still plays to the end, and the daemon keeps serving
    wav = daemon.config.parent / "wav" / "ghost.wav"
    wait_until(wav.exists, str(wav), timeout=30)
    assert read_wav(wav).duration > 0.3
    assert daemon.cli("status").returncode == 0


def test_stop_mid_utterance(tmp_path: Path) -> None:
    d = start_daemon(write_config(tmp_path, realtime=True))
    try:
        long_text = " ".join(["The next train to the airport leaves from platform four."] * 4)
        with d.client(timeout=None) as c:
            events = c.say({"text": long_text, "id": "long"}, wait=True)
            assert next(events)["event"] == "queued"
            assert next(events)["event"] == "started"  # its first block is on the sink
            t0 = time.monotonic()
            with d.client() as control:
                assert control.request({"op": "stop"})["stopped"] == 1
            final = next(events)
        assert time.monotonic() - t0 < 0.5
        assert final == {"event": "finished", "id": "long", "status": "stopped"}
        played = read_wav(tmp_path / "wav" / "long.wav").duration
        assert 0.0 < played < 3.0  # far less than the ~12 s the text lasts
    finally:
        assert d.stop() == 0


def test_bad_config_names_the_key(tmp_path: Path) -> None:
    config = tmp_path / "bad.toml"
    config.write_text("[mqtt]\nport = 99999\n")
    r = subprocess.run(
        [sys.executable, "-m", "speakd", "serve", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2
    assert "mqtt.port" in r.stderr


def test_doctor_reports_each_check(daemon: DaemonProc) -> None:
    r = daemon.cli("doctor", "--config", str(daemon.config))
    assert r.returncode == 0, r.stdout + r.stderr
    for name in ("config", "engine", "audio", "daemon", "mqtt"):
        assert f"] {name}:" in r.stdout
    assert '"sink": "wav"' in r.stdout


def test_client_without_daemon_says_how_to_fix(tmp_path: Path) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "speakd", "say", "hi", "--socket", str(tmp_path / "none.sock")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 1
    assert "is speakd running" in r.stderr


def test_synth_op_streams_the_audio_back_without_playing_it(daemon: DaemonProc) -> None:
    """The socket's ``synth``: the same bytes ``speakd synth`` makes (first a synthesis, then a
    cache hit), nothing written to the board's sink; ``say --output`` is its CLI."""
    text = "Fetched, not played."
    reference = synth(text, daemon.config.parent / "reference.wav")
    out = daemon.config.parent / "fetched.wav"
    for cached in (False, True):
        r = daemon.cli("say", text, "--output", str(out), "--json", "--id", f"fetch-{cached}")
        assert r.returncode == 0, r.stderr
        finished = json.loads(r.stdout)
        assert finished == {**finished, "event": "finished", "status": "done", "cached": cached}
        assert read_wav(out).pcm == read_wav(reference).pcm
    assert not (daemon.config.parent / "wav" / "fetch-False.wav").exists()
    events = raw_exchange(daemon, b'{"op":"synth","text":"Hi.","id":"s1"}\n', replies=2)
    assert events[0]["event"] == "audio" and events[0]["id"] == "s1"
    assert events[0]["format"] == {"encoding": "s16le", "rate": 22050, "width": 2, "channels": 1}


def test_half_closed_client_still_gets_every_event(daemon: DaemonProc) -> None:
    """``printf '{…"wait":true}\\n' | socat -t 30 - UNIX-CONNECT:…`` half-closes after its
    request: it must still read queued, started and finished, and the audio of a synth."""
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(30)
        s.connect(daemon.socket)
        s.sendall(
            b'{"op":"say","text":"Half closed.","id":"half","wait":true}\n'
            b'{"op":"synth","text":"Half closed.","id":"half-synth"}\n'
        )
        s.shutdown(socket.SHUT_WR)
        events = [json.loads(line) for line in s.makefile("rb")]
    said = [e["event"] for e in events if e["id"] == "half"]
    assert said == ["queued", "started", "finished"]
    fetched = [e["event"] for e in events if e["id"] == "half-synth"]
    assert fetched[-1] == "finished" and set(fetched[:-1]) == {"audio"}
