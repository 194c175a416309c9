"""Log lines made during a request's synthesis say which request and voice they belong to —
through the daemon's real layering: scheduler → cache (its own synthesis thread) → breaker
(another thread) → engine."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from speakd.audio.sinks import NullSink
from speakd.config import CacheConfig
from speakd.engines.base import SynthesisConfig
from speakd.machine import logcontext
from speakd.request.resolver import Resolver
from speakd.request.scheduler import Scheduler
from tests.test_scheduler import Recorder, req, settle
from tests.tone_engine import ToneEngine
from tests.waits import until

ENGINE_LOG = "speakd.engines.tone"


class LoggingTone(ToneEngine):
    """The tone engine, logging as a real engine does: once at load, once per synthesis."""

    def __init__(self) -> None:
        super().__init__()
        logging.getLogger(ENGINE_LOG).info("loaded")

    def synthesize(self, text: str, config: SynthesisConfig, cancel=None) -> Iterator:
        logging.getLogger(ENGINE_LOG).info("synthesizing %r", text)
        return super().synthesize(text, config, cancel)


def stored_clips(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.getMessage().startswith("stored clip")]


async def test_engine_log_records_carry_request_id_and_voice(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    logcontext.install()
    caplog.set_level(logging.DEBUG, logger="speakd")
    engine = LoggingTone()
    source = Resolver.from_config(engine, CacheConfig(path=str(tmp_path / "cache.db")))
    sched = Scheduler(source, NullSink())
    task = asyncio.create_task(sched.run())
    rec = Recorder()
    try:
        request = req(rec, "one two", "req-1")
        request.config = SynthesisConfig(voice="high")
        sched.submit(request)
        sched.submit(req(rec, "three", "req-2"))
        await settle(rec, "req-1", "req-2")
        # clips are stored (on the synthesis thread) after they have been handed over
        await until(lambda: len(stored_clips(caplog)) >= 2, "two stored clips")
        stored = stored_clips(caplog)
    finally:
        task.cancel()
        source.close()
    engine_records = [r for r in caplog.records if r.name == ENGINE_LOG]
    assert [(r.getMessage(), r.request_id, r.voice) for r in engine_records] == [
        ("loaded", None, None),  # engine load is no request's
        ("synthesizing 'one two'", "req-1", "high"),
        ("synthesizing 'three'", "req-2", "default"),
    ]
    assert [r.request_id for r in stored] == ["req-1", "req-2"]  # the cache's own thread
    lines = [logging.Formatter(logcontext.LOG_FORMAT).format(r) for r in engine_records]
    assert lines[0].endswith(" INFO speakd.engines.tone: loaded")
    assert lines[1].endswith(" INFO speakd.engines.tone: [req-1 voice=high] synthesizing 'one two'")
