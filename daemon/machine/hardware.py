"""What this CPU offers speakd: the instruction-set features that pick onnxruntime's kernels, a
quick DRAM read-bandwidth estimate, and the decode speed that bandwidth allows (``speakd doctor``).

A ChatTTS decode step reads every GPT weight once plus the KV cache up to the context, and on
small boards it is bound by memory bandwidth (docs/benchmarks.md, "Board projection"): the floor
of one step is bytes ÷ bandwidth, and one step makes 21.33 ms of audio. The figures here are that
projection, not a measurement of the engine; ``speakd-tools bench`` measures (docs/boards.md).
"""

from __future__ import annotations

import os
import platform
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

# /proc/cpuinfo flags that decide which MLAS kernels onnxruntime runs (docs/boards.md).
X86_FEATURES = ("avx2", "avx512f", "avx512_vnni", "avx_vnni")
ARM_FEATURES = ("asimd", "asimddp", "i8mm", "sve")
ARM_PARTS = {  # /proc/cpuinfo "CPU part" of Arm Ltd cores (implementer 0x41)
    "0xd03": "Cortex-A53", "0xd04": "Cortex-A35", "0xd05": "Cortex-A55", "0xd07": "Cortex-A57",
    "0xd08": "Cortex-A72", "0xd09": "Cortex-A73", "0xd0a": "Cortex-A75", "0xd0b": "Cortex-A76",
    "0xd0c": "Neoverse-N1", "0xd0d": "Cortex-A77", "0xd40": "Neoverse-V1", "0xd41": "Cortex-A78",
    "0xd46": "Cortex-A510", "0xd47": "Cortex-A710", "0xd49": "Neoverse-N2", "0xd4b": "Cortex-A78C",
    "0xd4d": "Cortex-A715", "0xd4f": "Neoverse-V2", "0xd80": "Cortex-A520", "0xd81": "Cortex-A720",
    "0xd87": "Cortex-A725",
}  # fmt: skip

MS_AUDIO_PER_STEP = 512 / 24_000 * 1e3  # one GPT step = 2 mel frames × hop 256 at 24 kHz
# The x86 development VM ran the int4 step at 1.5-2.2x its bandwidth floor (docs/benchmarks.md,
# "Board projection"); the projection uses the better end, so a warning is never pessimistic.
FLOOR_EFFICIENCY = 1.5
# GPT weight bytes per precision relative to fp32, from the full-size bundles' step bytes
# (docs/benchmarks.md: 762.8 / 191.8 / 98.4 MB of weights per step).
WEIGHT_RATIO = {"fp32": 1.0, "fp16": 1.0, "int8": 0.251, "int4": 0.129}  # fp16 computes in fp32
KV_BYTES = {"fp32": 4, "fp16": 4, "int8": 4, "int4": 1}  # the int4 mode ships an int8 KV cache
PROJECTION_CONTEXT = 500  # prompt + ~10 s of audio


@dataclass(frozen=True)
class CpuInfo:
    arch: str
    model: str
    cores: int
    flags: frozenset[str] = field(default_factory=frozenset)

    @property
    def is_arm(self) -> bool:
        return self.arch in ("aarch64", "arm64")

    @property
    def features(self) -> dict[str, bool]:
        """The speed-deciding features of this architecture, present or not."""
        names = ARM_FEATURES if self.is_arm else X86_FEATURES if self.arch in (
            "x86_64", "amd64") else ()  # fmt: skip
        return {f: f in self.flags for f in names}


def read_cpu(cpuinfo: str | None = None, arch: str | None = None) -> CpuInfo:
    """Parse /proc/cpuinfo (or the given text): model, flags (x86 ``flags``, ARM ``Features``)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(errors="replace")
        except OSError:
            cpuinfo = ""
    arch = arch or platform.machine()
    flags: set[str] = set()
    fields: dict[str, str] = {}
    cores = 0
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        key, value = key.strip(), value.strip()
        if key in ("flags", "Features"):
            flags |= set(value.split())
        elif key == "processor":
            cores += 1
        elif key in ("model name", "Model", "CPU part", "CPU implementer"):
            fields.setdefault(key, value)
    model = fields.get("model name", "")
    if fields.get("CPU implementer", "").lower() == "0x41":  # an Arm Ltd core: name it
        part = fields.get("CPU part", "").lower()
        model = ARM_PARTS.get(part, f"Arm part {part}")
    if "Model" in fields:  # the board (Raspberry Pi OS and most ARM kernels)
        model = f"{fields['Model']} ({model})" if model else fields["Model"]
    return CpuInfo(arch, model or platform.processor() or arch, cores or os.cpu_count() or 1,
                   frozenset(flags))  # fmt: skip


def read_bandwidth_gbs(mib: int = 256, threads: int | None = None, repeats: int = 3) -> float:
    """DRAM read bandwidth in GB/s, best of ``repeats``: numpy reductions (they release the GIL)
    over disjoint slices of a ``mib`` MiB buffer, far larger than a board's last-level cache.
    Allocating and filling the buffer dominates: ~0.1-0.3 s in all."""
    threads = threads or min(os.cpu_count() or 1, 4)
    buf = np.ones((mib << 20) // 8, np.uint64)
    parts = np.array_split(buf, threads)
    best = float("inf")
    for _ in range(repeats):
        workers = [threading.Thread(target=np.bitwise_or.reduce, args=(p,)) for p in parts]
        t0 = time.perf_counter()
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        best = min(best, time.perf_counter() - t0)
    return buf.nbytes / best / 1e9


@dataclass(frozen=True)
class Projection:
    precision: str
    mb_per_step: float
    floor_ms: float  # bytes ÷ bandwidth
    rtf: float  # GPT-only, at FLOOR_EFFICIENCY × the floor

    @property
    def real_time(self) -> bool:
        return self.rtf <= 1.0


def gpt_weight_bytes(bundle_path: Path, manifest: dict[str, Any]) -> int:
    """Bytes of the GPT graph and its external data (the manifest's sizes, else the files'):
    what one decode step streams."""
    total = 0
    for name, entry in manifest.get("files", {}).items():
        if not name.startswith("gpt"):
            continue
        size = entry.get("bytes") if isinstance(entry, dict) else None
        if size is None and (bundle_path / name).is_file():
            size = (bundle_path / name).stat().st_size
        total += int(size or 0)
    return total


def project(
    precision: str, weight_bytes: int, model: dict[str, Any], bandwidth_gbs: float
) -> dict[str, Projection]:
    """The GPT-only RTF of this bundle's precision and of the others, at this bandwidth.

    The other precisions' weights are scaled from this bundle's by ``WEIGHT_RATIO``; the KV cache
    at ``PROJECTION_CONTEXT`` comes from the manifest's shape."""
    base = weight_bytes / WEIGHT_RATIO.get(precision, 1.0)
    kv_per_byte = 2 * model["num_layers"] * model["num_heads"] * model["head_dim"]
    out = {}
    for p in ("fp32", "int8", "int4") if precision != "fp16" else ("fp16", "int8", "int4"):
        step = base * WEIGHT_RATIO[p] + kv_per_byte * PROJECTION_CONTEXT * KV_BYTES[p]
        if p == precision:
            kv_dtype = model.get("kv_dtype", "float32")
            kv_bytes = 1 if kv_dtype == "int8" else 2 if kv_dtype == "float16" else 4
            step = weight_bytes + kv_per_byte * PROJECTION_CONTEXT * kv_bytes
        floor_ms = step / (bandwidth_gbs * 1e9) * 1e3
        rtf = floor_ms * FLOOR_EFFICIENCY / MS_AUDIO_PER_STEP
        out[p] = Projection(p, step / 1e6, floor_ms, rtf)
    return out
