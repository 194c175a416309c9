"""Degradation: a failing, hung or slow engine opens the breaker and the fallback prompt plays."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from speakd.audio import AudioChunk, join_chunks, read_wav
from speakd.audio.sinks import WavSink
from speakd.engines.base import EngineError, SynthesisConfig
from speakd.request.breaker import CircuitBreaker, EngineTimeout, EngineUnavailable, Guard
from speakd.request.messages import Priority, SpeakRequest
from speakd.request.resolver import Resolver
from speakd.request.scheduler import Scheduler
from speakd.request.stream import AudioStream, Cancel
from tests.test_scheduler import Recorder, settle
from tests.tone_engine import ToneEngine
from tests.waits import Clock, wait_until


class FaultyEngine(ToneEngine):
    """A tone engine that can be told to crash, hang or crawl (on ``clock``, simulated time)."""

    def __init__(self) -> None:
        super().__init__()
        self.mode = "ok"
        self.release = threading.Event()
        self.clock = Clock()

    def synthesize(
        self, text: str, config: SynthesisConfig, cancel: threading.Event | None = None
    ) -> Iterator[AudioChunk]:
        if self.mode == "crash":
            raise RuntimeError("onnxruntime exploded")
        if self.mode == "hang":
            self.release.wait(30)
        for chunk in super().synthesize(text, config, cancel):
            if self.mode == "slow":
                self.clock.advance(chunk.duration * 5)
            yield chunk


def guarded(inner: FaultyEngine, breaker: CircuitBreaker, **limits: float) -> Resolver:
    """The engine as the daemon runs it: behind a resolver (no cache) and its guard."""
    return Resolver(inner, guard=Guard(breaker, **limits))


def drain(resolver: Resolver, text: str = "a b c") -> AudioChunk | None:
    return join_chunks(resolver.stream(SpeakRequest(text), Cancel()))


def test_breaker_opens_after_failures_and_recovers_half_open(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    inner = FaultyEngine()
    clock = inner.clock
    monkeypatch.setattr("speakd.request.breaker.time", clock)  # the reset timeout passes on it
    engine = guarded(inner, CircuitBreaker(failure_threshold=2, reset_timeout_s=0.3))
    inner.mode = "crash"
    for _ in range(2):
        with contextlib.suppress(RuntimeError):
            drain(engine)
    assert engine.guard.breaker.state == "open"
    try:
        drain(engine)
        raise AssertionError("an open breaker must refuse")
    except EngineUnavailable as e:
        assert "onnxruntime exploded" in str(e)
    inner.mode = "ok"
    clock.advance(0.29)
    with pytest.raises(EngineUnavailable):  # still resting
        drain(engine)
    clock.advance(0.02)
    assert drain(engine) is not None  # the half-open trial succeeds
    assert engine.guard.breaker.status()["state"] == "closed"


def test_hang_is_detected_and_counts_as_failure() -> None:
    inner = FaultyEngine()
    engine = guarded(inner, CircuitBreaker(failure_threshold=1), hang_timeout_s=0.3)
    inner.mode = "hang"
    t0 = time.monotonic()
    try:
        drain(engine)
        raise AssertionError("a hang must time out")
    except EngineTimeout:
        pass
    inner.release.set()
    assert time.monotonic() - t0 < 2
    assert engine.guard.breaker.state == "open"


def test_a_reader_asleep_before_the_synthesis_began_still_sees_the_hang() -> None:
    """The player may wait on a stream before its synthesis thread has begun (the voice
    loading, a busy machine): begin() wakes it to take up the hang timeout. (Found by the soak:
    a hung engine held the queue for two minutes.)"""
    stream = AudioStream("key", hang_timeout_s=0.2).attach()
    outcome: list[BaseException] = []

    def read() -> None:
        try:
            list(stream.read(Cancel()))
        except EngineTimeout as e:
            outcome.append(e)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    wait_until(lambda: stream._cond._waiters, "the reader asleep on the stream")  # type: ignore[attr-defined]
    stream.begin()  # … and the engine never yields
    reader.join(5)
    assert outcome and "no audio for 0.2 s" in str(outcome[0])


def test_too_slow_counts_as_failure_but_the_audio_is_delivered(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    inner = FaultyEngine()
    monkeypatch.setattr("speakd.request.resolver.time", inner.clock)  # the synthesis is timed on it
    engine = guarded(inner, CircuitBreaker(failure_threshold=1), max_rtf=2.0)
    inner.mode = "slow"
    audio = drain(engine, " ".join(["w"] * 12))  # 1.2 s of audio at RTF ~5
    assert audio is not None and audio.duration > 1.0
    assert engine.guard.breaker.state == "open"
    assert "too slow" in engine.guard.breaker.status()["last_error"]


def test_bad_requests_do_not_open_the_breaker() -> None:
    engine = guarded(FaultyEngine(), CircuitBreaker(failure_threshold=1))
    with contextlib.suppress(EngineError):
        drain(engine, "please FAIL")  # a clean EngineError: the request's fault
    assert engine.guard.breaker.state == "closed"


async def test_scheduler_plays_the_fallback_when_the_engine_fails(tmp_path: Path) -> None:
    inner = FaultyEngine()
    sched = Scheduler(
        guarded(inner, CircuitBreaker(failure_threshold=1, reset_timeout_s=60)), WavSink(tmp_path)
    )
    sched.fallback = join_chunks(inner.synthesize("sorry", SynthesisConfig(voice="high")))
    task = asyncio.create_task(sched.run())
    rec = Recorder()
    inner.mode = "crash"
    for rid in ("r1", "r2"):
        request = SpeakRequest(text="hi there", id=rid, priority=Priority.MESSAGE, on_event=rec)
        sched.submit(request)
        await settle(rec, rid)
    assert [e.data["code"] for e in rec.events if e.type.value == "error"] == [
        "internal_error",
        "engine_unavailable",
    ]
    assert all(e.data["fallback"] for e in rec.events if e.type.value == "error")
    for rid in ("r1", "r2"):  # the listener heard the fallback prompt, not silence
        assert read_wav(tmp_path / f"{rid}.wav").pcm == sched.fallback.pcm
    task.cancel()
