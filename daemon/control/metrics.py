"""Prometheus figures for every front-end: requests and outcomes, first audio, RTF, cache, queue.

Fed from three places, so no front-end counts anything itself and a new one is counted for free:

- ``Control`` tells ``said`` (a request handed to the queue), ``stream_opened`` /
  ``stream_closed`` (audio handed back: socket ``synth``, HTTP speech, Wyoming) and ``refused``
  (turned away before either: a bad field, an unknown voice, a line that is not JSON),
  ``warned`` (part of a request skipped, the rest spoken: docs/reliability.md, "Lenient
  input") and ``stream_waited`` (how long a stream waited for its turn) —
  ``speakd.control``'s ``observer``;
- the scheduler's ``listeners`` carry every played request's events: ``started`` gives the
  first-audio latency, the terminal ``finished``/``error`` the outcome;
- the ``Guard`` (``speakd.request.breaker``) reports each synthesis it judged (compute s, audio s):
  RTF.

The front-end label is the prefix of ``SpeakRequest.origin`` (``json:``, ``ssip:``, ``mqtt:``,
``wyoming:``, ``http:``). Queue, streams, cache and breaker figures are read from
``Control.status()`` at scrape time; the cache's hit/miss counters are the resolver's, which a
configuration reload replaces (Prometheus sees a counter reset, as after a restart).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from speakd.control.recent import Recent
from speakd.engines.spans import Spans
from speakd.request.messages import Event, EventType, SpeakRequest, error_data
from speakd.request.stream import AudioStream

if TYPE_CHECKING:
    from speakd.control import Control

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
FRONTENDS = ("json", "ssip", "mqtt", "wyoming", "http")
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
WAIT_BUCKETS = (0.001, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)  # the first: did not wait
RTF_BUCKETS = (0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0)
MAX_TRACKED = 10_000  # requests awaiting their terminal event (a bound, not a working limit)

disable_created_metrics()  # no *_created series: a scrape shows what operators read


def frontend_of(origin: str) -> str:
    """``json:uid=1000`` → ``json``; an origin no front-end made → ``other``."""
    prefix = origin.split(":", 1)[0]
    return prefix if prefix in FRONTENDS else "other"


class Metrics:
    """The collectors of one daemon (its own registry: tests run several daemons per process)."""

    def __init__(self, control: Control) -> None:
        self.control = control
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "speakd_requests",
            "Requests by front-end, kind (say: played on the board; stream: audio handed back; "
            "refused: turned away before either) and outcome (a finished status, an error code, "
            "or client_gone)",
            ["frontend", "kind", "outcome"],
            registry=self.registry,
        )
        self.first_audio = Histogram(
            "speakd_first_audio_seconds",
            "From receiving a request to its first audio (say: at the sink; stream: ready to send)",
            ["kind"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.warnings = Counter(
            "speakd_warnings",
            "Requests spoken with a part skipped instead of refused, by front-end and warning code "
            "(unknown_clip, unknown_speaker…)",
            ["frontend", "code"],
            registry=self.registry,
        )
        self.stream_wait = Histogram(
            "speakd_stream_wait_seconds",
            "How long each audio stream waited for its turn (limits.max_streams)",
            buckets=WAIT_BUCKETS,
            registry=self.registry,
        )
        self.rtf = Histogram(
            "speakd_synthesis_rtf",
            "Real-time factor of each finished synthesis (compute s / audio s; < 1 is faster)",
            buckets=RTF_BUCKETS,
            registry=self.registry,
        )
        self.part_seconds = Histogram(
            "speakd_synthesis_part_seconds",
            "Time of each part of a finished synthesis up to its first chunk, by part (VITS: "
            "phonemes, prior, flow, decoder, words; ChatTTS: text, prompt, gpt prompt, gpt step, "
            "sampling, vocoder) and first_chunk (the whole wait; the rest is the daemon's own)",
            ["part"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.pack_refusals = Counter(
            "speakd_pack_refusals",
            "Prompt packs refused over MQTT, by reason (unsigned_pack, bad_signature, "
            "untrusted_key, replayed, corrupt_chunk, wrong_bundle, …; docs/fleet.md)",
            ["reason"],
            registry=self.registry,
        )
        self.registry.register(_StateCollector(control))
        self.recent = Recent()  # the page's plot of the last minutes (GET /v1/recent)
        self._said: dict[str, str] = {}  # request id → front-end, until its terminal event
        self._first: dict[int, asyncio.Task[None]] = {}  # stream id → first-chunk watcher
        control.listen(self.on_event)
        control.observer = self

    def close(self) -> None:
        self.control.unlisten(self.on_event)
        if self.control.observer is self:
            self.control.observer = None

    def exposition(self) -> bytes:
        return generate_latest(self.registry)

    # ---- playing on the board: Control.say, then the scheduler's events ---------------------

    def said(self, request: SpeakRequest) -> None:
        if len(self._said) >= MAX_TRACKED:  # terminal events lost to a bug: do not grow forever
            self._said.pop(next(iter(self._said)))
        self._said[request.id] = frontend_of(request.origin)
        self.recent.said(request)

    def on_event(self, event: Event) -> None:
        if event.type == EventType.STARTED and "latency_ms" in event.data:
            self.first_audio.labels("say").observe(event.data["latency_ms"] / 1000)
            frontend = self._said.get(event.request_id, "other")
            self.recent.started(event.request_id, frontend, event.data["latency_ms"])
        elif event.terminal:
            self.recent.ended(event.request_id)
            frontend = self._said.pop(event.request_id, "other")
            outcome = event.data.get("status") or event.data.get("code") or "error"
            self.requests.labels(frontend, "say", outcome).inc()

    # ---- turned away: Control.build_request, or a front-end before it -----------------------

    def refused(self, origin: str, code: str) -> None:
        self.requests.labels(frontend_of(origin), "refused", code).inc()

    def pack_refused(self, reason: str) -> None:
        self.pack_refusals.labels(reason).inc()

    def warned(self, origin: str, code: str) -> None:
        self.warnings.labels(frontend_of(origin), code).inc()

    # ---- handing audio back: Control.stream -------------------------------------------------

    def stream_waited(self, seconds: float) -> None:
        self.stream_wait.observe(seconds)

    def stream_opened(self, request: SpeakRequest, stream: AudioStream) -> None:
        if stream.chunks:  # a cache hit: whole already
            self._first_audio(request, "cache")
            return
        if stream.done:  # failed before any audio
            return
        task = asyncio.create_task(self._watch_first(request, stream), name=f"first-{request.id}")
        self._first[id(stream)] = task
        task.add_done_callback(lambda _t: self._first.pop(id(stream), None))

    def stream_closed(
        self, request: SpeakRequest, stream: AudioStream | None, error: BaseException | None
    ) -> None:
        if stream is not None and (task := self._first.pop(id(stream), None)) is not None:
            task.cancel()
        if error is None:
            outcome = "done" if stream is not None and stream.done else "client_gone"
        elif isinstance(error, ConnectionError | asyncio.CancelledError | GeneratorExit):
            outcome = "client_gone"
        else:
            outcome = error_data(error)["code"]
        self.requests.labels(frontend_of(request.origin), "stream", outcome).inc()

    async def _watch_first(self, request: SpeakRequest, stream: AudioStream) -> None:
        with contextlib.suppress(Exception):  # a failed stream has no first audio
            async for _chunk in stream.aread():
                self._first_audio(request, "synthesis")
                return

    def _first_audio(self, request: SpeakRequest, source: str) -> None:
        latency = time.monotonic() - request.received
        self.first_audio.labels("stream").observe(latency)
        self.recent.add(request, frontend_of(request.origin), "stream", source, latency * 1000)

    # ---- synthesis: the Guard ---------------------------------------------------------------

    def synthesis(self, elapsed_s: float, audio_s: float, spans: Spans | None = None) -> None:
        if audio_s > 0:
            self.rtf.observe(elapsed_s / audio_s)
        if spans is None or spans.first is None or spans.first_s is None:
            return
        for part, seconds in spans.first.items():
            self.part_seconds.labels(part).observe(seconds)
        self.part_seconds.labels("first_chunk").observe(spans.first_s)


class _StateCollector(Collector):
    """What is true now, read from ``Control.status()`` when Prometheus scrapes."""

    def __init__(self, control: Control) -> None:
        self.control = control

    def collect(self) -> Iterator[Metric]:
        status = self.control.status()
        yield _gauge("speakd_queue_length", "Requests waiting to play", status["queue_length"])
        streams = status["streams"]
        yield _gauge("speakd_streams_active", "Audio streams being handed back", streams["active"])
        yield _gauge(
            "speakd_uptime_seconds", "Seconds since the daemon started", status["uptime_s"]
        )
        breaker = status.get("breaker") or {}
        states = GaugeMetricFamily(
            "speakd_breaker_state",
            "The engine's circuit breaker: 1 for its current state",
            labels=["state"],
        )
        for state in ("closed", "half-open", "open"):
            states.add_metric([state], 1.0 if breaker.get("state") == state else 0.0)
        yield states
        yield from _cache(status["source"].get("cache"))
        yield from _voices(status["voices"]["voices"])
        audio = status.get("audio") or {}
        yield _gauge(
            "speakd_audio_available",
            "1 when the audio sink can play",
            1.0 if audio.get("available", True) else 0.0,
        )


def _voices(voices: dict[str, dict[str, Any]]) -> Iterator[Metric]:
    """Which voices are in memory, what each costs, and how long each took to load."""
    families = (
        ("speakd_voice_loaded", "1 when the voice's model is in memory", "loaded"),
        ("speakd_voice_resident_bytes", "Resident memory its load added", "resident_bytes"),
        ("speakd_voice_load_seconds", "How long its last load took", "load_s"),
    )
    for name, help_, key in families:
        family = GaugeMetricFamily(name, help_, labels=["voice", "engine"])
        for voice, state in voices.items():
            family.add_metric([voice, state["engine"]], float(state[key] or 0))
        yield family


def _cache(cache: dict[str, Any] | None) -> Iterator[Metric]:
    unavailable = bool(cache and cache.get("unavailable"))
    yield _gauge(
        "speakd_cache_unavailable",
        "1 when the configured cache could not be opened (status: cache.unavailable says why)",
        1.0 if unavailable else 0.0,
    )
    if not cache or unavailable:
        return
    for key, help_ in (("hits", "Cache hits"), ("misses", "Cache misses")):
        counter = CounterMetricFamily(f"speakd_cache_{key}", help_ + " (since start or reload)")
        counter.add_metric([], float(cache.get(key, 0)))
        yield counter
    yield _gauge("speakd_cache_bytes", "Bytes of audio in the cache", cache.get("bytes", 0))
    yield _gauge("speakd_cache_clips", "Clips in the cache", cache.get("clips", 0))
    yield _gauge("speakd_cache_max_bytes", "cache.max_bytes", cache.get("max_bytes", 0))


def _gauge(name: str, help_: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, help_, value=float(value))
