"""Word timings of the embedded Piper voice, from real onnxruntime sessions: the engine's words
in order and covering the audio, espeak's expansions mapped back to the text's words, and the
same timings through a real ``speakd serve`` on the JSON socket (``synth`` and a waiting
``say``), from a cache hit as from the synthesis."""

from __future__ import annotations

import base64
import dataclasses
import io
import itertools
import json
import socket
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from speakd.audio import AudioChunk, Word, join_chunks
from speakd.engines.base import SynthesisConfig
from speakd.engines.vits.engine import VitsEngine
from speakd.engines.vits.text import phonemize
from speakd.engines.vits.words import WordAligner
from tests.daemon_proc import DaemonProc
from tests.http_daemon import HttpDaemon, free_port, start_http_daemon
from tests.tone_engine import ToneEngine

RATE = 22050  # the embedded voice's
SENTENCE = "Turn the kitchen lights off before you leave the house."
TWO = "The door is open. Close it now, please."


@pytest.fixture(scope="module")
def engine() -> VitsEngine:
    return VitsEngine.embedded(threads=2)


def words_of(engine: VitsEngine, text: str, **config: Any) -> tuple[list[Word], int]:
    """Every word with its offset from the audio's start, and the audio's length in samples."""
    audio = join_chunks(engine.synthesize(text, SynthesisConfig(seed=1, **config)))
    assert audio is not None
    return list(audio.words), audio.frames


def sounding(text: str, engine: VitsEngine) -> tuple[int, int]:
    """The first and last sample where the audio's 10 ms energy is above 5 % of its peak."""
    audio = join_chunks(engine.synthesize(text, SynthesisConfig(seed=1)))
    assert audio is not None
    x = audio.samples().astype(np.float64)
    energy = np.sqrt(np.convolve(x**2, np.ones(220) / 220, "same"))
    loud = np.flatnonzero(energy > 0.05 * energy.max())
    return int(loud[0]), int(loud[-1])


def spans(engine: VitsEngine, text: str) -> list[list[str]]:
    sentences = phonemize(engine.config.espeak_voice, text, engine.config.vowel_clusters)
    aligner = WordAligner(text, engine._alone)
    return [[s.text for s in aligner.spans(sentence)] for sentence in sentences]


def test_a_sentence_has_one_timing_per_word_in_order_covering_its_audio(
    engine: VitsEngine,
) -> None:
    words, frames = words_of(engine, SENTENCE)
    assert [w.text for w in words] == SENTENCE.rstrip(".").split()
    assert all(w.start < w.end for w in words)
    assert all(a.end <= b.start for a, b in itertools.pairwise(words))
    onset, offset = sounding(SENTENCE, engine)
    assert abs(words[0].start - onset) < 0.06 * RATE  # the first word starts with the sound
    assert offset - 0.1 * RATE < words[-1].end <= frames  # the last ends with it
    gaps = sum(b.start - a.end for a, b in itertools.pairwise(words))
    assert gaps < 0.25 * frames  # between words: short pauses, not whole words missed


def test_speed_and_sentence_silence_move_the_words_with_the_audio(engine: VitsEngine) -> None:
    words, frames = words_of(engine, TWO)
    assert [w.text for w in words] == ["The", "door", "is", "open", "Close", "it", "now", "please"]
    slow, slow_frames = words_of(engine, TWO, speed=0.5)
    assert slow_frames > 1.5 * frames  # the words stay where they are in the slower audio
    for w, v in zip(words, slow, strict=True):
        assert abs(w.start / frames - v.start / slow_frames) < 0.05
    gap, gap_frames = words_of(engine, TWO, extra={"sentence_silence": 0.5})
    assert gap_frames == frames + RATE // 2
    assert [w.start for w in gap[:4]] == [w.start for w in words[:4]]
    assert [w.start - RATE // 2 for w in gap[4:]] == [w.start for w in words[4:]]


def test_the_words_in_a_chunk_start_in_it(engine: VitsEngine) -> None:
    chunks = list(engine.synthesize(" ".join([SENTENCE] * 3), SynthesisConfig(seed=1)))
    assert len(chunks) > 3  # windows
    assert sum(len(c.words) for c in chunks) == 30
    for c in chunks:
        assert all(0 <= w.start < c.frames for w in c.words)


def test_espeaks_expansions_map_back_to_the_texts_words(engine: VitsEngine) -> None:
    # numbers, a symbol, an abbreviation that ends espeak's sentence, a word said otherwise alone
    assert spans(engine, "Dr. Smith paid $20 at 5:30 on the dot, it's a deal.") == [
        ["Dr"],
        ["Smith", "paid", "$20", "at", "5:30", "on the", "dot", "it's", "a", "deal"],
    ]
    # raw phonemes ([[ … ]], from SSML's <phoneme> or a lexicon) are their own words
    assert spans(engine, "Say [[ tə.ˈmɑː.toʊ ]] again.") == [["Say", "tə.ˈmɑː.toʊ", "again"]]


# -- the daemon ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory):
    wyoming = f'[wyoming]\nuri = "tcp://127.0.0.1:{free_port()}"\n'
    d = start_http_daemon(tmp_path_factory.mktemp("words"), wyoming)
    yield d
    assert d.stop() == 0, d.proc.log_text()


@pytest.fixture
def daemon(served: HttpDaemon) -> DaemonProc:
    return served.proc


def synth(d: DaemonProc, **fields: Any) -> tuple[bytes, list[dict[str, Any]]]:
    """A socket ``synth``: its PCM and every event (audio events without their data)."""
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(60)
        s.connect(d.socket)
        s.sendall(json.dumps({"op": "synth", "id": "s", **fields}).encode() + b"\n")
        pcm, events = b"", []
        for line in s.makefile("rb"):
            event = json.loads(line)
            if event["event"] == "audio":
                data = base64.b64decode(event.pop("data"))
                pcm, event["samples"] = pcm + data, len(data) // 2
            events.append(event)
            if event["event"] in ("finished", "error"):
                break
    return pcm, events


def as_events(words: list[Word], request_id: str) -> list[dict[str, Any]]:
    return [{"event": "word", "id": request_id, **w.event(0, RATE)} for w in words]


def test_socket_synth_sends_each_word_ahead_of_its_audio_and_a_hit_the_same(
    daemon: DaemonProc, engine: VitsEngine
) -> None:
    pcm, events = synth(daemon, text=SENTENCE, seed=1, words=True)
    words = [e for e in events if e["event"] == "word"]
    assert words == as_events(words_of(engine, SENTENCE)[0], "s")
    assert events[-1]["cached"] is False
    sent = 0  # samples of audio sent before each event
    for e in events:
        if e["event"] == "word":  # ahead of the audio it starts in, in the window that has it
            assert sent <= e["start"] < sent + 256 * 256
        elif e["event"] == "audio":
            sent += e.get("samples", 0)
    again, hit = synth(daemon, text=SENTENCE, seed=1, words=True)
    assert again == pcm and hit[-1]["cached"] is True
    assert [e for e in hit if e["event"] == "word"] == words
    _, plain = synth(daemon, text=SENTENCE, seed=1)
    assert not [e for e in plain if e["event"] == "word"]  # only when asked


def test_a_waiting_say_hears_each_word_as_playback_reaches_it(daemon: DaemonProc) -> None:
    _, synthed = synth(daemon, text=TWO, words=True)
    events = daemon.say(TWO, id="w", words=True)
    kinds = [e["event"] for e in events]
    assert kinds == ["queued", "started", *["word"] * 8, "finished"], events
    said = [{k: v for k, v in e.items() if k != "id"} for e in events if e["event"] == "word"]
    assert said == [
        {k: v for k, v in e.items() if k != "id"} for e in synthed if e["event"] == "word"
    ]
    assert Path(daemon.config.parent / "wav" / "w.wav").exists()


def timings(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in e.items() if k not in ("event", "id")} for e in events]


async def test_wyoming_sends_speakd_word_events_ahead_of_their_audio(daemon: DaemonProc) -> None:
    from wyoming.client import AsyncTcpClient
    from wyoming.tts import Synthesize

    from speakd.config import load_config

    port = int(load_config(daemon.config).wyoming.uri.rsplit(":", 1)[1])
    text = "Wyoming words: the washing machine has finished."
    pcm, events = synth(daemon, text=text, words=True)
    async with AsyncTcpClient("127.0.0.1", port, read_timeout=60) as client:
        await client.write_event(Synthesize(text).event())
        heard, sent = [], 0
        while (event := await client.read_event()) is not None and event.type != "audio-stop":
            if event.type == "speakd-word":
                assert sent <= event.data["start"] < sent + 256 * 256  # ahead of its audio
                heard.append(event.data)
            elif event.type == "audio-chunk":
                sent += len(event.payload or b"") // 2
    assert sent == len(pcm) // 2
    assert heard == timings([e for e in events if e["event"] == "word"])
    assert [w["word"] for w in heard] == ["Wyoming", "words", *text.split()[2:-1], "finished"]


def speech_lines(served: HttpDaemon, **body: Any) -> tuple[bytes, list[dict[str, Any]]]:
    """``/v1/audio/speech`` with ``timestamps``: the audio's bytes and the other lines."""
    import httpx

    answer = httpx.post(
        f"{served.url}/v1/audio/speech",
        json={"model": "tts-1", "voice": "alloy", "timestamps": True, **body},
        headers=served.auth,
        timeout=60,
    )
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"] == "application/x-ndjson"
    lines = [json.loads(line) for line in answer.text.splitlines()]
    audio = b"".join(base64.b64decode(e.pop("data")) for e in lines if e["event"] == "audio")
    return audio, [e for e in lines if e["event"] != "audio"]


@pytest.mark.parametrize("fmt", ["wav", "flac"])
def test_http_speech_with_timestamps_is_json_lines_of_audio_and_words(
    served: HttpDaemon, fmt: str
) -> None:
    import soundfile

    text = f"The {fmt} answer carries its words."
    audio, lines = speech_lines(served, input=text, response_format=fmt, seed=7)
    assert lines[-1]["event"] == "finished" and lines[-1]["cached"] is False
    pcm, events = synth(served.proc, text=text, seed=7, words=True)  # a hit now
    assert events[-1]["cached"] is True
    assert timings(lines[:-1]) == timings([e for e in events if e["event"] == "word"])
    assert [w["word"] for w in lines[:-1]] == text.rstrip(".").split()
    decoded, rate = soundfile.read(io.BytesIO(audio), dtype="int16")
    assert rate == RATE and decoded.tobytes() == pcm
    again, hit = speech_lines(served, input=text, response_format=fmt, seed=7)
    assert hit[-1]["cached"] is True and timings(hit[:-1]) == timings(lines[:-1])
    assert soundfile.read(io.BytesIO(again), dtype="int16")[0].tobytes() == pcm


def test_http_timestamps_must_be_a_boolean(served: HttpDaemon) -> None:
    import httpx

    answer = httpx.post(
        f"{served.url}/v1/audio/speech",
        json={"model": "tts-1", "voice": "alloy", "input": "Hi", "timestamps": "yes"},
        headers=served.auth,
        timeout=60,
    )
    assert answer.status_code == 400 and answer.json()["error"]["code"] == "bad_field"


# -- ChatTTS: sentence timings ------------------------------------------------------------------


def test_chattts_times_each_sentence_on_an_empty_chunk_after_it(tiny_bundle: Path) -> None:
    from speakd.engines.chattts.engine import ChatTTSEngine

    engine = ChatTTSEngine.load(tiny_bundle, threads=1)
    chunks = list(engine.synthesize("你好。我们走吧。", SynthesisConfig(seed=2)))
    ends = [i for i, c in enumerate(chunks) if c.words]
    assert len(ends) == 2 and ends[-1] == len(chunks) - 1
    assert all(chunks[i].pcm == b"" for i in ends)  # after the sentence's audio, not in it
    audio = join_chunks(chunks)
    assert audio is not None
    first, second = audio.words
    assert [w.kind for w in audio.words] == ["sentence", "sentence"]
    assert first.start == 0 and first.end == second.start > 0 and second.end == audio.frames
    assert first.event(0, 24000)["sentence"] == first.text != second.text


class TimedTone(ToneEngine):
    """The tone engine with a timing per word, and its sentence's after it, as ChatTTS times it."""

    def synthesize(self, text: str, config: SynthesisConfig, cancel: Any = None) -> Any:
        total = 0
        for chunk, word in zip(
            super().synthesize(text, config, cancel), text.split(), strict=False
        ):
            yield dataclasses.replace(chunk, words=(Word(word, 0, chunk.frames),))
            total += chunk.frames
        yield AudioChunk(b"", self.sample_rate, words=(Word(text, -total, 0, "sentence"),))


async def test_playback_reports_words_and_a_sentence_after_its_audio(tmp_path: Path) -> None:
    import asyncio

    from speakd.request.messages import SpeakRequest
    from speakd.request.resolver import Resolver
    from speakd.request.scheduler import Scheduler
    from tests.test_scheduler import Recorder, settle
    from tests.waits import HeldSink

    engine = TimedTone()
    sched = Scheduler(Resolver(engine), HeldSink(tmp_path))
    task = asyncio.create_task(sched.run())
    rec = Recorder()
    for rid, words in (("timed", True), ("plain", False)):
        sched.submit(SpeakRequest(text="one two three", id=rid, words=words, on_event=rec))
        await settle(rec, rid)
    n = int(engine.sample_rate * engine.word_s)
    assert rec.of("plain") == ["queued", "started", "finished"]
    assert rec.of("timed") == ["queued", "started", "word", "word", "word", "sentence", "finished"]
    timed = [e.data for e in rec.events if e.request_id == "timed"][2:-1]
    assert [(e.get("word"), e["start"], e["end"]) for e in timed[:3]] == [
        ("one", 0, n),
        ("two", n, 2 * n),
        ("three", 2 * n, 3 * n),
    ]
    assert timed[3] == {
        "sentence": "one two three",
        "start": 0,
        "end": 3 * n,
        "start_s": 0.0,
        "end_s": round(3 * n / engine.sample_rate, 3),
    }
    task.cancel()


def test_ssml_parts_bring_their_words_and_a_break_moves_the_later_ones(
    daemon: DaemonProc,
) -> None:
    door, door_events = synth(daemon, text="Door", words=True)
    _, open_events = synth(daemon, text="open", words=True)
    _, events = synth(daemon, text='<speak>Door <break time="700ms"/> open</speak>', words=True)
    gap = 700 * RATE // 1000
    (d,) = timings([e for e in door_events if e["event"] == "word"])
    (o,) = timings([e for e in open_events if e["event"] == "word"])
    later = len(door) // 2 + gap
    moved = {**o, "start": o["start"] + later, "end": o["end"] + later}
    moved.update(start_s=round(moved["start"] / RATE, 3), end_s=round(moved["end"] / RATE, 3))
    assert timings([e for e in events if e["event"] == "word"]) == [d, moved]
