"""Continuous batching across sentences and requests on one ``BatchDecoder``.

One worker thread owns the GPT session, the KV slots and the vocoder sessions, so onnxruntime
never runs two sessions side by side on the board's 2 cores (oversubscription costs 2×). Callers
(one per request: the engine's ``synthesize`` generator) submit a request's sentences as rows and
read each row's audio from its own queue, in sentence order: sentence 1 plays while the later ones
are still decoding.

Per iteration of the worker:
1. admit waiting rows into free slots. The first sentence of a request is admitted at once; the
   later sentences of any request wait while a first sentence is still before its first audio,
   so batching never delays a request's first sound by more than the rows already running;
2. one prompt pass (or one prompt chunk) for the oldest row still in its prompt, together with
   the rows in the slots next to it when the graph allows (``BatchDecoder.prefill_together``);
3. sample every row with fresh logits; a row that ends (EOS, max_new_token, cancelled) frees its
   slot at once, for the next waiting row;
4. render every chunk that came due (a row's next chunk, an ended row's tail) together: windows
   of equal length share one Decoder run and one Vocos run when those graphs are
   batch-invariant (``Vocoder.spectra_many``), then each row's audio and end marker go out;
5. one batched decode step for every row that drew codes.

Pacing (``paced``, the daemon's default): a listener hears a request in real time from its first
sample, and on a CPU a step of 8 rows can take longer than the 21.3 ms of audio it makes per row, so
full batches would starve the sentence being played (measured: 4.8 s of gaps in a 16 s text). Each
iteration checks every request's playing sentence (its *head*): before its first audio it steps with
as few slots as the graph allows; after it, the audio buffered ahead of the listener must cover its
next chunk (steps to go × measured seconds per iteration of that width, plus a pending prompt pass
and a margin). If stepping every row would not, only a contiguous window of slots from the head
steps, as wide as still delivers in time, and other rows' prompt passes wait; if not even the head
alone would, it steps alone all the same (the gap stays short) unless a lone row is far slower than
real time (``PACING_GIVE_UP``): then the listener waits whatever runs, and every row steps so that
the text ends soonest. Rows outside the window pause with their logits and KV kept and resume
unchanged (a row's codes never depend on when it steps), so batching only ever spends time the
listener has spare.
Paced requests also hold their first audio until playing it cannot run dry at the measured
speed (prebuffer.py): a slow engine starts later and then plays through.
Precompute, which nobody hears live, turns pacing off for throughput.

Cancel is per request (the caller's event, or the caller leaving its generator): its rows leave
the batch at the next iteration and the other rows go on untouched.
"""

from __future__ import annotations

import contextvars
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np

from speakd.engines.base import EngineError
from speakd.engines.chattts.batch import BatchDecoder, Row
from speakd.engines.chattts.prebuffer import StartGate
from speakd.engines.chattts.sampling import CodeSampler
from speakd.engines.chattts.vocoder import (
    SAMPLE_RATE,
    SAMPLES_PER_STEP,
    Render,
    StreamingVocoder,
    StreamSchedule,
    Vocoder,
)

log = logging.getLogger(__name__)

_END = object()  # end-of-row marker in a row's audio queue
PACING_MARGIN_S = 0.1  # audio kept in hand beyond a playing row's next chunk (jitter, renders)
# a lone row this many times slower than real time cannot catch up by stepping alone: the
# listener then waits whatever runs, and every row steps so that the text ends soonest (near
# real time, stepping alone still leaves far fewer gaps: docs/benchmarks.md, "Pacing")
PACING_GIVE_UP = 1.25
_EWMA = 0.2  # weight of the newest iteration in the per-iteration time estimates


@dataclass(eq=False)
class _Request:
    cancel: threading.Event
    gate: StartGate | None  # holds the first audio (paced); None: audio goes out at once
    jobs: list[_Job] = field(default_factory=list)  # its sentences, in order
    first_audio_at: float | None = None  # scheduler clock at its first emitted sample
    held: list[tuple[_Job, object]] = field(default_factory=list)  # behind the gate, in order
    # the caller's context: the worker logs a request's lines in it, so they name the request
    context: contextvars.Context = field(default_factory=contextvars.copy_context)

    def head(self) -> _Job | None:
        """The sentence being played: the first that has not ended."""
        return next((j for j in self.jobs if not j.ended), None)

    def ahead_s(self, now: float) -> float:
        """Seconds of audio emitted in playing order beyond what a listener who started at the
        first sample has heard by ``now`` (< 0: the listener is waiting)."""
        head = self.head()
        emitted = sum(j.emitted_s for j in self.jobs if head is None or j.index <= head.index)
        return emitted - (now - (self.first_audio_at if self.first_audio_at is not None else now))


@dataclass(eq=False)
class _Job:
    """A row plus its request, position in the request, vocoder stream and audio queue."""

    request: _Request
    index: int
    row: Row
    stream: StreamingVocoder
    out: queue.SimpleQueue = field(default_factory=queue.SimpleQueue)
    codes: list[np.ndarray] = field(default_factory=list)
    emitted_s: float = 0.0  # audio handed to the caller so far
    ended: bool = False


@dataclass(frozen=True)
class Sentence:
    """What a caller submits per sentence: prompt embeddings (S, hidden) and its sampler."""

    embeds: np.ndarray
    sampler: CodeSampler


class BatchScheduler:
    def __init__(
        self,
        decoder: BatchDecoder,
        vocoder: Vocoder,
        schedule: StreamSchedule,
        paced: bool = True,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.decoder = decoder
        self.vocoder = vocoder
        self.schedule = schedule
        self.paced = paced
        # the listener's clock and every measurement's (tests substitute a simulated one)
        self._clock = clock
        # pacing's estimates: s per iteration by step width, vocoder renders apart (they come in
        # bursts), and the renders' s per hidden state pushed and per window step rendered
        self._iteration_s: dict[int, float] = {}
        self._render_s = self._rendered = 0.0  # this iteration's renders; all renders' s
        self._pushes = self._rendered_steps = 0
        self._due: list[tuple[_Job, Render]] = []  # chunks to render this iteration
        self._ending: list[_Job] = []  # rows whose end marker follows this iteration's renders
        self._holding: list[_Request] = []  # requests whose first audio waits for its gate
        self._prompt_s = 0.0  # s per prompt pass
        self._cond = threading.Condition()
        self._waiting: deque[_Job] = deque()
        self._running: list[_Job] = []  # admitted, in admission order
        self._thread: threading.Thread | None = None
        self.counters: dict[str, float] = dict.fromkeys(
            (
                "steps",
                "row_steps",
                "step_ms",
                "sample_ms",
                "render_ms",
                "prompt_passes",
                "prompt_ms",
                "admitted",
                "paced_steps",
                "renders",
                "render_runs",
            ),
            0,
        )

    # --- callers -----------------------------------------------------------------------------

    def stream(
        self,
        sentences: list[Sentence],
        cancel: threading.Event | None = None,
        codes_out: list[list[np.ndarray]] | None = None,
    ) -> Iterator[tuple[int, np.ndarray]]:
        """Yield (sentence index, float audio) in sentence order as the batch produces it.

        ``codes_out`` (tests, tools) receives each sentence's codes once it has ended. Leaving
        the generator early cancels the request's remaining rows.
        """
        request = _Request(
            cancel if cancel is not None else threading.Event(),
            StartGate(self._clock) if self.paced else None,
        )
        jobs = request.jobs = [self._job(request, i, s) for i, s in enumerate(sentences)]
        with self._cond:
            self._waiting.extend(jobs)
            self._ensure_worker()
            self._cond.notify()
        finished = False
        try:
            for job in jobs:
                while True:
                    item = job.out.get()
                    if item is _END:
                        break
                    if isinstance(item, BaseException):
                        raise item
                    yield job.index, item
                if codes_out is not None:
                    codes_out.append(job.codes)
                if request.cancel.is_set():
                    return
            finished = True
        finally:
            if not finished:
                request.cancel.set()  # the caller left: free its rows

    def _job(self, request: _Request, index: int, sentence: Sentence) -> _Job:
        max_steps = min(sentence.sampler.params.max_new_token, self.decoder.row_context)
        stream = StreamingVocoder(
            self.vocoder, self.schedule, max_steps, self.decoder.spec.hidden_size
        )
        job: _Job
        row = Row(
            embeds=np.asarray(sentence.embeds, np.float32).reshape(-1, sentence.embeds.shape[-1]),
            sampler=sentence.sampler,
            on_step=lambda codes, hidden: self._on_step(job, codes, hidden),
            cancel=request.cancel.is_set,
        )
        job = _Job(request, index, row, stream)
        return job

    # --- worker ------------------------------------------------------------------------------

    def _ensure_worker(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(
                target=self._work, name="speakd-chattts-batch", daemon=True
            )
            self._thread.start()

    def _work(self) -> None:
        while True:
            with self._cond:
                self._drop_cancelled_waiting()
                while not self._waiting and not self._running:
                    self._cond.wait()
                    self._drop_cancelled_waiting()
                self._admit()
            try:
                self._iterate()
            except Exception as e:  # a model fault: fail the rows in flight, keep serving
                log.exception("chattts batch: decode failed")
                self._due.clear()
                for job in [*self._running, *self._ending]:
                    self._end(job, EngineError(f"ChatTTS decode failed: {e}"))
                self._ending.clear()

    def _drop_cancelled_waiting(self) -> None:
        for job in [j for j in self._waiting if j.request.cancel.is_set()]:
            self._waiting.remove(job)
            job.row.stats.stop = "cancelled"
            job.ended = True
            job.out.put(_END)

    def _warming(self) -> bool:
        """A request's first sentence is running but has not sounded yet."""
        return any(j.index == 0 and j.request.first_audio_at is None for j in self._running)

    def _admit(self) -> None:
        while self._waiting and self.decoder.free_slots():
            job = next((j for j in self._waiting if j.index == 0), None)
            if job is None:
                if self._warming():
                    return
                job = self._waiting[0]
            self._waiting.remove(job)
            try:
                self.decoder.admit(job.row)
            except ValueError as e:
                job.out.put(EngineError(str(e)))
                job.out.put(_END)
                continue
            self._running.append(job)
            self.counters["admitted"] += 1

    def _iterate(self) -> None:
        for job in [j for j in self._running if j.row.cancel()]:  # between passes: leave now
            job.row.stats.stop = "cancelled"
            self._end(job)
        t_iter, self._render_s = self._clock(), 0.0
        window, may_prompt = self._plan() if self.paced else (None, [])
        prompting = [j for j in self._running if j.row.prefilled < j.row.prompt_len]
        if window is not None:
            prompting = [j for j in prompting if j in may_prompt]
        if prompting:
            t0 = self._clock()
            self.decoder.prefill_together([j.row for j in prompting])
            seconds = self._clock() - t0
            self._prompt_s = seconds if not self._prompt_s else _blend(self._prompt_s, seconds)
            self.counters["prompt_passes"] += 1
            self.counters["prompt_ms"] += seconds * 1e3
        drawing = [
            j
            for j in self._running
            if j.row.logits is not None and (window is None or j.row.slot in window)
        ]
        stepping = []
        t0 = self._clock()
        drawn = self.decoder.sample([j.row for j in drawing])
        self.counters["sample_ms"] += (self._clock() - t0) * 1e3
        for job, going_on in zip(drawing, drawn, strict=True):
            if going_on:
                stepping.append(job.row)
            else:
                self._end(job)
        self._render_due()
        self._release_held()
        if stepping:
            t0 = self._clock()
            lo, hi = self.decoder.step(stepping)
            self.counters["step_ms"] += (self._clock() - t0) * 1e3
            self.counters["steps"] += 1
            self.counters["row_steps"] += len(stepping)
            self.counters["paced_steps"] += window is not None
            if not prompting:  # an iteration costs what its step's width and its rows cost
                seconds, width = self._clock() - t_iter - self._render_s, hi - lo
                old = self._iteration_s.get(width)
                # a preempted thread or a page fault is not the step's cost: cap outliers
                new = seconds if old is None else _blend(old, min(seconds, 2 * old))
                self._iteration_s[width] = new

    def _plan(self) -> tuple[range | None, list[_Job]]:
        """The slots to step (None: every row) and the rows whose prompt passes may run (module
        docstring, "Pacing")."""
        if not self._running:
            return None, []
        now = self._clock()
        lo, hi = self.decoder.window([j.row.slot for j in self._running])  # all, prompts done
        prompt_s = (
            self._prompt_s
            if any(j.row.prefilled < j.row.prompt_len for j in self._running)
            else 0.0
        )
        prompts: list[_Job] = []
        slots: list[int] = []
        for job in self._running:
            request, slot = job.request, job.row.slot
            if job is not request.head():
                continue
            if request.first_audio_at is None:  # not sounding yet: as soon as it can
                width, hold = 1, True
            else:
                steps, budget = job.stream.steps_to_next_chunk(), request.ahead_s(now)
                budget -= PACING_MARGIN_S
                width, hold = self._width(hi - lo, steps, budget - prompt_s), False
                if width == hi - lo:
                    continue
                # no room for a prompt pass: hold them; no room at all: it steps alone, unless
                # even alone it is far slower than its listener (PACING_GIVE_UP)
                if not width:
                    width, hold = self._width(hi - lo, steps, budget), True
                if not width:
                    alone = self._iteration_estimate(self.decoder.min_rows, rows=1)
                    if alone is None or alone >= PACING_GIVE_UP * SAMPLES_PER_STEP / SAMPLE_RATE:
                        continue
                    width = 1
                width = max(width, 2)  # the next sentence, which plays right after, goes along
            slots += [slot, min(self.decoder.batch_size, slot + width) - 1]
            prompts += [job] if hold else [j for j in self._running if j.request is request]
        if not slots:
            return None, []
        lo, hi = self.decoder.window(slots)
        window = range(lo, hi)
        return window, [j for j in prompts if j.row.slot in window]

    def _width(self, widest: int, steps: int, budget_s: float) -> int:
        """The widest step (≤ ``widest`` slots) whose iterations deliver a row's next chunk,
        ``steps`` steps away, within ``budget_s``; 0 if not even one slot does."""
        for width in range(widest, 0, -1):
            per_iteration = self._iteration_estimate(width)
            if per_iteration is None or per_iteration * steps <= budget_s:
                return width
        return 0

    def _iteration_estimate(self, width: int, rows: int | None = None) -> float | None:
        """Seconds per iteration whose step is ``width`` slots wide, renders of ``rows`` rows
        (default: ``width``) included: measured, else scaled up from the widest measured below
        it, else the narrowest measured above it (None before any measurement)."""
        if not self._iteration_s:
            return None
        renders = (width if rows is None else rows) * self._rendered / max(self._pushes, 1)
        if width in self._iteration_s:
            return self._iteration_s[width] + renders
        narrower = [w for w in self._iteration_s if w < width]
        if not narrower:
            return self._iteration_s[min(self._iteration_s)] + renders
        w = max(narrower)
        return self._iteration_s[w] * width / w + renders

    def _on_step(self, job: _Job, codes: np.ndarray, hidden: np.ndarray) -> None:
        job.codes.append(codes.copy())
        self._pushes += 1
        if job.request.gate is not None and job is job.request.head():
            job.request.gate.tick()
        render = job.stream.add(hidden)
        if render is not None:
            self._due.append((job, render))

    def _render_due(self) -> None:
        """Render this iteration's due chunks together, emit each row's audio in order, then
        the end markers of the rows that ended."""
        due, self._due = self._due, []
        ending, self._ending = self._ending, []
        error: BaseException | None = None
        if due:
            t0 = self._clock()
            try:
                spectra = self.vocoder.spectra_many([r.hiddens for _, r in due])
            except Exception as e:  # the vocoder failed: the rows rendered with it fail
                error = EngineError(f"ChatTTS vocoder failed: {e}")
                for job, _ in due:
                    if job not in ending:
                        job.request.cancel.set()
                    self._deliver(job, error)
            else:
                for (job, render), pair in zip(due, spectra, strict=True):
                    self._emit(job, job.stream.emit(render, pair))
            seconds = self._clock() - t0
            self._render_s += seconds
            self._rendered += seconds
            self.counters["render_ms"] += seconds * 1e3
            self._rendered_steps += sum(len(r.hiddens) for _, r in due)
            self.counters["renders"] += len(due)
            self.counters["render_runs"] += len({len(r.hiddens) for _, r in due})
        for job in ending:
            self._finish(job, None)

    def _emit(self, job: _Job, audio: np.ndarray) -> None:
        job.emitted_s += len(audio) / SAMPLE_RATE
        self._deliver(job, audio)

    def _deliver(self, job: _Job, item: object) -> None:
        """Hand ``item`` (audio, an error, the end marker) to the caller, or hold it while the
        request's first audio waits for its gate (prebuffer.py)."""
        request = job.request
        if request.held or (request.first_audio_at is None and request.gate is not None):
            if not request.held:
                self._holding.append(request)
            request.held.append((job, item))
            return
        if request.first_audio_at is None and isinstance(item, np.ndarray):
            request.first_audio_at = self._clock()
        job.out.put(item)

    def _release_held(self) -> None:
        """Let a request's held audio go once its gate opens (prebuffer.py), or once its first
        sentence has ended or it is cancelled: the gate predicts the first sentence only."""
        for request in list(self._holding):
            head = request.head()
            gate = request.gate
            if not (
                gate is None
                or head is None
                or head.index > 0
                or request.cancel.is_set()
                or gate.opens(self.schedule, head.stream, head.row.max_new, self._render_step_s())
            ):
                continue
            self._holding.remove(request)
            held, request.held, request.gate = request.held, [], None
            for job, item in held:
                self._deliver(job, item)

    def _render_step_s(self) -> float:
        return self._rendered / self._rendered_steps if self._rendered_steps else 0.0

    def _end(self, job: _Job, error: BaseException | None = None) -> None:
        """Free the row's slot now; its tail (unless cancelled or failed) renders with this
        iteration's chunks, and its end marker follows."""
        job.ended = True
        self.decoder.release(job.row)
        with self._cond:
            if job in self._running:
                self._running.remove(job)
        if error is None and job.row.stats.stop != "cancelled":
            tail = job.stream.final()
            if tail is not None:
                self._due.append((job, tail))
            self._ending.append(job)
            return
        self._finish(job, error)

    def _finish(self, job: _Job, error: BaseException | None) -> None:
        job.request.context.run(
            log.debug,
            "chattts batch: sentence %d done: %d steps (%s)",
            job.index,
            job.row.stats.steps,
            job.row.stats.stop,
        )
        if error is not None:
            self._deliver(job, error)
        self._deliver(job, _END)  # last: the caller may return as soon as it sees it


def _blend(old: float, new: float) -> float:
    return (1 - _EWMA) * old + _EWMA * new
