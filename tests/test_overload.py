"""Overload: a burst of 1000 requests at a real ``speakd serve`` over its JSON socket, and a burst
of 300 connects; every listener's backlog.

The queue is bounded (``limits.max_queue``): every request is answered at once, either ``queued``
or a ``queue_full`` error that says so; ``status`` keeps answering promptly during the burst; the
daemon's resident memory (VmRSS) does not grow with the burst; the breaker stays closed (overload
is not an engine failure). The null sink is paced like a real device, so the queue really fills.

Bench mode (docs/reliability.md, "Bench") repeats the burst: SPEAKD_BURST_ROUNDS=5.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from speakd.frontends import unixserver
from speakd.frontends.unixserver import listen_backlog
from tests.bench_report import report, rss_kb
from tests.daemon_proc import DaemonProc, start_daemon, write_config
from tests.http_daemon import free_port
from tests.waits import wait_until

REQUESTS = 1000
CONNECTIONS = 8
MAX_QUEUE = 32
ROUNDS = int(os.environ.get("SPEAKD_BURST_ROUNDS", "1"))
TEXTS = ["Burst one.", "Burst two.", "Burst three."]
RSS_GROWTH_LIMIT_MB = 20


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProc]:
    tmp = tmp_path_factory.mktemp("overload")
    config = write_config(tmp, f"[limits]\nmax_queue = {MAX_QUEUE}", sink="null", realtime=True)
    d = start_daemon(config)
    yield d
    assert d.stop() == 0, d.log_text()[-3000:]


def send_batch(path: str, first: int, count: int) -> list[dict]:
    """Pipeline ``count`` says on one connection, then read exactly one answer for each."""
    lines = b"".join(
        json.dumps(
            {"op": "say", "text": TEXTS[i % len(TEXTS)], "priority": "message", "id": f"b{i}"}
        ).encode()
        + b"\n"
        for i in range(first, first + count)
    )
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(60)
        s.connect(path)
        s.sendall(lines)
        f = s.makefile("rb")
        return [json.loads(f.readline()) for _ in range(count)]


def status_poller(d: DaemonProc, stop: threading.Event, latencies: list[float]) -> None:
    while not stop.is_set():
        t0 = time.monotonic()
        with d.client(timeout=30) as c:
            assert c.request({"op": "status"})["event"] == "status"
        latencies.append(time.monotonic() - t0)
        time.sleep(0.02)


def burst(d: DaemonProc, offset: int) -> tuple[list[dict], list[float]]:
    """REQUESTS says from CONNECTIONS clients at once, with a status poller alongside."""
    per = REQUESTS // CONNECTIONS
    latencies: list[float] = []
    stop = threading.Event()
    poller = threading.Thread(target=status_poller, args=(d, stop, latencies))
    poller.start()
    try:
        with ThreadPoolExecutor(CONNECTIONS) as pool:
            batches = pool.map(
                lambda k: send_batch(d.socket, offset + k * per, per), range(CONNECTIONS)
            )
            answers = [a for batch in batches for a in batch]
    finally:
        stop.set()
        poller.join()
    return answers, latencies


def settle(d: DaemonProc) -> dict:
    """Stop everything and wait until the daemon is idle again; its status."""
    with d.client() as c:
        c.request({"op": "stop"})

        def idle() -> dict | None:
            status = c.request({"op": "status"})
            return status if status["state"] == "idle" else None

        return wait_until(idle, "the daemon to go idle after stop", timeout=30)


def test_burst_is_bounded_answered_and_memory_flat(daemon: DaemonProc) -> None:
    # Warm-up: every text synthesized once (cached; onnxruntime's arena grown to its size),
    # then one burst to fill the allocator's pools. The baseline is taken after that.
    with daemon.client() as c:
        for text in TEXTS:
            assert list(c.say({"text": text}, wait=True))[-1]["status"] == "done"
    burst(daemon, 0)
    settle(daemon)
    base = rss_kb(daemon.proc.pid)
    for r in range(1, ROUNDS + 1):
        answers, latencies = burst(daemon, r * REQUESTS)
        kinds = Counter(a["event"] for a in answers)
        errors = [a for a in answers if a["event"] == "error"]
        assert len(answers) == REQUESTS
        assert set(kinds) <= {"queued", "error"}, kinds
        assert kinds["queued"] >= MAX_QUEUE  # the queue filled up to its bound ...
        assert len(errors) > REQUESTS // 2  # ... and the rest was refused at once
        assert {e["code"] for e in errors} == {"queue_full"}
        assert all(f"queue is full ({MAX_QUEUE} pending)" in e["message"] for e in errors)
        assert latencies and max(latencies) < 5.0, latencies
        status = settle(daemon)
        assert status["queue_length"] == 0 and status["breaker"]["state"] == "closed"
        growth_mb = (rss_kb(daemon.proc.pid) - base) / 1024
        report(
            "burst",
            round=r,
            requests=REQUESTS,
            queued=kinds["queued"],
            rejected=len(errors),
            status_p50_ms=round(sorted(latencies)[len(latencies) // 2] * 1000, 1),
            status_max_ms=round(max(latencies) * 1000, 1),
            rss_base_mb=round(base / 1024, 1),
            rss_growth_mb=round(growth_mb, 2),
        )
        assert growth_mb < RSS_GROWTH_LIMIT_MB, f"VmRSS grew {growth_mb:.1f} MB in round {r}"
    with daemon.client() as c:  # served as before, and every refusal counted
        assert c.request({"op": "voices"})["event"] == "voices"
        counters = c.request({"op": "status"})["counters"]
    assert counters["rejected"] >= (ROUNDS + 1) * REQUESTS // 2
    # every accepted request is logged with its sender's SO_PEERCRED credentials
    assert f"origin=json:pid={os.getpid()},uid={os.getuid()},gid={os.getgid()}" in daemon.log_text()


BURST_CONNECTS = 300


def test_a_burst_of_300_connects_is_all_accepted(daemon: DaemonProc) -> None:
    """Non-blocking connects, as asyncio clients make them, fail at once (EAGAIN) when the
    listen backlog is full: the listener's backlog is the system's (somaxconn), so none does."""
    socks, refused = [], 0
    try:
        for _ in range(BURST_CONNECTS):  # as fast as one thread connects, before any accept
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.setblocking(False)
            try:
                s.connect(daemon.socket)
                socks.append(s)
            except BlockingIOError:
                refused += 1
                s.close()
        assert refused == 0, f"{refused} of {BURST_CONNECTS} connects refused at the backlog"
        for s in socks:  # and each is served
            s.setblocking(True)
            s.settimeout(30)
            s.sendall(b'{"op": "status"}\n')
        for s in socks:
            assert json.loads(s.makefile("rb").readline())["event"] == "status"
    finally:
        for s in socks:
            s.close()


def test_every_listener_takes_the_system_backlog(tmp_path: Path) -> None:
    """The JSON and SSIP sockets, HTTP and Wyoming listen with somaxconn, not asyncio's 100 or
    aiohttp's 128 (``ss`` shows a listener's backlog as its Send-Q)."""
    http, wyoming = free_port(), free_port()
    extra = f'[http]\nlisten = "127.0.0.1:{http}"\n[wyoming]\nuri = "tcp://127.0.0.1:{wyoming}"'
    d = start_daemon(write_config(tmp_path, extra, sink="null"))
    try:
        unix = [["-x", "src", path] for path in (d.socket, str(tmp_path / "ssip.sock"))]
        tcp = [["-t", "sport", "=", str(port)] for port in (http, wyoming)]
        for args in unix + tcp:
            ss = subprocess.run(["ss", "-lnH", *args], capture_output=True, text=True, check=True)
            fields = ss.stdout.split()  # ... LISTEN Recv-Q Send-Q ...
            assert fields[fields.index("LISTEN") + 2] == str(listen_backlog()), (args, ss.stdout)
    finally:
        assert d.stop() == 0, d.log_text()[-3000:]


def test_a_socket_listens_from_the_moment_its_path_exists(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client that waits for the path to appear and connects at once is not refused: the
    socket listens right after bind, before the rest of set-up (its mode, its group, asyncio's
    server). Under qemu that rest took long enough for such a client to be refused."""
    path = tmp_path / "speakd.sock"
    connects: list[str] = []
    chmod = os.chmod

    def connect_then_chmod(target: Any, mode: int) -> None:
        with socket.socket(socket.AF_UNIX) as s:
            try:
                s.connect(str(path))
                connects.append("accepted")
            except OSError as e:
                connects.append(e.strerror or str(e))
        chmod(target, mode)

    monkeypatch.setattr(unixserver.os, "chmod", connect_then_chmod)
    sock = unixserver._bind(path, 0o660, "")
    sock.close()
    assert connects == ["accepted"]
