"""Queue and interruption semantics on the real scheduler, a real WAV sink, tone engine.

"Mid-utterance" is a HeldSink holding a chosen block until the test releases it, and every wait is
on the scheduler's events, so nothing here depends on how fast the machine is."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from speakd.audio import read_wav
from speakd.audio.sinks import WavSink
from speakd.request.messages import Event, Priority, SpeakRequest
from speakd.request.resolver import Resolver
from speakd.request.scheduler import Scheduler
from tests.tone_engine import ToneEngine
from tests.waits import HeldSink


class Recorder:
    """A request's ``on_event``: keeps the events (called on the loop thread) and wakes waiters."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self._new = asyncio.Event()

    def __call__(self, event: Event) -> None:
        self.events.append(event)
        self._new.set()

    async def until(self, condition: Callable[[], bool], what: str, timeout: float) -> None:
        try:
            async with asyncio.timeout(timeout):
                while not condition():
                    self._new.clear()
                    await self._new.wait()
        except TimeoutError:
            seen = [(e.request_id, e.type.value) for e in self.events]
            raise AssertionError(f"waited {timeout:g} s for {what}; events: {seen}") from None

    async def saw(self, request_id: str, kind: str, timeout: float = 10.0) -> None:
        await self.until(lambda: kind in self.of(request_id), f"{request_id} {kind}", timeout)

    def of(self, request_id: str) -> list[str]:
        return [e.type.value for e in self.events if e.request_id == request_id]

    def final(self, request_id: str) -> Event:
        return [e for e in self.events if e.request_id == request_id and e.terminal][-1]


def req(rec: Recorder, text: str, rid: str, priority: Priority = Priority.MESSAGE) -> SpeakRequest:
    return SpeakRequest(text=text, id=rid, priority=priority, on_event=rec)


async def settle(rec: Recorder, *ids: str, timeout: float = 10.0) -> None:
    def ended() -> bool:
        return all(any(e.request_id == i and e.terminal for e in rec.events) for i in ids)

    await rec.until(ended, f"the end of {', '.join(ids)}", timeout)


@pytest.fixture
def setup(tmp_path: Path):
    async def make(**kw):
        engine = ToneEngine()
        sched = Scheduler(Resolver(engine), HeldSink(tmp_path), **kw)
        task = asyncio.create_task(sched.run())
        return sched, engine, task

    return make


async def test_events_in_order_and_audio_written(setup, tmp_path: Path) -> None:
    sched, _, task = await setup()
    rec = Recorder()
    sched.submit(req(rec, "one two three", "a"))
    await settle(rec, "a")
    assert rec.of("a") == ["queued", "started", "finished"]
    assert rec.final("a").data["status"] == "done"
    audio = read_wav(tmp_path / "a.wav")
    assert audio.sample_rate == 16000
    assert abs(audio.duration - 0.3) < 0.01
    task.cancel()


async def test_fifo_within_priority_and_priority_order(setup) -> None:
    sched, _, task = await setup()
    rec = Recorder()
    sched.sink.hold()
    sched.submit(req(rec, "first long utterance here", "m1"))
    await sched.sink.aheld()  # m1 is playing
    sched.submit(req(rec, "second", "m2"))
    sched.submit(req(rec, "third", "m3"))
    sched.submit(req(rec, "urgent", "i1", Priority.IMPORTANT))
    sched.sink.release()
    await settle(rec, "m1", "m2", "m3", "i1")
    # the important one interrupted m1, then the messages went on in order
    assert rec.final("m1").data["status"] == "interrupted"
    started = [e.request_id for e in rec.events if e.type.value == "started"]
    assert started == ["m1", "i1", "m2", "m3"]
    task.cancel()


async def test_text_keeps_only_newest(setup) -> None:
    sched, _, task = await setup()
    rec = Recorder()
    sched.sink.hold()
    sched.submit(req(rec, "a b c d e f g h", "t1", Priority.TEXT))
    await sched.sink.aheld()
    sched.submit(req(rec, "x y", "t2", Priority.TEXT))
    sched.submit(req(rec, "z", "t3", Priority.TEXT))
    sched.sink.release()
    await settle(rec, "t1", "t2", "t3")
    assert rec.final("t1").data["status"] == "replaced"
    assert rec.final("t2").data["status"] == "replaced"
    assert rec.final("t3").data["status"] == "done"
    task.cancel()


async def test_notification_dropped_while_busy_and_interrupted_by_anything(setup) -> None:
    sched, _, task = await setup()
    rec = Recorder()
    sched.sink.hold()
    sched.submit(req(rec, "a b c d", "m1"))
    await sched.sink.aheld()
    sched.submit(req(rec, "ping", "n1", Priority.NOTIFICATION))
    await settle(rec, "n1")
    assert rec.final("n1").data["status"] == "discarded"
    sched.sink.release()
    await settle(rec, "m1")
    sched.sink.hold()
    sched.submit(req(rec, "a b c d e f", "n2", Priority.NOTIFICATION))
    await sched.sink.aheld()
    sched.submit(req(rec, "hello", "m2"))
    sched.sink.release()
    await settle(rec, "n2", "m2")
    assert rec.final("n2").data["status"] == "interrupted"
    assert rec.final("m2").data["status"] == "done"
    task.cancel()


async def test_stop_mid_utterance_is_prompt_and_clears_queue(setup, tmp_path: Path) -> None:
    sched, _, task = await setup(block_ms=20)
    rec = Recorder()
    sched.sink.hold(15)  # 0.3 s in
    sched.submit(req(rec, " ".join(["word"] * 30), "long"))  # 3 s of audio
    sched.submit(req(rec, "next", "next"))
    await sched.sink.aheld()
    sched.stop()
    sched.sink.release()
    await settle(rec, "long", "next")
    assert rec.final("long").data["status"] == "stopped"
    assert rec.final("next").data["status"] == "stopped"
    assert "started" not in rec.of("next")
    # it stopped at the next block: nothing after the block that was playing
    assert read_wav(tmp_path / "long.wav").duration == pytest.approx(0.3)
    task.cancel()


async def test_cancel_by_id_leaves_others(setup) -> None:
    sched, engine, task = await setup()
    rec = Recorder()
    sched.submit(req(rec, "a b c", "m1"))
    sched.submit(req(rec, "d e", "m2"))
    sched.submit(req(rec, "f", "m3"))
    assert sched.cancel("m2") == 1
    await settle(rec, "m1", "m2", "m3")
    assert [rec.final(i).data["status"] for i in ("m1", "m2", "m3")] == [
        "done",
        "cancelled",
        "done",
    ]
    assert engine.calls == ["a b c", "f"]
    task.cancel()


async def test_bounded_queue_rejects_clearly(setup) -> None:
    sched, _, task = await setup(max_queue=3)
    rec = Recorder()
    for i in range(6):  # submitted before the loop runs: nothing has left the queue yet
        sched.submit(req(rec, "a b c d e", f"m{i}"))
    errors = [e for e in rec.events if e.type.value == "error"]
    assert [e.request_id for e in errors] == ["m3", "m4", "m5"]
    assert {e.data["code"] for e in errors} == {"queue_full"}
    assert sched.status()["queue_length"] == 3
    sched.stop()
    task.cancel()


async def test_engine_failure_is_an_error_event_and_queue_goes_on(setup) -> None:
    sched, _, task = await setup()
    rec = Recorder()
    sched.submit(req(rec, "please FAIL now", "bad"))
    sched.submit(req(rec, "fine", "good"))
    await settle(rec, "bad", "good")
    assert rec.final("bad").type.value == "error"
    assert rec.final("bad").data["code"] == "synthesis_failed"
    assert rec.final("good").data["status"] == "done"
    task.cancel()


async def test_duplicate_id_rejected(setup) -> None:
    sched, _, task = await setup()
    rec = Recorder()
    sched.submit(req(rec, "a b c d", "same"))
    sched.submit(req(rec, "again", "same"))
    assert [e.data.get("code") for e in rec.events if e.type.value == "error"] == ["duplicate_id"]
    await settle(rec, "same")
    task.cancel()


async def test_paused_utterance_is_parked_resumed_exactly_or_cancelled(
    setup, tmp_path: Path
) -> None:
    """A paused client's utterance leaves the worker; resumed, its audio is exactly what an
    unpaused run plays; cancelled while parked, it ends at once with what had played."""
    sched, _, task = await setup(block_ms=20)
    rec = Recorder()
    text = " ".join(["word"] * 8)
    sched.submit(req(rec, text, "ref"))
    await settle(rec, "ref")
    for rid, client in (("resumed", "a"), ("cancelled", "b")):
        sched.sink.hold(12)  # 0.24 s in
        sched.submit(dataclasses.replace(req(rec, text, rid), client=client))
        await sched.sink.aheld()
        sched.pause(client)
        sched.sink.release()
        await rec.saw(rid, "paused")
        status = sched.status()
        assert status["state"] == "idle" and status["queue"][-1] == rid, status
    sched.submit(req(rec, "other client", "other"))
    await settle(rec, "other")  # not held up by the two parked utterances
    assert sched.cancel("cancelled") == 1
    await settle(rec, "cancelled")
    assert rec.of("cancelled") == ["queued", "started", "paused", "finished"]
    assert rec.final("cancelled").data["status"] == "cancelled"
    assert sched.resume("a")
    await settle(rec, "resumed")
    assert rec.of("resumed") == ["queued", "started", "paused", "resumed", "finished"]
    assert read_wav(tmp_path / "resumed.wav").pcm == read_wav(tmp_path / "ref.wav").pcm
    assert read_wav(tmp_path / "cancelled.wav").duration == pytest.approx(0.24)  # what played
    task.cancel()


async def test_cancel_does_not_wait_for_the_playing_block(tmp_path: Path) -> None:
    """A realtime-paced sink with one-second blocks: the cancel lands well inside the first
    block (the sink's write is interrupted), not at its end."""
    engine = ToneEngine(word_s=3.0)
    sched = Scheduler(Resolver(engine), WavSink(tmp_path, realtime=True), block_ms=1000)
    task = asyncio.create_task(sched.run())
    rec = Recorder()
    sched.submit(req(rec, "long", "long"))  # one 3 s chunk
    await rec.saw("long", "started")
    t0 = time.monotonic()
    sched.cancel("long")
    await settle(rec, "long")
    assert rec.final("long").data["status"] == "cancelled"
    assert time.monotonic() - t0 < 0.25  # the old block boundary: about 1 s
    task.cancel()
