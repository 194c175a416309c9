"""The request path: prepare once (one key for one meaning), one audio stream for many readers."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from speakd.audio import join_chunks
from speakd.engines.base import SynthesisConfig, VoiceInfo
from speakd.engines.chattts.engine import ChatTTSEngine
from speakd.request.messages import RequestError, SpeakRequest
from speakd.request.prepare import bcp47, prepare, select_voice
from speakd.request.resolver import Resolver
from speakd.request.stream import AudioStream, Cancel
from tests.tone_engine import ToneEngine
from tests.waits import wait_until


@pytest.fixture(scope="module")
def chattts(tiny_bundle: Path) -> ChatTTSEngine:
    return ChatTTSEngine.load(tiny_bundle, threads=1)


def test_lang_is_part_of_the_key_and_of_the_audio(chattts: ChatTTSEngine) -> None:
    """The same text read as Chinese and as English is two clips, never one served for both."""
    text = "3, 2, 1!"
    options = {"max_new_token": 24, "min_new_token": 24}
    zh = prepare(chattts, text, SynthesisConfig(lang="zh", extra=options))
    en = prepare(chattts, text, SynthesisConfig(lang="en", extra=options))
    assert (zh.normalized, en.normalized) == ("三，二，一。", "three, two, one.")
    assert zh.key != en.key
    assert zh.params["lang"] == "zh" and en.params["lang"] == "en"
    pcm = {}
    for p in (zh, en):
        request = SpeakRequest(text=text, config=p.config, prepared=p)
        pcm[p.key] = join_chunks(Resolver(chattts).stream(request, Cancel())).pcm
    assert pcm[zh.key] != pcm[en.key]
    # equal requests → one key; the language as a region code (en_US) means the same
    assert prepare(chattts, text, SynthesisConfig(lang="en_US", extra=options)).key == en.key
    assert prepare(chattts, " " + text, SynthesisConfig(lang="en", extra=options)).key == en.key


def test_engine_options_are_validated_against_the_declarations(chattts: ChatTTSEngine) -> None:
    ok = prepare(chattts, "hi", SynthesisConfig(extra={"greedy": True, "speed_level": 3}))
    assert ok.params["speed_level"] == 3 and ok.params["greedy"] is True
    bad = [
        ({"temperature": 9.0}, "temperature must be within"),
        ({"top_k": 2.5}, "top_k must be an integer"),
        ({"greedy": 1}, "greedy must be true or false"),
        ({"noise_w": 0.5}, "unknown param 'noise_w'"),  # a VITS option, not ChatTTS's
    ]
    for extra, message in bad:
        with pytest.raises(RequestError, match=message) as e:
            prepare(chattts, "hi", SynthesisConfig(extra=extra))
        assert e.value.code == "bad_field"
    with pytest.raises(RequestError) as e:
        prepare(chattts, "hi", SynthesisConfig(lang="de"))
    assert e.value.code == "unknown_language"
    with pytest.raises(RequestError) as e:  # the engine's own limit, found before any work
        prepare(chattts, "a" * 2001, SynthesisConfig())
    assert e.value.code == "text_too_long"


def test_voice_by_language_is_one_rule() -> None:
    voices = [VoiceInfo("low", "en_US"), VoiceInfo("high", "de_DE"), VoiceInfo("both", "zh,en")]
    pick = lambda voice, lang, strict=True: select_voice(voices, "low", voice, lang, strict=strict)  # noqa: E731
    assert pick(None, None) == (None, None)
    assert pick(None, "en-GB") == (None, "en_US")  # the default speaks it: stays the default
    assert pick(None, "de") == ("high", "de_DE")
    assert pick(None, "zh") == ("both", "zh")
    assert pick("both", "en") == ("both", "en")
    assert pick(None, "fr", strict=False) == (None, None)  # SSIP: speechd's fallback
    refused = [
        ("nobody", None, "unknown_voice"),
        ("high", "en", "unknown_language"),
        (None, "fr", "unknown_language"),
    ]
    for voice, lang, code in refused:
        with pytest.raises(RequestError) as e:
            pick(voice, lang)
        assert e.value.code == code


def test_one_synthesis_many_readers_and_the_last_one_out_cancels() -> None:
    engine = ToneEngine(compute_s=0.02)
    resolver = Resolver(engine)
    request = SpeakRequest("one two three four five six seven eight")
    first = resolver.open(request)
    second = resolver.open(SpeakRequest("one two three four five six seven eight"))
    assert second is first and first.readers == 2
    got: dict[str, bytes] = {}

    def read(name: str, stream: AudioStream) -> None:
        got[name] = b"".join(c.pcm for c in stream.read(Cancel()))
        stream.release()

    threads = [threading.Thread(target=read, args=(n, first)) for n in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert got["a"] == got["b"] and len(got["a"]) == 8 * 3200
    assert engine.calls == ["one two three four five six seven eight"]  # synthesised once
    # a stream whose every reader leaves early stops its synthesis
    slow = ToneEngine(compute_s=0.05)
    stream = Resolver(slow).open(SpeakRequest(" ".join(["w"] * 100)))
    next(stream.read(Cancel()))
    stream.release()
    wait_until(lambda: stream.done, "the orphaned synthesis to stop", timeout=5)
    assert stream.cancel.is_set() and len(stream.chunks) < 20


class HookedCancel(Cancel):
    """Says when a reader has hooked itself on: it blocks on the stream right after."""

    def __init__(self) -> None:
        super().__init__()
        self.hooked = threading.Event()

    def add_hook(self, hook: Callable[[], None]) -> None:
        super().add_hook(hook)
        self.hooked.set()


async def test_async_reader_is_woken_by_the_producer_and_a_cancel_wakes_a_thread() -> None:
    stream = AudioStream("k")
    chunk = ToneEngine().synthesize("x", SynthesisConfig()).__next__()

    taken = asyncio.Event()

    async def produce() -> None:
        # each put comes from another thread while the reader waits: it only yields the loop
        # (to this task) once it has taken the last chunk and is waiting for the next
        for _ in range(3):
            await asyncio.to_thread(stream.put, chunk)
            await taken.wait()
            taken.clear()
        await asyncio.to_thread(stream.finish)

    producer = asyncio.create_task(produce())
    seen = []
    async for c in stream.aread():
        seen.append(c)
        taken.set()
    await producer
    assert seen == [chunk] * 3
    # a blocked thread reader returns at once when its Cancel is set (no polling interval)
    idle, cancel, out = AudioStream("idle"), HookedCancel(), []
    reader = threading.Thread(target=lambda: out.extend(idle.read(cancel)))
    reader.start()
    assert await asyncio.to_thread(cancel.hooked.wait, 5)  # the reader is about to block
    t0 = time.monotonic()
    cancel.set()
    await asyncio.to_thread(reader.join, 5)
    assert not reader.is_alive() and out == [] and time.monotonic() - t0 < 0.1


def test_streamed_and_played_audio_are_the_same_bytes(chattts: ChatTTSEngine) -> None:
    """``speakd synth``'s path and the resolver give identical audio for one prepared request."""
    config = SynthesisConfig(extra={"max_new_token": 16, "min_new_token": 16})
    p = prepare(chattts, "door open", config)
    via_resolver = join_chunks(
        Resolver(chattts).stream(SpeakRequest("door open", config=config), Cancel())
    )
    direct = join_chunks(chattts.synthesize(p.text, p.config))
    assert via_resolver.pcm == direct.pcm
    assert np.abs(via_resolver.samples()).max() > 0


async def test_a_play_and_a_fetch_of_one_request_share_one_synthesis(tmp_path: Path) -> None:
    """The board plays a request while a caller (socket synth, Wyoming, HTTP) fetches the same
    one: one synthesis, both get every chunk; the fetch never enters the playback queue."""
    from speakd.audio.sinks import WavSink
    from speakd.control import Control
    from speakd.request.scheduler import Scheduler
    from tests.test_scheduler import Recorder, settle

    engine = ToneEngine(compute_s=0.03)
    scheduler = Scheduler(Resolver(engine), WavSink(tmp_path))
    control = Control(scheduler, max_text_chars=500, max_streams=1, stream_wait_s=0.05)
    task = asyncio.create_task(scheduler.run())
    rec = Recorder()
    text = "shared words for the board and the caller"
    control.say(control.build_request({"text": text, "id": "play"}, origin="test", on_event=rec))
    async with control.stream(control.build_request({"text": text}, origin="test")) as stream:
        with pytest.raises(RequestError) as busy:  # limits.max_streams, after stream_wait_s
            async with control.stream(control.build_request({"text": "x"}, origin="test")):
                pass
        fetched = b"".join([c.pcm async for c in stream.aread()])
    await settle(rec, "play")
    task.cancel()
    assert busy.value.code == "busy"
    assert engine.calls == [text]
    assert fetched == (tmp_path / "play.wav").read_bytes()[44:]
    assert scheduler.status()["counters"]["accepted"] == 1


@pytest.mark.parametrize(
    ("code", "listed"),
    [("en_US", "en-US"), ("zh", "zh"), ("sr_latn_rs", "sr-Latn-RS"), ("es-419", "es-419")],
)
def test_languages_are_listed_in_bcp47(code: str, listed: str) -> None:
    assert bcp47(code) == listed


def test_either_spelling_of_a_language_gives_the_same_key() -> None:
    engine = ToneEngine()  # its voices list "en"
    langs = ("en", "en-US", "en_US")
    keys = {prepare(engine, "x", SynthesisConfig(lang=lang)).key for lang in langs}
    assert len(keys) == 1


def test_a_synthesized_clip_is_in_the_cache_when_its_stream_ends(tmp_path: Path) -> None:
    """A repeat sent the moment the first one's audio ends is a hit, not a second synthesis:
    the clip is stored before readers hear the end (here the store takes 0.3 s)."""
    from speakd.cache.store import CacheStore

    class SlowStore(CacheStore):
        def put(self, clip):  # type: ignore[no-untyped-def]
            time.sleep(0.3)
            return super().put(clip)

    engine = ToneEngine(compute_s=0.0)
    with SlowStore(tmp_path / "cache.db") as store:
        resolver = Resolver(engine, store)
        stream = resolver.open(SpeakRequest("one two three"))
        assert b"".join(c.pcm for c in stream.read(Cancel()))
        stream.release()
        assert store.get(stream.key) is not None
        again = resolver.open(SpeakRequest("one two three"))
        assert b"".join(c.pcm for c in again.read(Cancel()))
        again.release()
        assert engine.calls == ["one two three"]  # synthesized once
