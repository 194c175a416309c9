"""The sounddevice sink against a PortAudio stand-in whose writes can block forever (a wedged
device): the real SoundDeviceSink and Scheduler, the tone engine, a fake ``sounddevice`` module."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import pytest

from speakd.audio import sinks
from speakd.audio.sinks import SoundDeviceSink
from speakd.engines.base import SynthesisConfig, VoiceInfo
from speakd.request.resolver import Resolver
from speakd.request.scheduler import Scheduler
from speakd.request.voices import Voice, VoiceLibrary
from tests.test_scheduler import Recorder, req, settle
from tests.tone_engine import ToneEngine
from tests.waits import until


class FakeStream:
    """``sounddevice.RawOutputStream``: ``write`` returns at once, or not until the test lets it
    while ``wedged``; ``stop`` (which waits for the buffered audio) likewise while
    ``stop_wedged``. Aborting or closing it while another thread is inside a call for it (what
    crashes PortAudio) is noted in the device's ``overlaps``."""

    latency = 0.1

    def __init__(self, fake: FakeDevice, samplerate: int = 0, **_: Any) -> None:
        self.fake, self.rate = fake, samplerate
        self.drained_before_close = False
        self.wedged, self.stop_wedged = fake.wedge_next, fake.wedge_stop_next
        fake.wedge_next = fake.wedge_stop_next = False
        self.written = 0
        self.stopped = True
        self.aborted_playing = False
        self.inside = ""  # the blocking call a thread is in
        self.closed = threading.Event()
        fake.streams.append(self)

    def start(self) -> None:
        self.stopped = False

    def write(self, pcm: bytes) -> None:
        if self.wedged:
            self._blocked("write")
        if not self.written:  # a sound server filling its prebuffer before it plays
            time.sleep(self.fake.start_s)
        self.written += len(pcm)

    def stop(self) -> None:
        if self.stop_wedged:
            self._blocked("stop")
        self.stopped = True

    def _blocked(self, call: str) -> None:
        self.inside = call
        self.fake.release.wait()  # the test (at the latest its teardown) lets it return
        self.inside = ""

    def abort(self) -> None:
        self._destroying("abort")
        self.aborted_playing = not self.stopped  # aborting a stream that still plays cuts it
        self.stopped = True

    def close(self) -> None:
        self._destroying("close")
        self.drained_before_close = self.stopped and not self.aborted_playing
        self.closed.set()

    def _destroying(self, call: str) -> None:
        if self.inside:
            self.fake.overlaps.append(f"{call} during {self.inside}")


class FakeDevice:
    def __init__(self) -> None:
        self.streams: list[FakeStream] = []
        self.wedge_next = self.wedge_stop_next = False
        self.start_s = 0.0  # how long a stream's first write blocks
        self.fail_next_open = False
        self.release = threading.Event()
        self.overlaps: list[str] = []

    def module(self) -> Any:
        return SimpleNamespace(
            RawOutputStream=self._open, _terminate=self._terminate, _initialize=lambda: None
        )

    def _open(self, **kw: Any) -> FakeStream:
        if self.fail_next_open:
            self.fail_next_open = False
            raise RuntimeError("Error opening RawOutputStream: Device unavailable")
        return FakeStream(self, **kw)

    def _terminate(self) -> None:
        """PortAudio's terminate closes every stream: one whose call is stuck crashes."""
        self.overlaps += [f"terminate during {s.inside}" for s in self.streams if s.inside]


@pytest.fixture
def device(monkeypatch: pytest.MonkeyPatch):
    fake = FakeDevice()
    monkeypatch.setattr(SoundDeviceSink, "_sd", lambda _self: fake.module())
    yield fake
    fake.release.set()


@contextlib.asynccontextmanager
async def running(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[tuple[Scheduler, Recorder]]:
    """The real sink and scheduler on the tone engine, device calls bounded at 0.5 s."""
    monkeypatch.setattr(sinks, "WRITE_TIMEOUT_MIN_S", 0.5, raising=False)
    monkeypatch.setattr(sinks, "START_TIMEOUT_S", 0.5, raising=False)
    sink = SoundDeviceSink()
    sched = Scheduler(Resolver(ToneEngine()), sink, block_ms=50)
    task = asyncio.create_task(sched.run())
    try:
        yield sched, Recorder()
    finally:
        task.cancel()


async def test_a_write_that_never_returns_fails_the_utterance_and_the_stream_is_reopened(
    device: FakeDevice, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with running(monkeypatch) as (sched, rec):
        sink = sched.sink
        device.wedge_next = True
        t0 = time.monotonic()
        sched.submit(req(rec, "one two three", "wedged"))
        await settle(rec, "wedged")
        waited = time.monotonic() - t0
        error = rec.final("wedged")
        assert error.type.value == "error" and error.data["code"] == "audio_unavailable"
        assert "did not return within 0.5 s" in error.data["message"], error.data
        assert 0.5 <= waited < 3.0
        assert sink.status()["available"] is False

        sched.submit(req(rec, "four five", "next"))  # the daemon goes on, on a new stream
        await settle(rec, "next")
        assert rec.final("next").data["status"] == "done"
        assert len(device.streams) == 2 and device.streams[1].written == 2 * 2 * 1600
        assert sink.status()["available"] is True
        # the wedged stream is left alone while its write is in the driver, closed once it returns
        wedged = device.streams[0]
        assert wedged.inside == "write" and not wedged.closed.is_set()
        device.release.set()
        assert await asyncio.to_thread(wedged.closed.wait, 5)
        assert device.overlaps == []


async def test_a_sound_server_that_prebuffers_is_given_its_start(
    device: FakeDevice, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write just after the stream starts may block longer than later ones (PulseAudio
    through ALSA's pulse plugin: 1–2 s) without being taken for a wedged device."""
    async with running(monkeypatch) as (sched, rec):
        monkeypatch.setattr(sinks, "START_TIMEOUT_S", 3.0)
        device.start_s = 1.0  # over WRITE_TIMEOUT_MIN_S (0.5 here), under START_TIMEOUT_S
        sched.submit(req(rec, "one two", "first"))
        await settle(rec, "first")
        assert rec.final("first").data["status"] == "done", rec.final("first").data
        assert sched.sink.status()["available"] is True and len(device.streams) == 1


async def test_a_stop_that_never_returns_fails_the_utterance_and_the_stream_is_reopened(
    device: FakeDevice, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The end-of-utterance drain (PortAudio's stop) is bounded like a write."""
    async with running(monkeypatch) as (sched, rec):
        device.wedge_stop_next = True
        sched.submit(req(rec, "one two", "stuck"))
        async with asyncio.timeout(5):
            await settle(rec, "stuck")
        error = rec.final("stuck")
        assert error.type.value == "error" and error.data["code"] == "audio_unavailable"
        assert "stopping the stream did not return within 0.5 s" in error.data["message"]
        assert device.streams[0].written == 2 * 2 * 1600  # all of it was written first

        sched.submit(req(rec, "three", "next"))
        await settle(rec, "next")
        assert rec.final("next").data["status"] == "done" and len(device.streams) == 2
        device.release.set()
        assert await asyncio.to_thread(device.streams[0].closed.wait, 5)
        assert device.overlaps == []


async def test_no_portaudio_reinit_while_a_stuck_write_holds_its_stream(
    device: FakeDevice, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a wedge the next stream cannot be opened (the device is gone too): the retries that
    re-initialise PortAudio to find a device that came back wait until the stuck write has
    returned and its stream is closed — PortAudio's terminate would close it under the write."""
    monkeypatch.setattr(SoundDeviceSink, "RETRY_S", 0.0)
    async with running(monkeypatch) as (sched, rec):
        device.wedge_next = True
        sched.submit(req(rec, "one two three", "wedged"))
        await settle(rec, "wedged")
        device.fail_next_open = True
        for rid in ("gone", "retry"):  # the open fails, then the retry opens (no re-init)
            sched.submit(req(rec, "four", rid))
            await settle(rec, rid)
        assert rec.final("gone").data["code"] == "audio_unavailable"
        assert rec.final("retry").data["status"] == "done"
        assert device.streams[0].inside == "write" and device.overlaps == []
        device.release.set()
        assert await asyncio.to_thread(device.streams[0].closed.wait, 5)
        assert device.overlaps == []


class RateTone(ToneEngine):
    """A tone voice at its own sample rate, under its own name."""

    def __init__(self, name: str, rate: int) -> None:
        super().__init__()
        self.name, self.sample_rate, self.bundle_id = name, rate, f"tone-{rate}"

    def voices(self) -> list[VoiceInfo]:
        return [VoiceInfo(self.name, "en")]

    def default_voice(self) -> str:
        return self.name


async def test_voices_at_two_rates_play_one_after_another_each_at_its_own_rate(
    device: FakeDevice, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Piper's 22 050 Hz then ChatTTS's 24 000 Hz: the device is reopened at the new rate once the
    first utterance has drained (no resampling, no wrong pitch, no cut tail), and kept open while
    the rate stays."""
    piper, chattts = RateTone("piper", 22050), RateTone("chattts", 24000)
    library = VoiceLibrary(
        [Voice(e, e.name, lambda e=e: e, engine=e) for e in (piper, chattts)], default="piper"
    )
    sink = SoundDeviceSink()
    sched = Scheduler(Resolver(library), sink, block_ms=50)
    task = asyncio.create_task(sched.run())
    try:
        rec = Recorder()
        for rid, voice in (("a", "piper"), ("b", "chattts"), ("c", "chattts"), ("d", "piper")):
            request = req(rec, "one two", rid)
            request.config = SynthesisConfig(voice=voice)
            request.prepared = library.prepare(request.text, request.config)
            sched.submit(request)
            await settle(rec, rid)
            assert rec.final(rid).data["status"] == "done"
    finally:
        task.cancel()
    assert [s.rate for s in device.streams] == [22050, 24000, 22050]
    first, second, _ = device.streams
    assert first.written == 2 * int(22050 * 0.1) * 2  # every sample of "one two" at 22 050 Hz
    assert second.written == 2 * (2 * int(24000 * 0.1) * 2)  # b and c on one stream
    assert first.drained_before_close and second.drained_before_close


async def test_audio_tail_ms_of_silence_is_played_before_the_device_drains(
    device: FakeDevice, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The last word is followed by tail_ms of zeros on the device, then PortAudio's stop (which
    returns once the buffer has played), then finished."""
    writes: list[bytes] = []
    monkeypatch.setattr(FakeStream, "write", lambda self, pcm: writes.append(pcm))
    sched = Scheduler(Resolver(ToneEngine()), SoundDeviceSink(), block_ms=50, tail_ms=300)
    task = asyncio.create_task(sched.run())
    try:
        rec = Recorder()
        sched.submit(req(rec, "one two", "tail"))
        await settle(rec, "tail")
        assert rec.final("tail").data["status"] == "done"
    finally:
        task.cancel()
    pcm = b"".join(writes)
    speech = 2 * 2 * 1600  # "one two": two tone words at 16 kHz
    assert len(pcm) == speech + 2 * int(16000 * 0.3)
    assert any(pcm[:speech]) and not any(pcm[speech:])
    assert device.streams[0].stopped  # drained after the tail


async def test_a_cancel_stops_the_device_write_within_a_piece_not_a_block(
    device: FakeDevice, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A device that takes audio at playing speed and 1 s blocks: the cancel's ``finished``
    comes within a few 10 ms pieces (the write stops at the next piece), then the stream is
    aborted; on the old whole-block write it waited for the rest of the second."""

    writing = threading.Event()

    def paced(self: FakeStream, pcm: bytes) -> None:
        writing.set()
        time.sleep(len(pcm) / 2 / self.rate)
        self.written += len(pcm)

    monkeypatch.setattr(FakeStream, "write", paced)
    sched = Scheduler(Resolver(ToneEngine(word_s=3.0)), SoundDeviceSink(), block_ms=1000)
    task = asyncio.create_task(sched.run())
    try:
        rec = Recorder()
        sched.submit(req(rec, "long", "c"))
        await until(writing.is_set, "the first one-second block to be written")
        t0 = time.monotonic()
        sched.cancel("c")
        await settle(rec, "c")
        took = time.monotonic() - t0
    finally:
        task.cancel()
    assert rec.final("c").data["status"] == "cancelled"
    assert took < 0.25, took  # a block is 1 s
    assert device.streams[0].aborted_playing and not device.overlaps
