"""Keep a failing or wedged engine from taking the daemon with it.

A ``Guard`` judges every synthesis the resolver runs: a crash, a hang (noticed by the audio
stream: no chunk within ``hang_timeout_s``) or a real-time factor above ``max_rtf`` counts as a
failure. After ``failure_threshold`` consecutive failures the circuit breaker opens and synthesis
is refused at once with ``EngineUnavailable`` — the scheduler then plays the cached fallback prompt
instead of silence. After ``reset_timeout_s`` one request is let through (half-open); its success
closes the breaker, its failure re-opens it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from speakd.engines.base import EngineError
from speakd.engines.spans import Spans
from speakd.request.stream import EngineTimeout

__all__ = ["CircuitBreaker", "EngineTimeout", "EngineUnavailable", "Guard"]

log = logging.getLogger(__name__)


class EngineUnavailable(EngineError):
    """The breaker is open: the engine failed repeatedly and is resting."""

    code = "engine_unavailable"


class CircuitBreaker:
    CLOSED, OPEN, HALF_OPEN = "closed", "open", "half-open"

    def __init__(self, failure_threshold: int = 3, reset_timeout_s: float = 30.0) -> None:
        self.failure_threshold = failure_threshold
        self.reset_timeout_s = reset_timeout_s
        self.state = self.CLOSED
        self.failures = 0
        self.opened_at = 0.0
        self.last_error = ""
        self._trial_running = False
        self._lock = threading.Lock()

    def allow(self) -> bool:
        with self._lock:
            if (
                self.state == self.OPEN
                and time.monotonic() - self.opened_at >= self.reset_timeout_s
            ):
                self.state = self.HALF_OPEN
                log.info("circuit breaker half-open: trying the engine again")
            if self.state == self.HALF_OPEN:
                if self._trial_running:
                    return False
                self._trial_running = True
                return True
            return self.state == self.CLOSED

    def record_success(self) -> None:
        with self._lock:
            if self.state != self.CLOSED:
                log.info("circuit breaker closed: the engine works again")
            self.state, self.failures, self._trial_running = self.CLOSED, 0, False

    def record_failure(self, reason: str) -> None:
        with self._lock:
            self.failures += 1
            self.last_error = reason
            self._trial_running = False
            if self.state == self.HALF_OPEN or self.failures >= self.failure_threshold:
                if self.state != self.OPEN:
                    log.warning("circuit breaker open after %d failures: %s", self.failures, reason)
                self.state, self.opened_at = self.OPEN, time.monotonic()

    def release(self) -> None:
        """A request ended without telling anything about the engine's health."""
        with self._lock:
            self._trial_running = False

    def status(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "consecutive_failures": self.failures,
            "last_error": self.last_error or None,
        }


@dataclass
class Guard:
    """The breaker plus the limits a synthesis is judged by."""

    breaker: CircuitBreaker
    hang_timeout_s: float = 30.0
    max_rtf: float = 3.0
    # told (compute s, audio s, its parts) of every synthesis that ran to its end
    # (speakd.control.metrics: RTF, and the parts up to the first chunk)
    on_synthesis: Callable[[float, float, Spans | None], None] | None = None
    trace_parts: bool = False  # engine.trace_parts: one log line of them per synthesis
    nice: int = 0  # engine.nice: a synthesis' thread runs this much nicer (speakd.machine.priority)

    def admit(self) -> None:
        if not self.breaker.allow():
            raise EngineUnavailable(
                f"the engine is unavailable after repeated failures ({self.breaker.last_error})"
            )

    def judge(
        self,
        error: BaseException | None,
        cancelled: bool,
        elapsed: float,
        audio_s: float,
        parts: Spans | None = None,
    ) -> None:
        """A clean EngineError is about the request (bad text, unknown voice), and a cancelled
        synthesis says nothing; anything else is a fault, and so is a crawl. ``parts``: where its
        time went (``speakd.engines.spans``), logged with ``trace_parts``."""
        if parts is not None and self.trace_parts:
            log.info("synthesis parts, ms: %s", parts.summary())
        if error is None and not cancelled and self.on_synthesis is not None:
            self.on_synthesis(elapsed, audio_s, parts)
        if isinstance(error, EngineError) or (error is None and cancelled):
            self.breaker.release()
        elif error is not None:
            self.breaker.record_failure(f"{type(error).__name__}: {error}")
        elif audio_s > 1.0 and elapsed / audio_s > self.max_rtf:
            self.breaker.record_failure(f"too slow: RTF {elapsed / audio_s:.2f} > {self.max_rtf}")
        else:
            self.breaker.record_success()
