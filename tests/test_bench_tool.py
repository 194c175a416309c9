"""``speakd-tools bench`` plumbing (no timing): contenders found or reported missing, the bytes a
decode step reads, the board projection, the table, the GPT-step phase on the tiny bundle."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from speakd_tools.bench import (
    _parse_bundles,
    find_contenders,
    projection,
    run_steps,
    step_bytes,
)
from speakd_tools.bench_report import table


def test_missing_contenders_are_reported_not_faked(tmp_path: Path) -> None:
    got = {c.name: c for c in find_contenders(None, {"fp32": str(tmp_path / "nope")})}
    assert set(got) == {"torch", "fp32", "int8", "int4"}
    assert all(not c.present for c in got.values())
    assert "no --checkpoint" in got["torch"].missing
    assert "manifest.json missing" in got["fp32"].missing


def test_bundles_argument_names_the_bad_item() -> None:
    assert _parse_bundles(["int4=/m/x"]) == {"int4": "/m/x"}
    with pytest.raises(ValueError, match="'int5=/m/x'"):
        _parse_bundles(["int5=/m/x"])


def test_projection_is_bytes_over_bandwidth() -> None:
    proj = projection({"int4": {"weights": 98_000_000, "kv": {"500": 15_360_000}}})
    row = proj["int4"]["500"]
    assert row["mb_per_step"] == pytest.approx(113.4, abs=0.1)
    assert row["RK3588"]["ms_per_step"] == [9.1, 9.1]  # 113.36 MB / 12.4 GB/s
    fast, slow = row["Raspberry Pi 5"]["ms_per_step"]
    assert fast < slow  # 10.5 vs 9 GB/s
    assert row["RK3588"]["gpt_rtf"][0] == pytest.approx(9.1 / 21.33, abs=0.01)


@pytest.mark.host
def test_step_bytes_and_steps_phase_on_the_tiny_bundle(
    tiny_bundle: Path, tiny_checkpoint: Path
) -> None:
    b = step_bytes(tiny_bundle, (100, 500))
    gpt = (tiny_bundle / "gpt.onnx").stat().st_size
    assert 0.9 * gpt < b["weights"] < gpt  # every weight, not the RoPE tables
    model = json.loads((tiny_bundle / "manifest.json").read_text())["model"]
    per_pos = 2 * model["num_layers"] * model["num_heads"] * model["head_dim"] * 4
    assert b["kv"] == {"100": 100 * per_pos, "500": 500 * per_pos}

    spec = {
        "contenders": [
            {"name": "torch", "path": str(tiny_checkpoint), "missing": ""},
            {"name": "fp32", "path": str(tiny_bundle), "missing": ""},
        ],
        "contexts": [10, 30],
        "rounds": 2,
        "steps_per_round": 2,
        "warmup": 1,
        "threads": 1,
        "seed": 0,
    }
    r = run_steps(spec)
    for name in ("torch", "fp32"):
        for ctx in ("10", "30"):
            assert r[name][ctx]["n"] == 4
            assert r[name][ctx]["median_ms"] > 0
    result = {
        "options": {"contexts": [10, 30]},
        "machine": {"loadavg_start": [1, 1, 1], "loadavg_end": [1, 1, 1]},
        "contenders": {
            "torch": spec["contenders"][0],
            "fp32": spec["contenders"][1],
            "int8": {"name": "int8", "path": "x", "missing": "x: no bundle"},
        },
        "steps": r,
    }
    text = table(result)
    assert "| int8 | missing: x: no bundle |" in text
    assert "Ratio to torch" in text and "Speed-up vs torch: fp32: GPT ms/step ctx10" in text


def test_playback_counts_gaps_and_the_start_that_avoids_them() -> None:
    from speakd_tools.bench_engine import playback

    # on time: each chunk arrives before the audio ahead of it has played
    smooth = playback([(0.3, 0.2), (0.45, 0.5), (0.9, 2.0)])
    assert smooth["stall_s"] == 0.0 and smooth["gapless_first_audio_s"] == 0.3
    # chunk 2 comes 0.4 s after chunk 1's 0.2 s ran out; chunk 3 is late by 0.1 s more
    late = playback([(0.3, 0.2), (0.9, 0.5), (1.5, 1.0)])
    assert late["stall_s"] == pytest.approx(0.4 + 0.1)
    # starting 0.5 s later covers the worst lateness: chunk 3 at 1.5 s vs 0.3 + 0.7 s of audio
    assert late["gapless_first_audio_s"] == pytest.approx(0.3 + 0.5)
    assert playback([]) == {"stall_s": 0.0, "gapless_first_audio_s": 0.0}
