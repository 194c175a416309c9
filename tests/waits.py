"""How tests wait: on an event where the code under test offers one, else on a condition with a
bounded timeout that fails with what was awaited — never a fixed sleep that guesses how long
something takes on this machine.

``Clock`` stands in for the time a timeout waits for. ``HeldSink`` makes "mid-utterance"
deterministic: playback stops inside the utterance until the test lets it go, however fast or
loaded the machine is.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from speakd.audio.sinks import WavSink

T = TypeVar("T")

POLL_S = 0.01  # for conditions no event announces (another process's files, logs, sockets)


def wait_until(condition: Callable[[], T], what: str = "", timeout: float = 10.0) -> T:
    """``condition()``'s first truthy value; AssertionError naming ``what`` (by default the
    condition's source line) after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {timeout:g} s for {what or _source(condition)}")
        time.sleep(POLL_S)
    return value


async def until(condition: Callable[[], T], what: str = "", timeout: float = 10.0) -> T:
    """``wait_until`` for a coroutine: the loop keeps running while it waits."""
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {timeout:g} s for {what or _source(condition)}")
        await asyncio.sleep(POLL_S)
    return value


def _source(condition: Callable[[], object]) -> str:
    try:
        return inspect.getsource(condition).strip()
    except (OSError, TypeError):
        return repr(condition)


class Clock:
    """A simulated ``time`` module for code that reads ``time.monotonic()`` (patch it in as that
    module's ``time``): it moves only when the test advances it."""

    def __init__(self) -> None:
        self.t = time.monotonic()

    def monotonic(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds


class HeldSink(WavSink):
    """A WavSink (unpaced) whose ``hold(n)`` makes the n-th block written from then on wait until
    ``release()``: the test acts while the utterance is known to be part-way through, and how
    much had played is exact (``n`` blocks of the scheduler's ``block_ms``)."""

    def __init__(self, directory: Path) -> None:
        super().__init__(directory)
        self.holding = threading.Event()  # set while a write waits for release()
        self._released = threading.Event()
        self._left: int | None = None

    def hold(self, blocks: int = 1) -> None:
        self._left = blocks
        self.holding.clear()
        self._released.clear()

    def write(self, pcm: bytes) -> None:
        super().write(pcm)
        if self._left is None:
            return
        self._left -= 1
        if self._left == 0:
            self._left = None
            self.holding.set()
            self._released.wait(30)

    def held(self, timeout: float = 10.0) -> None:
        assert self.holding.wait(timeout), f"no write reached the hold within {timeout:g} s"

    async def aheld(self, timeout: float = 10.0) -> None:
        await asyncio.to_thread(self.held, timeout)

    def release(self) -> None:
        self._released.set()
