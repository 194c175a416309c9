"""``speakd doctor``'s CPU, bandwidth and speed checks (speakd.machine.hardware)."""

from __future__ import annotations

import io
import json
import math
import time
from pathlib import Path

import pytest

from speakd.config import Config, EngineConfig
from speakd.lifecycle import doctor
from speakd.machine import hardware
from speakd.machine.hardware import CpuInfo, project, read_bandwidth_gbs, read_cpu

PI5_FEATURES = "fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm"
PI5_CORE = f"""BogoMIPS\t: 108.00
Features\t: {PI5_FEATURES} lrcpc dcpop asimddp
CPU implementer\t: 0x41
CPU architecture: 8
CPU variant\t: 0x4
CPU part\t: 0xd0b
CPU revision\t: 1
"""
PI5_CPUINFO = "".join(f"processor\t: {i}\n{PI5_CORE}\n" for i in range(4)) + (
    "Model\t: Raspberry Pi 5 Model B Rev 1.0\n"
)
# What qemu-aarch64 -cpu cortex-a76 shows a guest (tests/arm64): a generic name, the A76's part.
QEMU_A76_CPUINFO = (
    "processor\t: 0\nmodel name\t: ARMv8 Processor rev 1 (v8l)\n"
    "Features\t: fp asimd aes pmull crc32 atomics asimdrdm lrcpc dcpop asimddp\n"
    "CPU implementer\t: 0x41\nCPU part\t: 0xd0b\n"
)

PI4_CPUINFO = """processor\t: 0
Features\t: fp asimd evtstrm crc32 cpuid
CPU implementer\t: 0x41
CPU part\t: 0xd08
"""

X86_CPUINFO = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 9B14
flags\t\t: fpu sse2 avx avx2 fma avx512f avx512bw avx512_vnni
processor\t: 1
model name\t: AMD EPYC 9B14
flags\t\t: fpu sse2 avx avx2 fma avx512f avx512bw avx512_vnni
"""

# The full-size ChatTTS GPT (docs/benchmarks.md "Board projection": 20 layers, 12 heads × 64).
FULL_MODEL = {"num_layers": 20, "num_heads": 12, "head_dim": 64, "kv_dtype": "float32"}


def test_pi5_cpuinfo_names_the_core_and_its_speed_features() -> None:
    cpu = read_cpu(PI5_CPUINFO, arch="aarch64")
    assert cpu.is_arm and cpu.cores == 4
    assert cpu.model == "Raspberry Pi 5 Model B Rev 1.0 (Cortex-A76)"
    assert cpu.features == {"asimd": True, "asimddp": True, "i8mm": False, "sve": False}


def test_qemu_cortex_a76_is_named_from_its_part_number() -> None:
    cpu = read_cpu(QEMU_A76_CPUINFO, arch="aarch64")
    assert cpu.model == "Cortex-A76" and cpu.features["asimddp"] and not cpu.features["i8mm"]


def test_arm_core_named_from_its_part_number_without_a_model_line() -> None:
    cpu = read_cpu(PI4_CPUINFO, arch="aarch64")
    assert cpu.model == "Cortex-A72"
    assert cpu.features["asimddp"] is False


def test_x86_cpuinfo_reports_avx2_avx512_and_vnni() -> None:
    cpu = read_cpu(X86_CPUINFO, arch="x86_64")
    assert cpu.model == "AMD EPYC 9B14" and cpu.cores == 2
    assert cpu.features == {
        "avx2": True, "avx512f": True, "avx512_vnni": True, "avx_vnni": False,
    }  # fmt: skip


def test_this_machine_is_read() -> None:
    cpu = read_cpu()
    assert cpu.arch and cpu.cores >= 1 and cpu.features


def test_bandwidth_estimate_is_quick_and_plausible() -> None:
    t0 = time.perf_counter()
    gbs = read_bandwidth_gbs(mib=64)
    assert time.perf_counter() - t0 < 5
    assert math.isfinite(gbs) and 0.1 < gbs < 2000


def test_projection_reproduces_the_board_table() -> None:
    """docs/benchmarks.md: 824.2 / 253.2 / 113.8 MB per step at context 500; Pi 5 at 9 GB/s
    gives GPT RTF 4.29 / 1.32 / 0.59 at the floor, × 1.5 here."""
    p = project("fp32", 762_800_000, FULL_MODEL, 9.0)
    assert p["fp32"].mb_per_step == pytest.approx(824.2, abs=0.5)
    assert p["int8"].mb_per_step == pytest.approx(253.2, abs=1.0)
    assert p["int4"].mb_per_step == pytest.approx(113.8, abs=1.0)
    assert p["int4"].floor_ms / hardware.MS_AUDIO_PER_STEP == pytest.approx(0.59, abs=0.01)
    assert p["int4"].rtf == pytest.approx(0.59 * 1.5, abs=0.02)
    assert not p["fp32"].real_time and p["int4"].real_time


def fake_bundle(tmp_path: Path, precision: str, gpt_bytes: int, kv: str) -> Path:
    """A manifest alone: the speed check reads sizes from it, never the weights."""
    d = tmp_path / f"bundle-{precision}"
    d.mkdir()
    manifest = {
        "format": "speakd-bundle",
        "format_version": 1,
        "engine": "chattts",
        "precision": precision,
        "files": {"gpt.onnx": {"sha256": "0" * 64, "bytes": gpt_bytes}},
        "model": {**FULL_MODEL, "kv_dtype": kv},
    }
    (d / "manifest.json").write_text(json.dumps(manifest))
    return d


def chattts_config(bundle: Path) -> Config:
    return Config(engine=EngineConfig(kind="chattts", bundle=str(bundle), precision="exact"))


PI5 = read_cpu(PI5_CPUINFO, arch="aarch64")


def test_fp32_on_a_pi5_warns_and_names_int4(tmp_path: Path) -> None:
    bundle = fake_bundle(tmp_path, "fp32", 762_800_000, "float32")
    ok, detail = doctor._check_speed(chattts_config(bundle), PI5, 9.5)
    assert ok == doctor.WARN
    assert "slower than real time" in detail
    assert "int4 would be 0.84" in detail and "--mode int4" in detail


def test_int4_on_a_pi5_is_real_time(tmp_path: Path) -> None:
    bundle = fake_bundle(tmp_path, "int4", 98_400_000, "int8")
    ok, detail = doctor._check_speed(chattts_config(bundle), PI5, 9.5)
    assert ok is True, detail
    assert detail.startswith("int4: 114 MB per GPT step")


def test_int4_without_dot_product_warns(tmp_path: Path) -> None:
    bundle = fake_bundle(tmp_path, "int4", 98_400_000, "int8")
    pi4 = read_cpu(PI4_CPUINFO, arch="aarch64")
    ok, detail = doctor._check_speed(chattts_config(bundle), pi4, 20.0)
    assert ok == doctor.WARN and "no asimddp" in detail


def test_int4_too_slow_everywhere_says_so(tmp_path: Path) -> None:
    bundle = fake_bundle(tmp_path, "int4", 98_400_000, "int8")
    ok, detail = doctor._check_speed(chattts_config(bundle), PI5, 1.0)
    assert ok == doctor.WARN and "no precision is faster" in detail


def test_embedded_voice_is_not_projected() -> None:
    ok, detail = doctor._check_speed(Config(), PI5, 9.5)
    assert ok is True and "not projected" in detail


def test_doctor_prints_cpu_and_speed_and_a_warning_keeps_exit_ok(tmp_path, monkeypatch) -> None:
    bundle = fake_bundle(tmp_path, "fp32", 762_800_000, "float32")
    config = tmp_path / "speakd.toml"
    config.write_text(
        f'[engine]\nkind = "chattts"\nbundle = "{bundle}"\nprecision = "exact"\n'
        f'[audio]\nsink = "null"\n[socket]\npath = "{tmp_path / "none.sock"}"\n'
    )
    monkeypatch.setattr(doctor, "read_cpu", lambda: PI5)
    monkeypatch.setattr(doctor, "read_bandwidth_gbs", lambda: 9.5)
    monkeypatch.setattr(doctor, "_check_engine", lambda _c: (True, "stubbed"))
    monkeypatch.setattr(doctor, "_check_voices", lambda _c: (True, "stubbed"))
    monkeypatch.setattr(doctor, "_check_socket", lambda _c, _s: (True, "stubbed"))
    out = io.StringIO()
    assert doctor.run_doctor(config, out=out) is True
    lines = out.getvalue().splitlines()
    cpu = next(line for line in lines if line.startswith("[ OK ] cpu:"))
    assert "Raspberry Pi 5" in cpu and "asimddp yes" in cpu and "i8mm no" in cpu
    assert "9.5 GB/s" in cpu
    assert any(line.startswith("[WARN] speed: fp32") for line in lines)


def test_cpuinfo_dataclass_for_unknown_arch() -> None:
    assert CpuInfo("riscv64", "x", 1).features == {}
