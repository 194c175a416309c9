"""A bundle whose graphs all scale activations per row (calibrate mode ``rows``) batches every
stage, and a request's audio is the same bits alone, beside seven others and at batch_size 1.

Tiny bundle, real sessions. The full-size check on this CPU is ``speakd-tools bench batch``
(its ``identical`` column: the first request's PCM at every width against its run alone).
"""

from __future__ import annotations

import json
import shutil
import threading
from pathlib import Path

import pytest

from speakd.audio import join_chunks
from speakd.engines.base import SynthesisConfig
from speakd.engines.chattts.engine import ChatTTSEngine
from speakd_tools.calibrate.bundle_out import write_manifest
from speakd_tools.calibrate.rowquant import quantize_file

GRAPHS = ("gpt.onnx", "decoder.onnx", "vocos.onnx")
TEXTS = [
    "The kitchen lights are on.",
    "今天天气很好。",
    "Lock the front door.",
    "Dinner is ready.",
    "第二句话比较长一点。",
    "Good night.",
    "The parcel arrived.",
    "Rain later.",
]


@pytest.fixture(scope="module")
def rows_bundle(tiny_bundle: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("bundles") / "chattts-tiny-rows"
    shutil.copytree(tiny_bundle, out)
    for name in GRAPHS:
        assert quantize_file(tiny_bundle / name, out / name) > 0
    base = json.loads((tiny_bundle / "manifest.json").read_text())
    write_manifest(out, base, list(base["files"]), precision="int8")
    return out


def test_every_stage_batches_and_a_request_sounds_the_same_in_any_company(
    rows_bundle: Path,
) -> None:
    single = ChatTTSEngine.load(rows_bundle, threads=1)
    batched = ChatTTSEngine.load(rows_bundle, threads=1, batch_size=8)
    decoder = batched.batch.decoder
    # probed at load: decode steps from one row up, shared prompt passes, stacked renders
    assert batched.batch_invariant and decoder.min_rows == 1
    assert decoder.prompts_batched and batched.vocoder.batched
    configs = [SynthesisConfig(seed=20 + i, extra={"max_new_token": 24}) for i in range(8)]
    reference = join_chunks(single.synthesize(TEXTS[0], configs[0]))
    alone = join_chunks(batched.synthesize(TEXTS[0], configs[0]))
    assert reference is not None and alone is not None
    together: dict[int, bytes] = {}

    def run(i: int) -> None:
        joined = join_chunks(batched.synthesize(TEXTS[i], configs[i]))
        assert joined is not None
        together[i] = joined.pcm

    before = dict(batched.batch.counters)
    threads = [threading.Thread(target=run, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    after = batched.batch.counters
    assert after["row_steps"] - before["row_steps"] > after["steps"] - before["steps"]  # shared
    assert alone.pcm == reference.pcm
    assert together[0] == reference.pcm
