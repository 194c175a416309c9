"""``python -m speakd_tools.soak.faulty serve --config …``: ``speakd`` with engines that can be
made to fail, for fault drills — the daemon itself has no test hooks.

Every engine kind's loader is wrapped (``speakd.engines.registry.KINDS``), so every voice, the
``[engine]`` one and those of ``voices.dir``, crashes on text with ``CRASH`` (an exception inside
synthesis, like an onnxruntime fault) and hangs on text with ``HANG`` (a wedged run that yields
nothing until the watchdog cancels it). SIGXFSZ is ignored, so a file-size limit set on the
process from outside (``prlimit``) makes its writes fail with EFBIG like a full disk instead of
killing it.
"""

from __future__ import annotations

import dataclasses
import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any

CRASH = "CRASH"
HANG = "HANG"
HANG_MAX_S = 120.0


class FaultyEngine:
    """The real engine, except for text with CRASH or HANG."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def synthesize(
        self, text: str, config: Any, cancel: threading.Event | None = None
    ) -> Iterator[Any]:
        if CRASH in text:
            raise RuntimeError("simulated onnxruntime fault")
        if HANG in text:
            (cancel or threading.Event()).wait(HANG_MAX_S)
            return
        yield from self.inner.synthesize(text, config, cancel)


def _faulty(load: Callable[..., Any]) -> Callable[..., Any]:
    return lambda *args: FaultyEngine(load(*args))


def install() -> None:
    """Wrap every engine kind's loader; ignore SIGXFSZ."""
    from speakd.engines import registry

    for name, kind in list(registry.KINDS.items()):
        registry.KINDS[name] = dataclasses.replace(kind, load=_faulty(kind.load))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)


def main() -> int:
    from speakd.cli import main as speakd_main

    install()
    return speakd_main()


if __name__ == "__main__":
    raise SystemExit(main())
