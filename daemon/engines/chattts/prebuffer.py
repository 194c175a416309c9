"""When to let a request's first audio go: as soon as playing from then on cannot run dry.

The stream schedule (vocoder.py) fixes where chunks start and end by step counts only, so the
audio never depends on speed. What depends on speed is whether each chunk is rendered before the
listener reaches it: chunk k ≥ 1 is rendered once its steps and its look-ahead exist, and chunks
grow ×1.25, so an engine close to real time falls behind on the larger chunks even though it is
faster than real time on average (steady state needs a real-time factor below 1/1.25, and the
small first chunk covers the second only below about 0.4). Changing the chunks with the speed
would change the audio; instead the first audio is held back. The engine keeps decoding, the
held chunks wait, and they go out when the measured speed predicts that every later chunk
arrives before the audio ahead of it has played. A fast engine releases its first chunk at once;
a slow one starts later and then plays through. At or above real time no finite hold avoids
gaps on long text, so nothing is held (the listener waits whatever runs).

The prediction (``deficit_s``) uses the seconds per decode step measured on this stream (every
cost between two steps included: sampling, other rows, renders) and the seconds per rendered
step of the Decoder/Vocos, over the sentence's longest possible length (its ``max_new_token``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from speakd.engines.chattts.vocoder import (
    SAMPLE_RATE,
    SAMPLES_PER_STEP,
    StreamingVocoder,
    StreamSchedule,
)

STEP_AUDIO_S = SAMPLES_PER_STEP / SAMPLE_RATE  # 21.3 ms of audio per decode step
MARGIN_S = 0.02  # kept in hand at every chunk (a step or two of jitter)
SLACK = 1.05  # steps are predicted this much slower than measured (0.95 × 1.05 < 1)
MAX_HOLD_S = 4.0  # never hold a first chunk longer (a listener's patience)


def deficit_s(
    schedule: StreamSchedule,
    stream: StreamingVocoder,
    horizon: int,
    step_s: float,
    render_step_s: float,
) -> float:
    """Seconds by which the latest chunk would miss its turn if playback started now from the
    stream's first sample (≤ 0: none would), decoding on at ``step_s`` per step and rendering at
    ``render_step_s`` per window step, up to ``horizon`` steps in all."""
    worst = float("-inf")
    k, start = stream.chunks, stream.done
    while start < horizon:
        end = min(horizon, start + schedule.size(k))
        pushed = end + schedule.look_ahead(k) if end < horizon else horizon
        window = min(horizon, pushed) - max(0, start - schedule.left)
        ready = step_s * max(0, pushed - stream.n) + render_step_s * window
        worst = max(worst, ready + MARGIN_S - STEP_AUDIO_S * start)
        k, start = k + 1, end
    return worst


@dataclass
class StartGate:
    """One request's hold on its first audio. ``tick`` at every hidden state its playing stream
    receives; ``opens`` says whether the held audio may go now. Once open it stays open."""

    clock: Callable[[], float]
    held_since: float | None = None
    is_open: bool = False
    _first: float | None = field(default=None, repr=False)
    _last: float = field(default=0.0, repr=False)
    _ticks: int = field(default=0, repr=False)

    def tick(self) -> None:
        self._last = self.clock()
        if self._first is None:
            self._first = self._last
        self._ticks += 1

    @property
    def step_s(self) -> float:
        """Mean seconds per step since the first tick: renders come in bursts, so a running
        average over the stream, not the latest intervals, predicts the steps to come."""
        if self._first is None or self._ticks < 2:
            return 0.0
        return (self._last - self._first) / (self._ticks - 1)

    def opens(
        self, schedule: StreamSchedule, stream: StreamingVocoder, horizon: int, render_step_s: float
    ) -> bool:
        """True once the stream has audio and playing it from now on would not run dry; also
        when the stream decodes no faster than real time (no hold helps), or has held
        ``MAX_HOLD_S``."""
        if self.is_open:
            return True
        if stream.chunks == 0:
            return False
        now = self.clock()
        if self.held_since is None:
            self.held_since = now
        step = self.step_s * SLACK
        self.is_open = (
            step >= STEP_AUDIO_S
            or now - self.held_since >= MAX_HOLD_S
            or deficit_s(schedule, stream, horizon, step, render_step_s) <= 0
        )
        return self.is_open
