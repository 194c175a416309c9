"""Synthesis threads run ``engine.nice`` nicer than the daemon's event loop and playback
(``speakd.machine.priority``): the threads a synthesis runs on and the onnxruntime pools of the
engine, in a real daemon on the embedded voice."""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

import pytest

from speakd.machine import priority
from tests.daemon_proc import start_daemon, write_config


def nice_of(tid: int) -> int:
    return os.getpriority(os.PRIO_PROCESS, tid)


def thread_nices(pid: int) -> dict[int, int]:
    """Each thread of ``pid`` → its nice value (field 19 of its stat, after the command's
    parenthesis, which may hold spaces)."""
    out = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        stat = (task / "stat").read_text()
        out[int(task.name)] = int(stat.rsplit(")", 1)[1].split()[16])
    return out


@pytest.mark.parametrize("nice", [5, 0])
def test_the_daemon_synthesizes_on_lowered_threads_and_keeps_its_loop(
    tmp_path: Path, nice: int
) -> None:
    base = nice_of(0)
    d = start_daemon(write_config(tmp_path, f"[engine]\nnice = {nice}\n"))
    try:
        assert d.say("A lowered synthesis.")[-1]["status"] == "done"
        with d.client() as c:
            assert c.request({"op": "status"})["engine"]["nice"] == {"by": nice, "refused": 0}
        nices = thread_nices(d.proc.pid)
        assert nices[d.proc.pid] == base  # the main thread runs the event loop
        lowered = [tid for tid, n in nices.items() if n == base + nice and tid != d.proc.pid]
        if nice:
            # onnxruntime's pools of the prior, flow and decoder (one thread each beside the
            # caller at engine.threads = 2) and the synthesis worker that ran the say
            assert len(lowered) >= 4, nices
            assert len(lowered) < len(nices) - 1, nices  # the loop's helpers are not lowered
        else:
            assert set(nices.values()) == {base}, nices
    finally:
        assert d.stop() == 0, d.log_text()[-3000:]


def test_a_thread_started_by_a_lowered_one_starts_lowered() -> None:
    """What the engine's load relies on: onnxruntime's pool threads inherit their creator's."""
    seen: dict[str, int] = {}

    def load() -> str:
        seen["loader"] = nice_of(0)
        child = threading.Thread(target=lambda: seen.setdefault("child", nice_of(0)))
        child.start()
        child.join()
        return "engine"

    assert priority.run_lowered(load, 3) == "engine"
    base = priority.base_nice()
    assert seen == {"loader": min(19, base + 3), "child": min(19, base + 3)}
    assert nice_of(0) == base  # the caller is untouched


def test_run_lowered_raises_what_the_load_raised() -> None:
    def load() -> None:
        raise ValueError("corrupt model")

    with pytest.raises(ValueError, match="corrupt model"):
        priority.run_lowered(load, 2)


def test_a_refusal_is_logged_once_counted_and_synthesis_goes_on(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def refuse(*_args: int) -> None:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "setpriority", refuse)
    monkeypatch.setattr(priority, "_refused", 0)
    with caplog.at_level(logging.WARNING, logger="speakd.machine.priority"):
        assert priority.run_lowered(lambda: "ran", 4) == "ran"
        assert priority.run_lowered(lambda: "ran", 4) == "ran"
    assert priority.status(4) == {"by": 4, "refused": 2}
    warnings = [r for r in caplog.records if "keep the daemon's priority" in r.getMessage()]
    assert len(warnings) == 1
