"""Which request a log line belongs to.

The scheduler runs each request's synthesis inside ``request_context``. Every log record made
meanwhile — by the engine, the cache, the breaker — on that thread, or on a thread started with
``contextvars.copy_context().run``, carries ``request_id`` and ``voice`` attributes, and
``request`` (`` [<id> voice=<voice>]``, or empty outside a request) for ``LOG_FORMAT``. A log
record factory sets them, so every handler sees them: stderr (journald) and pytest's caplog alike.
"""

from __future__ import annotations

import contextvars
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s:%(request)s %(message)s"

_current: contextvars.ContextVar[tuple[str, str] | None] = contextvars.ContextVar(
    "speakd_request", default=None
)


@contextmanager
def request_context(request_id: str, voice: str) -> Iterator[None]:
    """Tag the log records made in this block (and in threads that copy this context)."""
    token = _current.set((request_id, voice))
    try:
        yield
    finally:
        _current.reset(token)


def install() -> None:
    """Make every log record carry the current request (idempotent)."""
    base = logging.getLogRecordFactory()
    if getattr(base, "speakd_request", False):
        return

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = base(*args, **kwargs)
        current = _current.get()
        record.request_id, record.voice = current or (None, None)
        record.request = f" [{current[0]} voice={current[1]}]" if current else ""
        return record

    factory.speakd_request = True  # type: ignore[attr-defined]
    logging.setLogRecordFactory(factory)
