"""speakd.control.metrics on its own: the front-end label from each front-end's origin, outcomes of
played and streamed requests, and the figures read from the status at scrape time."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from speakd.control.metrics import Metrics, frontend_of
from speakd.request.messages import Event, EventType, RequestError, SpeakRequest
from speakd.request.stream import AudioStream

STATUS: dict[str, Any] = {
    "queue_length": 2,
    "streams": {"active": 1},
    "uptime_s": 5.0,
    "breaker": {"state": "open"},
    "source": {"cache": {"hits": 7, "misses": 3, "bytes": 1000, "clips": 4, "max_bytes": 9}},
    "audio": {"available": False},
    "voices": {
        "voices": {
            "en_US-joe-medium": {
                "engine": "vits",
                "loaded": True,
                "resident_bytes": 123,
                "load_s": 0.5,
            },
            "chattts": {"engine": "chattts", "loaded": False, "resident_bytes": 0, "load_s": None},
        }
    },
}


def make() -> Metrics:
    listeners: list[Any] = []
    control = SimpleNamespace(
        listen=listeners.append,
        unlisten=listeners.remove,
        observer=None,
        status=lambda: STATUS,
    )
    return Metrics(control)  # type: ignore[arg-type]


def value(m: Metrics, name: str, **labels: str) -> float | None:
    return m.registry.get_sample_value(name, labels)


@pytest.mark.parametrize(
    ("origin", "frontend"),
    [
        ("json:uid=1000", "json"),
        ("json", "json"),
        ("ssip:orca", "ssip"),
        ("mqtt:hermes/tts/say", "mqtt"),
        ("wyoming:127.0.0.1:5000", "wyoming"),
        ("http:127.0.0.1", "http"),
        ("", "other"),
        ("precompute", "other"),
    ],
)
def test_the_front_end_is_the_origin_prefix(origin: str, frontend: str) -> None:
    assert frontend_of(origin) == frontend


def test_played_requests_count_by_front_end_and_outcome() -> None:
    m = make()
    for rid, origin, last in (
        ("a", "ssip:orca", Event(EventType.FINISHED, "a", {"status": "done"})),
        ("b", "mqtt:x", Event(EventType.ERROR, "b", {"code": "queue_full"})),
        ("c", "json:1", Event(EventType.FINISHED, "c", {"status": "interrupted"})),
    ):
        m.said(SpeakRequest(text="hi", id=rid, origin=origin))
        m.on_event(Event(EventType.STARTED, rid, {"latency_ms": 20.0}))
        m.on_event(last)
    assert value(m, "speakd_requests_total", frontend="ssip", kind="say", outcome="done") == 1
    assert value(m, "speakd_requests_total", frontend="mqtt", kind="say", outcome="queue_full") == 1
    assert value(m, "speakd_requests_total", frontend="json", kind="say", outcome="interrupted")
    assert value(m, "speakd_first_audio_seconds_count", kind="say") == 3
    assert value(m, "speakd_first_audio_seconds_sum", kind="say") == pytest.approx(0.06)


async def test_streams_count_done_refused_failed_and_gone() -> None:
    m = make()
    whole = AudioStream("k")
    whole.finish()
    for origin, stream, error, outcome in (
        ("wyoming:h:1", whole, None, "done"),
        ("http:h", None, RequestError("busy", "full"), "busy"),
        ("http:h", whole, ConnectionResetError(), "client_gone"),
        ("json:1", AudioStream("k2"), None, "client_gone"),  # left before the end
        ("http:h", whole, asyncio.CancelledError(), "client_gone"),
    ):
        m.stream_closed(SpeakRequest(text="hi", origin=origin), stream, error)
        labels = {"frontend": frontend_of(origin), "kind": "stream", "outcome": outcome}
        assert value(m, "speakd_requests_total", **labels), (origin, outcome)


async def test_first_audio_of_a_stream_is_its_first_chunk() -> None:
    from speakd.audio import AudioChunk

    m = make()
    stream = AudioStream("k")
    m.stream_opened(SpeakRequest(text="hi", origin="http:h"), stream)
    (watcher,) = asyncio.all_tasks() - {asyncio.current_task()}
    await asyncio.sleep(0)  # one turn of the loop: the watcher now waits for a chunk
    assert not watcher.done()
    assert not value(m, "speakd_first_audio_seconds_count", kind="stream")
    stream.put(AudioChunk(b"\0\0" * 100, 16000))
    await asyncio.wait_for(watcher, 5)  # it ends once it has seen the first chunk
    assert value(m, "speakd_first_audio_seconds_count", kind="stream") == 1


def test_rtf_and_the_figures_read_at_scrape_time() -> None:
    m = make()
    m.synthesis(0.5, 2.0)
    m.synthesis(1.0, 0.0)  # no audio: no real-time factor
    assert value(m, "speakd_synthesis_rtf_count") == 1
    assert value(m, "speakd_synthesis_rtf_sum") == 0.25
    assert value(m, "speakd_queue_length") == 2
    assert value(m, "speakd_cache_hits_total") == 7
    assert value(m, "speakd_cache_misses_total") == 3
    assert value(m, "speakd_cache_bytes") == 1000
    assert value(m, "speakd_breaker_state", state="open") == 1
    assert value(m, "speakd_breaker_state", state="closed") == 0
    assert value(m, "speakd_audio_available") == 0
    piper = {"voice": "en_US-joe-medium", "engine": "vits"}
    assert value(m, "speakd_voice_loaded", **piper) == 1
    assert value(m, "speakd_voice_resident_bytes", **piper) == 123
    assert value(m, "speakd_voice_load_seconds", **piper) == 0.5
    assert value(m, "speakd_voice_loaded", voice="chattts", engine="chattts") == 0
    assert b"# TYPE speakd_queue_length gauge" in m.exposition()


def test_the_parts_of_a_synthesis_up_to_its_first_chunk() -> None:
    from speakd.engines.spans import Spans

    m = make()
    m.synthesis(1.0, 2.0, Spans(parts={"prior": 0.5}))  # no chunk: no first-chunk figures
    assert not value(m, "speakd_synthesis_part_seconds_count", part="first_chunk")
    m.synthesis(
        1.0, 2.0, Spans(parts={"prior": 0.5, "decoder": 0.9}, first={"prior": 0.5}, first_s=0.75)
    )
    assert value(m, "speakd_synthesis_part_seconds_sum", part="prior") == 0.5
    assert not value(m, "speakd_synthesis_part_seconds_count", part="decoder")
    assert value(m, "speakd_synthesis_part_seconds_sum", part="first_chunk") == 0.75
