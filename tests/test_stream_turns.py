"""Streams past ``limits.max_streams`` wait their turn (``limits.stream_wait_s``): in order of
arrival, a caller that leaves while waiting gives its place on, and one that waits too long is
``busy``. The real Control, scheduler and resolver, with the tone engine."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from speakd.audio.sinks import NullSink
from speakd.control import Control
from speakd.request.errors import RequestError
from speakd.request.resolver import Resolver
from speakd.request.scheduler import Scheduler
from tests.tone_engine import ToneEngine
from tests.waits import until


@pytest.fixture
async def control() -> AsyncIterator[Control]:
    scheduler = Scheduler(Resolver(ToneEngine()), NullSink())
    task = asyncio.create_task(scheduler.run())
    yield Control(scheduler, max_text_chars=500, max_streams=1, stream_wait_s=30)
    task.cancel()


def waiting(control: Control) -> int:
    return control.status()["streams"]["waiting"]


async def test_waiting_streams_go_in_order_and_one_that_leaves_gives_its_place(
    control: Control,
) -> None:
    order: list[str] = []

    async def fetch(tag: str) -> bytes:
        async with control.stream(control.build_request({"text": tag}, origin="test")) as s:
            order.append(tag)
            return b"".join([c.pcm async for c in s.aread()])

    first = control.stream(control.build_request({"text": "first"}, origin="test"))
    await first.__aenter__()
    two = asyncio.create_task(fetch("two"))
    await until(lambda: waiting(control) == 1, "two to wait")
    gone = asyncio.create_task(fetch("gone"))
    await until(lambda: waiting(control) == 2, "gone to wait")
    three = asyncio.create_task(fetch("three"))
    await until(lambda: waiting(control) == 3, "three to wait")
    gone.cancel()
    await until(lambda: waiting(control) == 2, "gone to leave the line")
    await first.__aexit__(None, None, None)
    assert all(await asyncio.gather(two, three))
    assert order == ["two", "three"]
    streams = control.status()["streams"]
    assert (streams["active"], streams["waiting"], streams["streams_refused"]) == (0, 0, 0)
    assert streams["streams_waited"] == 3


async def test_a_stream_that_waits_past_stream_wait_s_is_busy(control: Control) -> None:
    control.stream_wait_s = 0.05
    async with control.stream(control.build_request({"text": "held"}, origin="test")):
        with pytest.raises(RequestError) as busy:
            async with control.stream(control.build_request({"text": "late"}, origin="test")):
                pass
    assert busy.value.code == "busy" and "limits.stream_wait_s" in str(busy.value)
    streams = control.status()["streams"]
    assert (streams["active"], streams["waiting"], streams["streams_refused"]) == (0, 0, 1)
