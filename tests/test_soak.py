"""``speakd-tools soak --minutes 2.5``: every front-end at once against a real daemon (a real
mosquitto, ``spd-say``, the ``wyoming`` and ``openai`` clients, a FIFO for a speaker) while every
fault arrives once: a reload, an engine crash and hang, a broker restart, a lost device, a full
disk under the cache, a SIGTERM and start, a package upgrade, a SIGKILL (after a burst of MQTT
says larger than the queue) and restart; no MQTT say is lost. The tool's targets must be met
(memory growth is left to the long run), and the report must show that each front-end and each
fault was really exercised (a soak that sent nothing would pass its targets too)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from speakd_tools.soak.daemon import proc_sample
from speakd_tools.soak.faults import ORDER

pytestmark = pytest.mark.skipif(
    shutil.which("spd-say") is None or shutil.which("mosquitto") is None,
    reason="spd-say (speech-dispatcher) or mosquitto missing",
)


@pytest.mark.timeout(900)  # 2.5 min of traffic, then the drain and the checks: minutes more
def test_two_minute_soak_meets_every_target(tmp_path: Path) -> None:
    out = tmp_path / "soak.json"
    soak = ["soak", "--minutes", "2.5", "--think", "1.0", "--work", str(tmp_path / "work")]
    r = subprocess.run(
        [sys.executable, "-m", "speakd_tools.cli", *soak, "--json-out", str(out)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert out.exists(), r.stdout[-3000:] + r.stderr[-3000:]
    result = json.loads(out.read_text())
    assert r.returncode == (0 if result["ok"] else 1), r.stderr[-3000:]
    # Every target but the memory one: two minutes cannot tell a warm-up (allocator arenas,
    # onnxruntime buffers, a plateau reached in the first minutes) from growth; the 30-minute
    # run in docs/reliability.md judges that. It is measured all the same.
    missed = [name for name, ok in result["targets"].items() if not ok]
    assert set(missed) <= {"rss_growth_at_most_10_percent"}, r.stdout[-5000:]
    judged = [i for i in result["incarnations"] if i["baseline_fds_threads"] is not None]
    assert len(judged) >= 2, result["incarnations"]  # the first process, and the one after the kill
    assert all(i["rss_growth"] is not None and i["idle_rss_growth"] is not None for i in judged), (
        result["incarnations"]
    )
    rows = result["frontends"]
    for name in ("json", "ssip", "mqtt", "wyoming", "http"):
        assert rows[name]["terminal"] > 0, (name, rows.get(name))
    assert sum(row["outcomes"].get("done", 0) for row in rows.values()) > 20
    assert rows["json"]["abandoned"] > 0  # clients that left mid-stream
    assert {f["fault"] for f in result["faults"]} == set(ORDER), result["faults"]
    assert [c["after"] for c in result["cache_checks"]][-1] == "the run"
    assert len(result["cache_checks"]) >= 4  # after the stop, the upgrade, the kill, the end
    assert rows["mqtt"]["missing"] == 0 and "MQTT lost: 0;" in r.stdout
    kill = next(f for f in result["faults"] if f["fault"] == "kill")
    assert "12 MQTT says acknowledged just before" in kill["detail"], kill
    assert "| json |" in r.stdout and "[ OK ] no traceback in the log" in r.stdout
    # each process's event-loop probe, from its baseline to its end (worst stall: measured, not
    # judged here; the 2-core test machine is shared)
    looped = [i["loop"] for i in judged if i["loop"] is not None]
    assert looped and all(loop["gc"]["frozen"] > 0 for loop in looped), result["incarnations"]
    assert ", event loop: worst " in r.stdout


def test_a_killed_daemon_not_yet_reaped_is_no_sample() -> None:
    """Between a SIGKILL and its reaping the daemon is a zombie, whose /proc status has no
    VmRSS: that is no sample, not an error (it once ended the soak's sampler thread at the
    first kill, so the later processes' peaks went unmeasured)."""
    child = subprocess.Popen(["sleep", "0"])
    deadline = time.monotonic() + 10
    while "State:\tZ" not in Path(f"/proc/{child.pid}/status").read_text():
        assert time.monotonic() < deadline
        time.sleep(0.01)
    try:
        assert proc_sample(child.pid, epoch=1) is None
        assert proc_sample(os.getpid(), epoch=1) is not None
    finally:
        child.wait()
