"""The machine line every benchmark table carries: CPU model, the ISA flags that decide which
int8/int4 kernels run, and measured DRAM read bandwidth (the floor of a decode step).

Results from machines of different speeds are only comparable within one machine, so a result
records what it ran on instead of leaving the reader to guess.
"""

from __future__ import annotations

import os
from typing import Any

from speakd.machine.hardware import read_bandwidth_gbs, read_cpu

# the flags that change which matmul kernels onnxruntime's MLAS can use (x86 and Arm)
ISA_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "amx_int8", "asimddp", "i8mm")


def cpu() -> dict[str, Any]:
    """CPU model, logical cores and which of ``ISA_FLAGS`` it has (``speakd.machine.hardware``'s
    reading of /proc/cpuinfo, the one ``speakd doctor`` reports)."""
    info = read_cpu()
    return {
        "model": info.model,
        "logical_cores": os.cpu_count(),
        "flags": {f: f in info.flags for f in ISA_FLAGS},
    }


def read_bandwidth(threads: int) -> float:
    """DRAM read bandwidth in GB/s with ``threads`` threads, over a 1 GiB buffer (the bench can
    afford a larger, steadier sample than doctor's quick estimate)."""
    return read_bandwidth_gbs(mib=1024, threads=threads, repeats=4)


def describe(bandwidth: bool = True, threads: int = 2) -> dict[str, Any]:
    """``cpu()`` plus, unless ``bandwidth`` is False, the read bandwidth with 1 and 2 threads and
    ``read_gbps``: the bandwidth with ``threads`` (the bench's own count: its floor's divisor)."""
    out = cpu()
    out["cpu"] = out["model"]
    if bandwidth:
        out["read_gb_s"] = {str(t): round(read_bandwidth(t), 1) for t in sorted({1, 2, threads})}
        out["read_gbps"] = out["read_gb_s"][str(threads)]
        out["read_threads"] = threads
    return out


def line(info: dict[str, Any]) -> str:
    """One Markdown line: "Machine: <model>, N logical cores; flags …; DRAM read … GB/s". A result
    saved before machine lines existed has no ``flags``: it says so rather than guess."""
    if "flags" not in info:
        return "Machine: not recorded."
    have = [f for f, on in info["flags"].items() if on]
    lacks = [f for f, on in info["flags"].items() if not on]
    flags = ", ".join(have) or "none of " + ", ".join(ISA_FLAGS)
    if have and lacks:
        flags += f" (not {', '.join(lacks)})"
    bw = info.get("read_gb_s")
    read = (
        f"DRAM read {bw['1']} GB/s (1 thread), {bw['2']} GB/s (2 threads)"
        if bw
        else "read bandwidth not measured"
    )
    return f"Machine: {info['model']}, {info['logical_cores']} logical cores; {flags}; {read}."
