"""The Rockchip NPU: is it there, and may this bundle use it (``engine.accelerator``)?

``probe`` reads what Rockchip's vendor kernel driver (RKNPU, the one ``librknnrt`` and
``rknn-toolkit-lite2`` talk to) leaves in the file system: its device (``/dev/rknpu``, or a DRM
render node whose driver is RKNPU), its debugfs ``version`` and ``load`` files (root only; the
load line names one ``CoreN`` per NPU core), and the SoC from the device tree. The mainline
``rocket`` driver (``/dev/accel``) is a different stack that the toolkit does not use.

``rknn-toolkit-lite2`` (PyPI, aarch64 wheels for CPython 3.11 and 3.12) is only the Python
side: it loads ``librknnrt.so``, Rockchip's runtime library, which the board's vendor image
ships (or which is copied from Rockchip's releases), not the wheel.

``choose`` turns the setting, the bundle's ``rknn`` manifest section (written by ``speakd-tools
rknn convert``, docs/bundle-format.md) and the probe into one decision with one reason, which the
loader logs in one line when it falls back to the CPU.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

ACCELERATORS = ("cpu", "rknn", "auto")
SOC_CORES = {"rk3588": 3, "rk3576": 2, "rk3568": 1, "rk3566": 1, "rk3562": 1}
LIBRARY = "librknnrt.so"
LIBRARY_DIRS = ("usr/lib", "usr/lib64", "usr/lib/aarch64-linux-gnu", "usr/local/lib")


@dataclass(frozen=True)
class NpuInfo:
    soc: str | None  # "rk3588", from the device tree
    device: str | None  # the RKNPU device node, when the vendor driver is loaded
    driver: str | None  # "0.9.8", from debugfs (readable by root only)
    cores: int  # NPU cores: debugfs' load line, else the SoC's known count, else 0
    runtime: str | None  # rknn-toolkit-lite2's version, when installed
    library: str | None = None  # where librknnrt.so is

    @property
    def present(self) -> bool:
        return self.device is not None or self.driver is not None

    def describe(self) -> str:
        if not self.present:
            soc = f"{self.soc}, but " if self.soc else ""
            return f"{soc}no RKNPU driver (no /dev/rknpu, no RKNPU render node)"
        parts = [
            self.soc or "unknown SoC",
            f"RKNPU driver {self.driver or '(version: debugfs, root only)'} at {self.device}",
            f"{self.cores} cores" if self.cores else "cores unknown",
            f"rknn-toolkit-lite2 {self.runtime}" if self.runtime else "no rknn-toolkit-lite2",
            self.library or f"no {LIBRARY}",
        ]
        return ", ".join(parts)


def _read(path: Path) -> str | None:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return None


def _device(root: Path) -> str | None:
    if (root / "dev/rknpu").exists():
        return "/dev/rknpu"
    for card in sorted((root / "sys/class/drm").glob("renderD*")):
        driver = card / "device" / "driver"
        if driver.exists() and "rknpu" in driver.resolve().name.lower():
            return f"/dev/dri/{card.name}"
    return None


def _soc(root: Path) -> str | None:
    compatible = _read(root / "proc/device-tree/compatible") or ""
    for entry in compatible.split("\0"):
        if m := re.fullmatch(r"rockchip,(rk\d{4}\w*)", entry.strip()):
            return m.group(1)
    return None


def _runtime() -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("rknn-toolkit-lite2")
    except PackageNotFoundError:
        return None


def probe(root: Path = Path("/")) -> NpuInfo:
    """What this machine has; ``root`` lets tests hand it a fake file system."""
    soc = _soc(root)
    debugfs = root / "sys/kernel/debug/rknpu"
    version = _read(debugfs / "version") or ""
    driver = m.group(1) if (m := re.search(r"v?(\d+\.\d+\.\d+)", version)) else None
    load = _read(debugfs / "load") or ""
    cores = len(re.findall(r"Core\d+:", load)) or SOC_CORES.get(soc or "", 0)
    library = next(
        (root / d / LIBRARY for d in LIBRARY_DIRS if (root / d / LIBRARY).is_file()), None
    )
    where = f"/{library.relative_to(root)}" if library else None
    return NpuInfo(soc, _device(root), driver, cores, _runtime(), where)


@dataclass(frozen=True)
class Decision:
    accelerator: str  # "cpu" | "rknn": what the engine runs its NPU-suited graphs on
    reason: str


def rknn_section(manifest: dict[str, Any] | None) -> dict[str, Any] | None:
    section = (manifest or {}).get("rknn")
    return section if section and section.get("graphs") else None


def choose(setting: str, manifest: dict[str, Any] | None, info: NpuInfo) -> Decision:
    """``cpu``: always the CPU. ``rknn`` and ``auto``: the NPU when the bundle has ``.rknn``
    graphs for this SoC, the driver is loaded and rknn-toolkit-lite2 is installed; otherwise
    the CPU, and the reason says which of these is missing and how to add it."""
    if setting not in ACCELERATORS:
        raise ValueError(f"engine.accelerator: {setting!r}, expected one of {ACCELERATORS}")
    if setting == "cpu":
        return Decision("cpu", "engine.accelerator = cpu")
    section = rknn_section(manifest)
    if section is None:
        return Decision(
            "cpu",
            "the bundle has no .rknn graphs (make them on the build host: speakd-tools rknn "
            "convert, docs/boards.md)",
        )
    if not all("fp16" in g["files"] for g in section["graphs"].values()):
        return Decision("cpu", "a .rknn graph has no fp16 file (speakd-tools rknn convert again)")
    if info.soc and section["target"] != info.soc:
        return Decision("cpu", f"the .rknn graphs are for {section['target']}, this is {info.soc}")
    if not info.present:
        return Decision("cpu", info.describe())
    if info.runtime is None:
        return Decision("cpu", "rknn-toolkit-lite2 is not installed (pip install 'speakd[rknn]')")
    if info.library is None:
        return Decision(
            "cpu",
            f"no {LIBRARY} (Rockchip's NPU runtime library: the board image's, docs/boards.md)",
        )
    names = ", ".join(sorted(section["graphs"]))
    return Decision("rknn", f"{names} on the {section['target']} NPU ({info.describe()})")


@dataclass(frozen=True)
class NpuPlan:
    """A voice's graphs that run on the NPU: the bundle, its ``rknn`` section, the precision."""

    bundle: Path
    section: dict[str, Any]
    precision: str = "fp16"  # int8 costs the Piper decoder ~40 dB of SNR (docs/benchmarks.md)

    @property
    def tag(self) -> str:
        """Appended to the voice's bundle id: the hashes of the .rknn files it runs."""
        files, graphs = self.section["files"], self.section["graphs"].values()
        hashes = [files[g["files"][self.precision]]["sha256"] for g in graphs]
        digest = hashlib.sha256(json.dumps(sorted(hashes)).encode()).hexdigest()
        return f"rknn-{self.precision}-{digest[:12]}"


_said: set[str] = set()  # lines already logged: one per voice and reason, not one per describe


def _once(level: int, message: str) -> None:
    if message not in _said:
        _said.add(message)
        log.log(level, message)


def plan_for(
    setting: str,
    bundle: Path | None,
    manifest: dict[str, Any] | None,
    info: NpuInfo | None = None,
) -> NpuPlan | None:
    """``engine.accelerator`` for one voice's bundle (and its manifest, as the engines read it):
    the NPU plan, or None after one log line that says why the CPU runs it (nothing is logged for
    ``cpu``, and nothing is probed)."""
    if setting == "cpu":
        return None
    decision = choose(setting, manifest, info or probe())
    if decision.accelerator == "rknn" and bundle is not None:
        _once(logging.INFO, f"engine.accelerator = {setting}, {bundle}: {decision.reason}")
        return NpuPlan(bundle, rknn_section(manifest) or {})
    level = logging.WARNING if setting == "rknn" else logging.INFO
    where = bundle or "the embedded voice"
    _once(level, f"engine.accelerator = {setting}, {where}: the CPU runs it: {decision.reason}")
    return None
