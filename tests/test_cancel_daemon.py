"""A cancel does not wait for the playing block (issue 35): a real ``speakd serve`` (embedded
voice, WAV sink paced in real time, half-second blocks) answers SSIP ``CANCEL`` with ``703`` well
inside a block, wherever in the block it lands: the short version of ``bench cancel``."""

from __future__ import annotations

from pathlib import Path

from speakd_tools.bench.frontends.cancel import measure
from tests.daemon_proc import start_daemon, write_config

BLOCK_MS = 500


def test_cancel_to_canceled_is_well_under_one_block(tmp_path: Path) -> None:
    config = write_config(tmp_path, realtime=True)
    config.write_text(
        config.read_text().replace("realtime = true", f"realtime = true\nblock_ms = {BLOCK_MS}")
    )
    d = start_daemon(config)
    try:
        took = measure(str(tmp_path / "ssip.sock"), 6, BLOCK_MS)
    finally:
        assert d.stop() == 0, d.log_text()
    # at the block boundary these were spread over 0-500 ms (median ~250); now a few ms each (the
    # median, so one slow thread wake-up on a loaded machine does not fail it)
    assert sorted(took)[len(took) // 2] < BLOCK_MS / 10, took
