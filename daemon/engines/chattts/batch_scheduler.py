"""Continuous batching across sentences and requests on one ``BatchDecoder`` (issue 12).

One worker thread owns the GPT session, the KV slots and the vocoder sessions, so onnxruntime
never runs two sessions side by side on the board's 2 cores (oversubscription costs 2×). Callers
(one per request: the engine's ``synthesize`` generator) submit a request's sentences as rows and
read each row's audio from its own queue, in sentence order: sentence 1 plays while the later ones
are still decoding.

Per iteration of the worker:
1. admit waiting rows into free slots. The first sentence of a request is admitted at once; the
   later sentences of any request wait while a first sentence is still before its first audio,
   so batching never delays a request's first sound by more than the rows already running;
2. one prompt pass (or one prompt chunk) for the oldest row still in its prompt;
3. sample every row with fresh logits; a row that ends (EOS, max_new_token, cancelled) renders its
   tail, gets its end marker and frees its slot at once, for the next waiting row;
4. one batched decode step for every row that drew codes.

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
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from speakd.engines.base import EngineError
from speakd.engines.chattts.batch import BatchDecoder, Row
from speakd.engines.chattts.sampling import CodeSampler
from speakd.engines.chattts.vocoder import StreamingVocoder, StreamSchedule, Vocoder

log = logging.getLogger(__name__)

_END = object()  # end-of-row marker in a row's audio queue


@dataclass(eq=False)
class _Request:
    cancel: threading.Event
    first_audio: bool = False
    # the caller's context: the worker logs a request's lines in it, so they name the request
    context: contextvars.Context = field(default_factory=contextvars.copy_context)


@dataclass(eq=False)
class _Job:
    """A row plus its request, position in the request, vocoder stream and audio queue."""

    request: _Request
    index: int
    row: Row
    stream: StreamingVocoder
    out: queue.SimpleQueue = field(default_factory=queue.SimpleQueue)
    codes: list[np.ndarray] = field(default_factory=list)


@dataclass(frozen=True)
class Sentence:
    """What a caller submits per sentence: prompt embeddings (S, hidden) and its sampler."""

    embeds: np.ndarray
    sampler: CodeSampler


class BatchScheduler:
    def __init__(self, decoder: BatchDecoder, vocoder: Vocoder, schedule: StreamSchedule) -> None:
        self.decoder = decoder
        self.vocoder = vocoder
        self.schedule = schedule
        self._cond = threading.Condition()
        self._waiting: deque[_Job] = deque()
        self._running: list[_Job] = []  # admitted, in admission order
        self._thread: threading.Thread | None = None
        self.counters: dict[str, float] = dict.fromkeys(
            ("steps", "row_steps", "step_ms", "prompt_passes", "prompt_ms", "admitted"), 0
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
        request = _Request(cancel if cancel is not None else threading.Event())
        jobs = [self._job(request, i, s) for i, s in enumerate(sentences)]
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
                for job in list(self._running):
                    self._end(job, EngineError(f"ChatTTS decode failed: {e}"))

    def _drop_cancelled_waiting(self) -> None:
        for job in [j for j in self._waiting if j.request.cancel.is_set()]:
            self._waiting.remove(job)
            job.row.stats.stop = "cancelled"
            job.out.put(_END)

    def _warming(self) -> bool:
        """A request's first sentence is running but has not sounded yet."""
        return any(j.index == 0 and not j.request.first_audio for j in self._running)

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
        prompting = [j for j in self._running if j.row.prefilled < j.row.prompt_len]
        if prompting:
            t0 = time.perf_counter()
            self.decoder.prefill(prompting[0].row)
            self.counters["prompt_passes"] += 1
            self.counters["prompt_ms"] += (time.perf_counter() - t0) * 1e3
        stepping = []
        for job in list(self._running):
            if job.row.logits is None:
                continue
            if self.decoder.sample(job.row):
                stepping.append(job.row)
            else:
                self._end(job)
        if stepping:
            t0 = time.perf_counter()
            self.decoder.step(stepping)
            self.counters["step_ms"] += (time.perf_counter() - t0) * 1e3
            self.counters["steps"] += 1
            self.counters["row_steps"] += len(stepping)

    def _on_step(self, job: _Job, codes: np.ndarray, hidden: np.ndarray) -> None:
        job.codes.append(codes.copy())
        audio = job.stream.push(hidden)
        if audio is not None:
            self._emit(job, audio)

    def _emit(self, job: _Job, audio: np.ndarray) -> None:
        if job.index == 0:
            job.request.first_audio = True
        job.out.put(audio)

    def _end(self, job: _Job, error: BaseException | None = None) -> None:
        """Render the row's tail (unless cancelled or failed), mark its end, free its slot."""
        try:
            if error is None and job.row.stats.stop != "cancelled":
                tail = job.stream.finish()
                if tail is not None:
                    self._emit(job, tail)
        except Exception as e:  # the vocoder failed on this row only
            error = EngineError(f"ChatTTS vocoder failed: {e}")
        finally:
            self.decoder.release(job.row)
            with self._cond:
                if job in self._running:
                    self._running.remove(job)
            job.request.context.run(
                log.debug, "chattts batch: sentence %d done: %d steps (%s)",
                job.index, job.row.stats.steps, job.row.stats.stop,
            )  # fmt: skip
            if error is not None:
                job.out.put(error)
            job.out.put(_END)  # last: the caller may return as soon as it sees it
