"""Per-part timing of a synthesis (``speakd.engines.spans``): the embedded voice marks its parts on
real onnxruntime, a recording keeps them apart up to the first chunk, and a daemon with
``engine.trace_parts`` logs them with the request's id."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from speakd.engines.base import SynthesisConfig
from speakd.engines.spans import Spans, recording, span
from speakd.engines.vits.engine import VitsEngine
from tests.daemon_proc import start_daemon, write_config

VITS_PARTS = {"phonemes", "prior", "flow", "decoder", "words"}


@pytest.fixture(scope="module")
def engine() -> VitsEngine:
    return VitsEngine.embedded(threads=2)


def test_the_voice_marks_its_parts_and_they_fit_in_the_wait(engine: VitsEngine) -> None:
    text = "The report covers the new schedule before Friday. Then it ends, as reports do."
    with recording() as parts:
        chunks = 0
        for _chunk in engine.synthesize(text, SynthesisConfig(seed=1)):
            parts.chunk()
            chunks += 1
    assert chunks > 2
    assert parts.first is not None and parts.first_s is not None
    assert set(parts.first) == VITS_PARTS  # the first window needs every part once
    assert set(parts.parts) == VITS_PARTS
    assert all(v > 0 for v in parts.parts.values())
    assert sum(parts.first.values()) <= parts.first_s
    assert sum(parts.parts.values()) <= parts.total_s
    # later windows add flow and decoder runs, and the second sentence its prior
    assert parts.parts["decoder"] > parts.first["decoder"]
    assert parts.parts["prior"] > parts.first["prior"]


def test_outside_a_recording_a_span_records_nothing() -> None:
    spans = Spans()
    with span("decoder"):
        pass
    assert spans.parts == {}
    with recording() as spans:
        with span("decoder"):
            pass
        with span("decoder"):
            pass
    assert list(spans.parts) == ["decoder"]
    assert spans.first is None and "no chunk" in spans.summary()


def test_a_daemon_with_trace_parts_logs_them_with_the_request(tmp_path: Path) -> None:
    config = write_config(tmp_path, extra="[engine]\ntrace_parts = true\n")
    daemon = start_daemon(config)
    try:
        events = daemon.say("Open the blue folder on page nine.", id="spans-1")
        assert events[-1]["event"] == "finished", events
        logged = [line for line in daemon.log_text().splitlines() if "synthesis parts, ms:" in line]
        (line,) = [x for x in logged if "[spans-1 " in x]
        first = re.search(r"first ([\d.]+) ms \(([^)]*)\)", line)
        assert first is not None, line
        parts = dict(p.rsplit(" ", 1) for p in first.group(2).split(", "))
        assert set(parts) == VITS_PARTS
        assert sum(float(v) for v in parts.values()) <= float(first.group(1)) + 0.5  # rounding
    finally:
        daemon.stop()
