"""``speakd-tools bench`` plumbing (no timing): contenders found or reported missing, the bytes a
decode step reads, the board projection, the table, the GPT-step phase on the tiny bundle."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from speakd_tools.bench.engine.chattts import _parse_bundles, find_contenders
from speakd_tools.bench.engine.chattts_report import table
from speakd_tools.bench.engine.chattts_step import projection, run_steps, step_bytes
from speakd_tools.bench.harness.stats import peak_rss_mb, percentile, summary


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
    from speakd_tools.bench.engine.engine import playback

    # on time: each chunk arrives before the audio ahead of it has played
    smooth = playback([(0.3, 0.2), (0.45, 0.5), (0.9, 2.0)])
    assert smooth["stall_s"] == 0.0 and smooth["gapless_first_audio_s"] == 0.3
    # chunk 2 comes 0.4 s after chunk 1's 0.2 s ran out; chunk 3 is late by 0.1 s more
    late = playback([(0.3, 0.2), (0.9, 0.5), (1.5, 1.0)])
    assert late["stall_s"] == pytest.approx(0.4 + 0.1)
    # starting 0.5 s later covers the worst lateness: chunk 3 at 1.5 s vs 0.3 + 0.7 s of audio
    assert late["gapless_first_audio_s"] == pytest.approx(0.3 + 0.5)
    assert playback([]) == {"stall_s": 0.0, "gapless_first_audio_s": 0.0}


def test_every_benchmark_module_is_a_subcommand_and_a_bare_bench_names_them() -> None:
    import speakd_tools.bench as bench_pkg
    from speakd_tools.bench.cli import BENCHMARKS, MODULES

    folder = Path(bench_pkg.__file__).parent
    measuring = {
        ".".join(p.relative_to(folder).with_suffix("").parts)
        for p in folder.rglob("*.py")
        if "\ndef add_arguments(" in p.read_text()
    } - {"cli"}
    assert measuring == set(MODULES.values())
    assert set(MODULES) == set(BENCHMARKS)
    r = subprocess.run(
        [sys.executable, "-m", "speakd_tools.cli", "bench"], capture_output=True, text=True
    )
    assert r.returncode == 2
    assert all(name in r.stderr for name in BENCHMARKS), r.stderr


def test_bench_help_lists_every_benchmark_with_its_summary() -> None:
    """``speakd-tools bench --help`` prints each subcommand's one line as written (a ``%`` in one,
    fleet's "50/99/100 %", once made argparse raise instead of printing the help)."""
    from speakd_tools.bench.cli import BENCHMARKS

    r = subprocess.run(
        [sys.executable, "-m", "speakd_tools.cli", "bench", "--help"],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    flat = " ".join(r.stdout.split())
    assert all(" ".join(summary.split()) in flat for summary in BENCHMARKS.values()), r.stdout


def test_percentiles_are_measured_values_by_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]  # 1..100
    assert percentile(values, 50) == 51.0  # rank round(0.5 * 99) = 50 → the 51st value
    assert percentile(values, 99) == 99.0
    assert percentile([3.0], 90) == 3.0
    s = summary([1.0, 2.0, 3.0, 10.0])
    assert s["n"] == 4 and s["max"] == 10.0 and s["mean"] == 4.0
    assert s["p50"] in (2.0, 3.0) and s["p99"] == 10.0
    with pytest.raises(ValueError):
        percentile([], 50)


def test_a_childs_peak_memory_is_its_own_not_its_parents() -> None:
    """The parent holds ~300 MB; a child measured with ``in_child`` reports its own small peak
    (``ru_maxrss`` would carry the parent's over fork + exec)."""
    ballast = bytearray(300 << 20)
    ballast[::4096] = b"x" * len(ballast[::4096])  # touch every page: resident
    assert peak_rss_mb() > 300
    child = "from speakd_tools.bench.harness.stats import peak_rss_mb; print(peak_rss_mb())"
    r = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, check=True)
    assert float(r.stdout) < 150
    del ballast


def test_machine_line_names_the_cpu_its_flags_and_bandwidth_or_says_what_is_missing() -> None:
    from speakd_tools.bench.harness.machine import ISA_FLAGS, cpu, line

    info = {
        "model": "Some CPU",
        "logical_cores": 2,
        "flags": {"avx2": True, "avx512f": False},
        "read_gb_s": {"1": 10.6, "2": 20.1},
    }
    assert line(info) == (
        "Machine: Some CPU, 2 logical cores; avx2 (not avx512f); "
        "DRAM read 10.6 GB/s (1 thread), 20.1 GB/s (2 threads)."
    )
    assert line({**info, "read_gb_s": None}).endswith("; read bandwidth not measured.")
    assert line({"cpus": 2}) == "Machine: not recorded."  # a result saved before machine lines
    assert set(cpu()["flags"]) == set(ISA_FLAGS)


def test_bench_json_carries_the_machine_and_each_contenders_floor_and_step(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``machine: {cpu, flags, read_gbps}``; per contender ``floor_ms`` and ``step_ms`` by
    context, floor = bytes one step reads ÷ the bandwidth measured with the bench's threads
    (torch reads the fp32 bytes); the table prints step ÷ floor."""
    from speakd_tools.bench.engine.chattts_step import floors
    from speakd_tools.bench.harness import machine

    monkeypatch.setattr(machine, "read_bandwidth", lambda threads, **_: 10.0 * threads)
    info = machine.describe(threads=2)
    assert {"cpu", "flags", "read_gbps"} <= set(info) and info["read_gbps"] == 20.0
    assert set(info["flags"]) == set(machine.ISA_FLAGS)
    assert "read_gbps" not in machine.describe(bandwidth=False)

    cell = {"median_ms": 4.0, "best_round_ms": 3.9, "p90_ms": 4.4, "n": 10}
    result = {
        "options": {"contexts": [100, 500]},
        "machine": {**info, "loadavg_start": [1, 1, 1], "loadavg_end": [1, 1, 1]},
        "contenders": {
            n: {"name": n, "path": "x", "missing": ""} for n in ("torch", "fp32", "int4")
        },
        "steps": {
            "loadavg_before": [1, 1, 1],
            "torch": {"100": {**cell, "median_ms": 80.0}, "500": {**cell, "median_ms": 90.0}},
            "fp32": {"100": {**cell, "median_ms": 40.0}, "500": {**cell, "median_ms": 44.0}},
            "int4": {"100": cell, "500": {**cell, "median_ms": 5.0}},
        },
        "bytes_per_step": {
            "fp32": {"weights": 760_000_000, "kv": {"100": 12_288_000, "500": 61_440_000}},
            "int4": {"weights": 98_000_000, "kv": {"100": 3_072_000, "500": 15_360_000}},
        },
    }
    got = floors(result)
    assert got["int4"]["step_ms"] == {"100": 4.0, "500": 5.0}
    assert got["int4"]["floor_ms"]["500"] == pytest.approx(113.36e6 / 20e9 * 1e3, abs=1e-3)
    assert got["torch"]["floor_ms"] == got["fp32"]["floor_ms"]  # the same fp32 weights and KV
    json.dumps(got)  # plain JSON
    for name, cells in got.items():
        result["contenders"][name].update(cells)
    text = table(result)
    assert "GPT step ÷ bandwidth floor (bytes one step reads ÷ 20.0 GB/s" in text
    assert "| int4 | 4.00 / 5.05 | 0.79× | 5.00 / 5.67 | 0.88× |" in text


def test_kernel_paths_follow_mlas_dispatch_amx_serves_int8_only() -> None:
    from speakd_tools.bench.engine.step import kernel_paths

    xeon = {"avx2": True, "avx512f": True, "avx512_vnni": True, "avx_vnni": True, "amx_int8": True}
    paths = kernel_paths(xeon)
    assert paths["int8"].startswith("AMX") and "AVX-512 VNNI" in paths["int4"]
    zen3 = kernel_paths({"avx2": True})
    assert "AVX2" in zen3["int8"] and "AVX2" in zen3["int4"] and zen3["fp32"].startswith("AVX2")
    assert "udot" in kernel_paths({"asimddp": True})["int4"]


def test_floor_counts_the_multiply_adds_of_conv_conv_transpose_and_matmul() -> None:
    """2 × multiply-adds: Conv (6 out × 10 steps × 4 in × 3 taps), ConvTranspose (6 in × 10 steps
    × 2 out × 4 taps), MatMul (1 × 2 × 10 rows × 6 × 5) with its batch known only from ``a``."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    from speakd_tools.bench.engine.floor import flops

    def w(name: str, *shape: int) -> object:
        return numpy_helper.from_array(np.ones(shape, np.float32), name)

    nodes = [
        helper.make_node("Conv", ["x", "wc"], ["c"], kernel_shape=[3], pads=[1, 1]),
        helper.make_node("ConvTranspose", ["c", "wt"], ["t"], kernel_shape=[4], strides=[2],
                         pads=[1, 1]),
        helper.make_node("Transpose", ["c"], ["ct"], perm=[0, 2, 1]),
        helper.make_node("Reshape", ["ct", "shape"], ["r"]),
        helper.make_node("MatMul", ["r", "wm"], ["m"]),
    ]  # fmt: skip
    shape = numpy_helper.from_array(np.array([1, 2, -1, 6], np.int64), "shape")
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4, "t"])],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in ("t", "m")],
        [w("wc", 6, 4, 3), w("wt", 6, 2, 4), w("wm", 6, 5), shape],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    total, unknown = flops(model, {"x": [1, 4, 20]})
    assert unknown == 0
    assert total == 2 * (6 * 20 * 4 * 3 + 6 * 20 * 2 * 4 + 1 * 2 * 10 * 6 * 5)


def test_floor_times_every_part_of_a_new_text_s_first_chunk_on_the_embedded_voice() -> None:
    import argparse

    from speakd_tools.bench.engine.floor import PARTS, measure, table

    args = argparse.Namespace(
        seed=3, texts=1, runs=1, pitch=1.2, threads=2, bundle=None, no_bandwidth=True
    )
    r = measure(args)
    for kind in r["kinds"].values():
        parts = kind["parts"]
        assert list(parts) == list(PARTS)
        measured = [p for name, p in parts.items() if name != "duration predictor, alignment"]
        assert all(p["ms"] > 0 for p in measured)  # the predictor's is the prior less the encoder
        assert parts["duration predictor, alignment"]["ms"] >= 0
        assert parts["phonemes"]["gflop"] == 0
        # the encoder's FFN alone: 6 layers × 2 kernel-3 Convs of 192 × 768 channels per id
        assert parts["text encoder"]["gflop"] > 6 * 2 * 2 * 192 * 768 * 3 * kind["ids"] / 1e9
        assert parts["flow"]["gflop"] > 0 and parts["decoder"]["gflop"] > 0
    assert min(r["gemm_gflops"].values()) > 0
    assert "engine to first chunk" in table(r)


def test_attention_profile_runs_every_kv_type_and_counts_the_cache_it_reads() -> None:
    from speakd_tools.bench.engine.attention import KV_TYPES, Shape, table

    shape = Shape(layers=2, heads=2, head_dim=16, max_context=32)  # GQA: head size a multiple of 16
    cells = table(shape, rows=[1, 3], ctx=5, threads=1)
    assert [(c["rows"], c["kv"]) for c in cells] == [(r, kv) for r in (1, 3) for kv in KV_TYPES]
    for c in cells:
        size = KV_TYPES[c["kv"]][2]
        # rows · layers · (K, V) · heads · context · head size · bytes
        assert c["kv_mb"] * 1e6 == pytest.approx(c["rows"] * 2 * 2 * 2 * 5 * 16 * size)
        assert c["ms"] > 0 and c["gb_s"] == pytest.approx(c["kv_mb"] / c["ms"])  # MB per ms


def test_gemm_profile_times_both_invariant_kernels_and_the_int8_one_multiplies() -> None:
    import numpy as np
    import onnxruntime as ort

    from speakd_tools.bench.engine.profile import _matmul_int8_model, gemm
    from speakd_tools.calibrate.rowquant import weight_int8

    cells = gemm([1, 4], k=64, n=128)
    assert [(c["rows"], c["kernel"].split()[0]) for c in cells] == [
        (1, "int4"), (1, "int8"), (4, "int4"), (4, "int8")
    ]  # fmt: skip
    assert all(c["gops"] == pytest.approx(2 * c["rows"] * 64 * 128 / c["us"] / 1e3) for c in cells)
    # the int8 graph is the product the per-row graphs compute: (x − 128) · Wq, exact in int32
    sess = ort.InferenceSession(_matmul_int8_model(64, 128), providers=["CPUExecutionProvider"])
    x = np.random.default_rng(2).integers(0, 256, (3, 64)).astype(np.uint8)
    wq, _ = weight_int8(np.random.default_rng(0).normal(0, 0.02, (64, 128)).astype(np.float32))
    (y,) = sess.run(None, {"x": x})
    assert np.array_equal(y, (x.astype(np.int32) - 128) @ wq.astype(np.int32))
