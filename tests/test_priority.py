"""Synthesis threads run ``engine.nice`` nicer than the daemon's event loop and playback
(``speakd.machine.priority``): the threads a synthesis runs on and the onnxruntime pools of the
engine, in a real daemon on the embedded voice."""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

import pytest

from speakd.config import EngineConfig
from speakd.machine import priority
from speakd_tools.bench.harness.daemon import UNIT_NICE
from tests.daemon_proc import start_daemon, write_config


def nice_of(tid: int) -> int:
    return os.getpriority(os.PRIO_PROCESS, tid)


def thread_nices(pid: int) -> dict[int, int]:
    """Each thread of ``pid`` → its nice value (field 19 of its stat, after the command's
    parenthesis, which may hold spaces)."""
    out = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            stat = (task / "stat").read_text()
        except (FileNotFoundError, ProcessLookupError):  # a thread that ended since the listing
            continue
        out[int(task.name)] = int(stat.rsplit(")", 1)[1].split()[16])
    return out


@pytest.mark.parametrize(
    ("started_at", "nice", "synthesis_at"),
    [(-5, 5, 0), (-5, 0, -5), (0, 5, 0)],
    ids=["as the unit starts it", "engine.nice 0", "started at the board's own"],
)
def test_the_daemon_synthesizes_on_lowered_threads_and_keeps_its_loop(
    tmp_path: Path, started_at: int, nice: int, synthesis_at: int
) -> None:
    """The systemd unit starts the daemon at nice -5: its synthesis threads (the onnxruntime
    pools of the prior, flow and decoder, one thread each beside the caller at engine.threads =
    2, and the synthesis worker that ran the say) run at 0, the loop and the rest at -5. Started
    at 0, nothing is lowered: synthesis never goes below the board's other programs."""
    if started_at < nice_of(0) and os.geteuid() != 0:
        pytest.skip("starting a daemon at a negative nice needs root (CI runs as root)")
    config = write_config(tmp_path, f"[engine]\nnice = {nice}\n")
    d = start_daemon(config, wrap=("nice", "-n", str(started_at - nice_of(0))))
    try:
        assert d.say("A lowered synthesis.")[-1]["status"] == "done"
        with d.client() as c:
            assert c.request({"op": "status"})["engine"]["nice"] == {
                "by": nice,
                "daemon": started_at,
                "synthesis": synthesis_at,
                "refused": 0,
            }
        nices = thread_nices(d.proc.pid)
        assert nices[d.proc.pid] == started_at  # the main thread runs the event loop
        lowered = [tid for tid, n in nices.items() if n != started_at]
        if synthesis_at != started_at:
            assert len(lowered) >= 4, nices
            assert {nices[tid] for tid in lowered} == {synthesis_at}, nices
            assert len(lowered) < len(nices) - 1, nices  # the loop's helpers are not lowered
        else:
            assert not lowered, nices
    finally:
        assert d.stop() == 0, d.log_text()[-3000:]


@pytest.mark.parametrize(
    ("base", "by", "expected"),
    [(-5, 5, 0), (-5, 3, -2), (-5, 10, 0), (0, 5, 0), (10, 5, 10), (-5, 0, -5)],
)
def test_synthesis_goes_down_to_the_boards_priority_at_most(
    monkeypatch: pytest.MonkeyPatch, base: int, by: int, expected: int
) -> None:
    monkeypatch.setattr(priority, "base_nice", lambda: base)
    assert priority.synthesis_nice(by) == expected


def test_a_thread_started_by_a_lowered_one_starts_lowered(monkeypatch: pytest.MonkeyPatch) -> None:
    """What the engine's load relies on: onnxruntime's pool threads inherit their creator's.
    (The board's priority moved up so that an unprivileged run can lower a thread.)"""
    monkeypatch.setattr(priority, "BOARD_NICE", 19)
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
    monkeypatch.setattr(priority, "BOARD_NICE", 19)
    with caplog.at_level(logging.WARNING, logger="speakd.machine.priority"):
        assert priority.run_lowered(lambda: "ran", 4) == "ran"
        assert priority.run_lowered(lambda: "ran", 4) == "ran"
    assert priority.status(4)["refused"] == 2
    warnings = [r for r in caplog.records if "keep the daemon's priority" in r.getMessage()]
    assert len(warnings) == 1


def test_the_unit_puts_synthesis_at_the_boards_priority_and_the_bench_copies_it() -> None:
    unit = (Path(__file__).parents[1] / "systemd" / "speakd.service").read_text()
    (nice,) = (int(line.split("=", 1)[1]) for line in unit.splitlines() if line.startswith("Nice="))
    assert nice + EngineConfig().nice == priority.BOARD_NICE
    assert nice == UNIT_NICE
