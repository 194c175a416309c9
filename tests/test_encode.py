"""The HTTP API's encoders: every format streamed chunk by chunk decodes to the audio it was
given (checked by FFmpeg through PyAV, an outside decoder), and whole clips get exact headers."""

from __future__ import annotations

import io
import wave

import numpy as np
import pytest

from speakd.audio import AudioChunk
from speakd.encode import FORMATS, EncodedClips, FormatError, check_format, encode_whole, encoder

RATE = 22050


def chunks() -> list[AudioChunk]:
    t = np.arange(RATE * 2) / RATE
    tone = (np.sin(2 * np.pi * 440 * t) * 8000).astype("<i2")
    return [AudioChunk(tone[i : i + 7000].tobytes(), RATE) for i in range(0, len(tone), 7000)]


def decode(data: bytes) -> tuple[int, float]:
    av = pytest.importorskip("av")
    with av.open(io.BytesIO(data)) as container:
        frames = list(container.decode(audio=0))
    return frames[0].sample_rate, sum(f.samples for f in frames) / frames[0].sample_rate


@pytest.mark.parametrize("fmt", ["mp3", "opus", "flac", "wav"])
def test_streamed_and_whole_decode_to_the_same_length(fmt: str) -> None:
    enc = encoder(fmt)
    streamed = b"".join(enc.feed(c) for c in chunks()) + enc.finish()
    whole = encode_whole(fmt, chunks())
    for data in (streamed, whole):
        rate, seconds = decode(data)
        assert rate == (48000 if fmt == "opus" else RATE)
        assert abs(seconds - 2.0) < 0.1  # MP3's encoder delay stays in a streamed file
    if fmt == "flac":  # lossless: streamed (no sample count in its header) or whole, same audio
        assert streamed[-100:] == whole[-100:]


def test_wav_stream_says_unknown_sizes_and_whole_says_exact_ones() -> None:
    enc = encoder("wav")
    streamed = b"".join(enc.feed(c) for c in chunks()) + enc.finish()
    assert streamed[4:8] == streamed[40:44] == b"\xff\xff\xff\xff"
    with wave.open(io.BytesIO(encode_whole("wav", chunks()))) as w:
        assert (w.getframerate(), w.getnframes()) == (RATE, RATE * 2)
    assert streamed[44:] == b"".join(c.pcm for c in chunks())


def test_pcm_is_resampled_to_24khz() -> None:
    enc = encoder("pcm")
    pcm = b"".join(enc.feed(c) for c in chunks()) + enc.finish()
    assert len(pcm) == 2 * 24000 * 2  # two seconds of 16-bit samples at 24 kHz
    whole = np.frombuffer(encode_whole("pcm", chunks()), "<i2").astype(int)
    assert np.abs(whole - np.frombuffer(pcm, "<i2")).max() <= 2  # rounding, chunk edges


def test_unsupported_formats_name_the_supported_ones() -> None:
    with pytest.raises(FormatError, match="supported: mp3, opus, flac, wav, pcm"):
        check_format("aac")
    assert set(FORMATS) == {"mp3", "opus", "flac", "wav", "pcm"}


def test_encoded_clips_keep_the_recently_used_within_the_budget() -> None:
    clips = EncodedClips(max_bytes=10)
    clips.put("a", "mp3", b"12345")
    clips.put("b", "mp3", b"12345")
    assert clips.get("a", "mp3") == b"12345"  # now the most recent
    clips.put("c", "opus", b"123")  # over budget: "b", the least recent, goes
    assert clips.get("b", "mp3") is None
    assert clips.get("a", "mp3") == b"12345" and clips.get("c", "opus") == b"123"
    assert clips.get("a", "flac") is None
    clips.put("huge", "mp3", b"x" * 11)  # larger than the budget: never kept
    assert clips.get("huge", "mp3") is None and clips.get("a", "mp3") is not None
