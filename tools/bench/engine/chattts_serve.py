"""``bench chattts`` phases 3 and 4, the daemon as a whole: ``speakd serve`` from spawn to READY
(then one uncached ``say``), and cache hits over the socket and MQTT.

``speakd_tools.bench.engine.chattts`` runs the phases and reports.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ..harness.daemon import free_port
from ..harness.stats import loadavg, peak_rss_mb

# --- phase 3: start-up to READY -----------------------------------------------------------------


def _warm_page_cache(bundle: Path) -> None:
    for f in bundle.iterdir():
        if f.is_file():
            with f.open("rb") as fh:
                while fh.read(1 << 24):
                    pass


def startup(bundle: Path, threads: int, text: str, starts: int, timeout: float) -> dict[str, Any]:
    """``speakd serve`` with this bundle: seconds from spawn to READY=1 (each start), the
    daemon's VmHWM at READY, then one uncached ``say`` → the ``started`` event's latency."""
    from speakd.library.client import Client

    _warm_page_cache(bundle)
    with tempfile.TemporaryDirectory(prefix="speakd-bench-start-") as tmp:
        work = Path(tmp)
        sock = work / "speakd.sock"
        (work / "speakd.toml").write_text(
            f'[engine]\nkind = "chattts"\nbundle = "{bundle}"\nprecision = "exact"\n'
            f'threads = {threads}\nfallback_text = ""\n\n[audio]\nsink = "null"\n\n'
            f'[socket]\npath = "{sock}"\nssip_path = ""\n\n[cache]\npath = "{work / "c.db"}"\n'
        )
        notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        notify.bind(str(work / "notify.sock"))
        env = {**os.environ, "NOTIFY_SOCKET": str(work / "notify.sock")}
        env["SPEAKD_LOG_LEVEL"] = "WARNING"
        ready, rss, ttfa = [], [], None
        for n in range(starts):
            t0 = time.monotonic()
            proc = subprocess.Popen(
                [sys.executable, "-m", "speakd", "serve", "--config", str(work / "speakd.toml")],
                stdout=subprocess.DEVNULL,
                stderr=(work / f"serve{n}.log").open("wb"),
                env=env,
            )
            try:
                notify.settimeout(1.0)
                while b"READY=1" not in _recv(notify):
                    if proc.poll() is not None or time.monotonic() - t0 > timeout:
                        raise RuntimeError(
                            f"speakd serve {bundle} never sent READY=1: "
                            + (work / f"serve{n}.log").read_text()[-2000:]
                        )
                ready.append(round(time.monotonic() - t0, 3))
                rss.append(peak_rss_mb(proc.pid))
                if n == starts - 1:
                    with Client(str(sock), timeout=timeout) as c:
                        for ev in c.say({"text": text, "id": "bench-ttfa"}, wait=True):
                            if ev["event"] == "started":
                                ttfa = float(ev["latency_ms"])
                                break
                            if ev["event"] == "error":
                                raise RuntimeError(f"say failed: {ev}")
            finally:
                proc.terminate()
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    proc.kill()
        notify.close()
    return {
        "ready_s": ready,
        "ready_s_warm": min(ready[1:] or ready),
        "vmhwm_at_ready_mb": rss,
        "daemon_first_audio_ms": ttfa,
        "loadavg": loadavg(),
    }


def _recv(sock: socket.socket) -> bytes:
    try:
        return sock.recv(4096)
    except TimeoutError:
        return b""


# --- phase 4: cache hits --------------------------------------------------------------------------


def cache_hits(says: int, threads: int) -> dict[str, Any]:
    """``bench cache`` (socket, real daemon) and ``bench mqtt`` (real mosquitto), cached clips."""
    import asyncio

    from ..frontends import cache, mqtt

    out: dict[str, Any] = {"loadavg_before": loadavg()}
    for name in ("speakd", "paho"):  # per-request INFO lines would drown the table
        logging.getLogger(name).setLevel(logging.WARNING)
    ns = argparse.Namespace(
        prompts=8, jobs=[1], threads=threads, says=says, misses=0, bundle=None, pack=None
    )
    r = cache.measure(ns)
    out["socket"] = {"server_ms": r["hit_server_ms"], "client_ms": r["hit_client_ms"]}
    mosquitto = shutil.which("mosquitto")
    if mosquitto is None:
        out["mqtt"] = {"missing": "mosquitto not installed"}
        return out
    with tempfile.TemporaryDirectory(prefix="speakd-bench-mqtt-") as tmp:
        port = free_port()
        conf = Path(tmp, "m.conf")
        conf.write_text(f"listener {port} 127.0.0.1\nallow_anonymous true\nset_tcp_nodelay true\n")
        broker = subprocess.Popen([mosquitto, "-c", str(conf)], stderr=subprocess.DEVNULL)
        try:
            time.sleep(0.5)
            ns = argparse.Namespace(
                host="127.0.0.1", port=port, count=says, qos=1, threads=threads,
                client_nagle=False, miss=False,
            )  # fmt: skip
            r = asyncio.run(mqtt.measure(ns))
            out["mqtt"] = {"say_to_first_sample_ms": r["say_to_first_sample_ms"], "qos": 1}
        finally:
            broker.terminate()
            broker.wait(10)
    out["loadavg_after"] = loadavg()
    return out
