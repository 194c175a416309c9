"""Keep a failing or wedged engine from taking the daemon with it.

``GuardedEngine`` wraps any engine: it runs the engine's generator on its own thread so a hang is
noticed (no chunk within ``hang_timeout_s``), measures the real-time factor, and feeds a circuit
breaker. After ``failure_threshold`` consecutive failures (exceptions, hangs, or RTF above
``max_rtf``) the breaker opens and synthesis is refused at once with ``EngineUnavailable`` — the
scheduler then plays the cached fallback prompt instead of silence. After ``reset_timeout_s`` one
request is let through (half-open); its success closes the breaker, its failure re-opens it.
"""

from __future__ import annotations

import contextvars
import logging
import queue
import threading
import time
from collections.abc import Iterator
from typing import Any

from speakd.audio import AudioChunk
from speakd.engines.base import Engine, EngineError, SynthesisConfig, VoiceInfo

log = logging.getLogger(__name__)


class EngineUnavailable(EngineError):
    """The breaker is open: the engine failed repeatedly and is resting."""

    code = "engine_unavailable"


class EngineTimeout(EngineError):
    code = "engine_timeout"


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


_END = object()


class GuardedEngine:
    """An Engine that refuses work while its breaker is open and notices hangs and slowness."""

    def __init__(
        self,
        engine: Engine,
        breaker: CircuitBreaker,
        hang_timeout_s: float = 30.0,
        max_rtf: float = 3.0,
    ) -> None:
        self.inner = engine
        self.breaker = breaker
        self.hang_timeout_s = hang_timeout_s
        self.max_rtf = max_rtf

    def __getattr__(self, name: str) -> Any:  # kind, sample_rate, bundle_id, precision
        return getattr(self.inner, name)

    def voices(self) -> list[VoiceInfo]:
        return self.inner.voices()

    def default_voice(self) -> str:
        return self.inner.default_voice()

    def normalize_text(self, text: str) -> str:
        return self.inner.normalize_text(text)

    def audio_params(self, config: SynthesisConfig) -> dict[str, Any]:
        return self.inner.audio_params(config)

    def synthesize(
        self, text: str, config: SynthesisConfig, cancel: threading.Event | None = None
    ) -> Iterator[AudioChunk]:
        if not self.breaker.allow():
            raise EngineUnavailable(
                f"the engine is unavailable after repeated failures ({self.breaker.last_error})"
            )
        cancel = cancel or threading.Event()
        inner_cancel = threading.Event()
        chunks: queue.Queue[Any] = queue.Queue(maxsize=64)
        blocked = [0.0]  # seconds the engine thread waited for the consumer (not its own time)

        def hand_over(item: Any) -> None:
            t = time.monotonic()
            while not inner_cancel.is_set():
                try:
                    chunks.put(item, timeout=0.1)
                    break
                except queue.Full:
                    continue
            blocked[0] += time.monotonic() - t

        def run() -> None:
            try:
                for chunk in self.inner.synthesize(text, config, inner_cancel):
                    hand_over(chunk)
                hand_over(_END)
            except BaseException as e:  # handed to the consumer, who decides
                hand_over(e)

        threading.Thread(  # in the caller's context: its logs keep the request id
            target=contextvars.copy_context().run, args=(run,), name="speakd-engine", daemon=True
        ).start()
        t0, audio_s, outcome = time.monotonic(), 0.0, "incomplete"
        try:
            while True:
                deadline = time.monotonic() + self.hang_timeout_s
                item = None
                while item is None:
                    if cancel.is_set():
                        outcome = "cancelled"
                        return
                    try:
                        item = chunks.get(timeout=0.05)
                    except queue.Empty:
                        if time.monotonic() > deadline:
                            outcome = f"no audio for {self.hang_timeout_s:.0f} s (engine hung)"
                            raise EngineTimeout(f"synthesis timed out: {outcome}") from None
                if item is _END:
                    outcome = "done"
                    return
                if isinstance(item, BaseException):
                    # A clean EngineError is about the request (bad text, unknown voice), not
                    # the engine's health; anything else is a fault.
                    refused = isinstance(item, EngineError)
                    outcome = "refused" if refused else f"{type(item).__name__}: {item}"
                    raise item
                audio_s += item.duration
                yield item
        finally:
            inner_cancel.set()
            self._judge(outcome, time.monotonic() - t0 - blocked[0], audio_s)

    def _judge(self, outcome: str, elapsed: float, audio_s: float) -> None:
        if outcome in ("cancelled", "incomplete", "refused"):
            self.breaker.release()  # nothing learnt about the engine's health
            return
        if outcome != "done":
            self.breaker.record_failure(outcome)
            return
        rtf = elapsed / audio_s if audio_s else 0.0
        if audio_s > 1.0 and rtf > self.max_rtf:
            self.breaker.record_failure(f"too slow: RTF {rtf:.2f} > {self.max_rtf}")
        else:
            self.breaker.record_success()
