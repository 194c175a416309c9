"""``speakd doctor``'s npu line (daemon/lifecycle/doctor.py ``_check_npu``): this machine's answer,
and a board's, from a probe result handed in (tests/test_npu.py feeds the probe itself)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from speakd.machine.npu import NpuInfo
from tests.test_npu import BOARD, SECTION


def test_doctor_reports_the_npu_and_the_bundles_graphs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from speakd.config import Config, EngineConfig
    from speakd.lifecycle.doctor import WARN, _check_npu
    from speakd.machine import npu

    bundle = tmp_path / "joe-rk3588"
    bundle.mkdir()
    manifest = {"format": "speakd-bundle", "format_version": 1, "engine": "vits", "files": {}}
    (bundle / "manifest.json").write_text(json.dumps({**manifest, "rknn": SECTION}))
    config = Config(engine=EngineConfig(bundle=str(bundle), precision="exact"))
    ok, line = _check_npu(config)  # this x86 machine: no driver, not a warning
    assert ok is True and "no RKNPU driver" in line and "graphs for rk3588: decoder" in line
    monkeypatch.setattr(npu, "probe", lambda: BOARD)
    ok, line = _check_npu(config)
    assert ok is True and line.startswith("rk3588, RKNPU driver 0.9.8 at /dev/rknpu, 3 cores")
    monkeypatch.setattr(npu, "probe", lambda: NpuInfo("rk3588", "/dev/rknpu", None, 3, None))
    ok, line = _check_npu(config)
    assert ok == WARN and "pip install 'speakd[rknn]'" in line
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    monkeypatch.setattr(npu, "probe", lambda: BOARD)
    ok, line = _check_npu(config)
    assert ok == WARN and "no .rknn graphs" in line and "speakd-tools rknn convert" in line
