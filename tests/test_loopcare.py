"""The event loop's pauses (``speakd.lifecycle.loopcare``): the probe records a stall caused on
purpose in a real daemon, whose status shows its garbage-collector settings; the idle collector
collects only when the daemon is idle (or has not been for too long)."""

from __future__ import annotations

import asyncio
import gc
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from speakd.lifecycle import loopcare
from speakd.lifecycle.loopcare import GEN2_OFF, LoopCare
from tests.daemon_proc import start_daemon, write_config
from tests.waits import wait_until

WEDGE_S = 0.3


def test_the_probe_records_a_stall_of_the_loop_and_gc_is_set(tmp_path: Path) -> None:
    daemon = start_daemon(write_config(tmp_path), env={"SPEAKD_DEBUG_WEDGE": str(WEDGE_S)})
    try:
        with daemon.client() as c:
            loop = c.request({"op": "status"})["loop"]
        assert loop["gc"]["frozen"] > 10_000  # the voice's and the modules' objects
        assert loop["gc"]["threshold"][2] == GEN2_OFF
        assert loop["worst_stall_ms"] < WEDGE_S * 1e3
        daemon.proc.send_signal(signal.SIGUSR2)  # $SPEAKD_DEBUG_WEDGE: the loop sleeps WEDGE_S

        def stalled() -> dict | None:
            with daemon.client() as c:
                loop = c.request({"op": "status"})["loop"]
            return loop if loop["worst_stall_ms"] >= WEDGE_S * 1e3 * 0.9 else None

        loop = wait_until(stalled, "the probe to record the wedge", 20)
        assert max(ms for _t, ms in loop["stalls"]) == loop["worst_stall_ms"]
    finally:
        daemon.stop()


@pytest.fixture
def gc_restored() -> Iterator[None]:
    threshold = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*threshold)


@pytest.mark.parametrize("idle", [True, False])
async def test_full_collections_wait_for_idle(
    monkeypatch: pytest.MonkeyPatch, gc_restored: None, idle: bool
) -> None:
    monkeypatch.setattr(loopcare, "IDLE_CHECK_S", 0.01)
    monkeypatch.setattr(loopcare, "IDLE_GC_S", 0.0)
    checked = asyncio.Event()

    def is_idle() -> bool:
        checked.set()
        return idle

    care = LoopCare(is_idle)
    tasks = care.start()
    try:
        assert gc.get_threshold()[2] == GEN2_OFF and gc.get_freeze_count() > 0
        for _ in range(3):  # three checks of the collector
            checked.clear()
            await asyncio.wait_for(checked.wait(), 10)
        assert (care.collections > 0) == idle
        assert care.status()["gc"]["idle_collections"] == care.collections
    finally:
        for task in tasks:
            task.cancel()
