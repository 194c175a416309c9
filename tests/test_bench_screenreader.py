"""``speakd-tools bench screenreader`` against speakd alone (``--quick``): Orca's SSIP script runs
to its end with every command answered 2xx, and every row of the report gets its samples.
Speech Dispatcher's half is the real run's (the bench reports it missing, never fakes it)."""

from __future__ import annotations

import json
import subprocess
import sys

from speakd_tools.bench.screenreader.daemon_parts import KINDS
from speakd_tools.bench.screenreader.screenreader import NAV_ROWS, ROWS, marked, report


def test_orca_marks_every_word_at_its_offsets() -> None:
    assert marked("Name: text") == '<speak><mark name="0:5"/>Name: <mark name="6:10"/>text</speak>'


def test_quick_replay_on_speakd_measures_every_row() -> None:
    r = subprocess.run(
        [
            *(sys.executable, "-m", "speakd_tools.cli", "bench", "screenreader"),
            *("--quick", "--only", "speakd", "--json", "--floor"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    result = json.loads(r.stdout)
    speakd = result["contenders"]["speakd"]
    for key, _ in ROWS:
        assert speakd[key]["n"] > 0, key
        assert 0 < speakd[key]["p50"] <= speakd[key]["p99"] < 5000, key
    # Marks are positions in one utterance: the same sentences last as long with them as without
    # (measured 1.000–1.002×; before marks became positions, 1.51×).
    assert 0.95 <= speakd["marked_ratio"] <= 1.05, speakd["marked_ratio"]
    assert speakd["marks_before_begin"][1] >= 1
    assert "speechd" not in result["contenders"]
    for key, *_ in NAV_ROWS:  # new text: SPEAK → 701, and → its first sound (after 701)
        assert speakd[key]["n"] > 0, key
    assert speakd["nav_first"]["p50"] >= speakd["nav_begin"]["p50"]
    assert speakd["nav_silent"] == 0
    slowest = [ms for ms, _ in speakd["slowest"]]
    assert len(slowest) == 5 and slowest == sorted(slowest, reverse=True)
    echoes = [speakd[key]["max"] for key, _ in ROWS if key != "canceled"]
    assert slowest[0] >= round(max(echoes), 1)  # with say-all's key, which no row counts
    text = report(result)
    assert "| keypress → 701 BEGIN, 700 ms/key |" in text
    assert "| new line or menu item: SPEAK → first audio |" in text
    assert f"speakd, slowest echoes: {slowest[0]} ms " in text
    assert "Machine: " in text
    # speakd's own figures: its event loop's stalls since the warm-up, and by kind of text the
    # engine's parts up to the first chunk (its log) beside bench floor's on the same texts
    assert speakd["loop"]["gc"]["frozen"] > 0 and speakd["loop"]["at_least_ms"]
    assert "speakd's event loop during the run: worst " in text
    kinds = speakd["parts"]
    assert set(kinds) == set(result["floor"]["kinds"]) == set(KINDS.values())
    for kind in kinds.values():
        assert {"phonemes", "prior", "flow", "decoder", "first chunk"} <= set(kind["parts"])
        # each part is a piece of every first chunk, so its median is no larger (a sum of
        # medians may be: under load, 108.7 against a median first chunk of 107.9 ms)
        first = kind["parts"]["first chunk"]
        assert all(v <= first + 0.1 for v in kind["parts"].values()), kind["parts"]
        assert kind["first_audio"] > 0
    assert "× floor (daemon)" in text and "| line (3) |" in text
