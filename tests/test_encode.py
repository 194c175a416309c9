"""The HTTP API's encoders: every format streamed chunk by chunk decodes to the audio it was
given, to its full length, by libsndfile (``soundfile``) and by FFmpeg (PyAV) — two outside
decoders — and whole clips get exact headers."""

from __future__ import annotations

import io
import wave

import numpy as np
import pytest
import soundfile

from speakd.audio import AudioChunk
from speakd.audio.encode import (
    ENCODER_DELAY,
    FORMATS,
    EncodedClips,
    FormatError,
    check_format,
    encode_whole,
    encoder,
    mp3_frame_bytes,
)

RATE = 22050
SECONDS = 8.37  # the clip whose streamed MP3 libsndfile read as 1.48 s


def chunks(rate: int = RATE, seconds: float = 2.0) -> list[AudioChunk]:
    t = np.arange(int(rate * seconds)) / rate
    tone = (np.sin(2 * np.pi * 440 * t) * 8000).astype("<i2")
    return [AudioChunk(tone[i : i + 7000].tobytes(), rate) for i in range(0, len(tone), 7000)]


def streamed(fmt: str, audio: list[AudioChunk]) -> bytes:
    enc = encoder(fmt)
    return b"".join(enc.feed(c) for c in audio) + enc.finish()


def decode(data: bytes) -> tuple[int, float]:
    av = pytest.importorskip("av")
    with av.open(io.BytesIO(data)) as container:
        frames = list(container.decode(audio=0))
    return frames[0].sample_rate, sum(f.samples for f in frames) / frames[0].sample_rate


def sf_read(data: bytes) -> tuple[np.ndarray, int]:
    """libsndfile's decode, as ``soundfile.read`` gives it (it trusts the header's length)."""
    samples, rate = soundfile.read(io.BytesIO(data), dtype="int16")
    return samples, rate


@pytest.mark.parametrize("fmt", ["mp3", "opus", "wav"])
def test_streamed_and_whole_decode_to_the_full_length(fmt: str) -> None:
    audio = chunks(seconds=SECONDS)
    for data in (streamed(fmt, audio), encode_whole(fmt, audio)):
        samples, sf_rate = sf_read(data)
        for rate, seconds in (decode(data), (sf_rate, len(samples) / sf_rate)):
            assert rate == (48000 if fmt == "opus" else RATE)
            # a streamed MP3 keeps LAME's encoder delay and padding: under 0.15 s
            assert SECONDS - 0.001 < seconds < SECONDS + 0.15


@pytest.mark.parametrize("rate", [22050, 24000, 48000])  # Piper, ChatTTS, MPEG-1's frames
def test_streamed_mp3_is_the_whole_one_delayed_by_lame_within_two_frames(rate: int) -> None:
    """Without the Info tag (written at close) a decoder cannot trim LAME's delay and padding:
    the hit's audio is all there, ENCODER_DELAY samples late, padded by less than two frames."""
    audio = chunks(rate, SECONDS)
    frame = 1152 if rate >= 32000 else 576  # samples per Layer III frame
    whole, _ = sf_read(encode_whole("mp3", audio))
    miss, _ = sf_read(streamed("mp3", audio))
    assert len(whole) == int(rate * SECONDS)  # the Info tag trims it exactly
    assert 0 <= len(miss) - ENCODER_DELAY - len(whole) < 2 * frame
    same = miss[ENCODER_DELAY : ENCODER_DELAY + len(whole)].astype(int) - whole
    assert np.abs(same).max() <= 1  # the same frames, decoded (one step of rounding)


def test_streamed_mp3_is_cbr_from_its_first_byte_to_its_last() -> None:
    """No empty placeholder frame: the stream is whole Layer III frames of one bitrate."""
    data = streamed("mp3", chunks(seconds=SECONDS))
    offset, bitrates, frames = 0, set(), 0
    while offset < len(data):
        header = data[offset : offset + 4]
        bitrates.add(header[2] >> 4)
        offset += mp3_frame_bytes(header)
        frames += 1
    assert offset == len(data) and len(bitrates) == 1
    assert any(data[4 : mp3_frame_bytes(data[:4])])  # the first frame carries audio
    assert frames * 576 == len(sf_read(data)[0])


def test_flac_is_encoded_whole_only() -> None:
    """STREAMINFO needs the sample count: libsndfile cannot read a FLAC that says "unknown"."""
    with pytest.raises(FormatError, match="whole"):
        encoder("flac")
    audio = chunks()
    samples, rate = sf_read(encode_whole("flac", audio))
    assert rate == RATE and np.array_equal(samples, np.concatenate([c.samples() for c in audio]))


def test_wav_stream_says_unknown_sizes_and_whole_says_exact_ones() -> None:
    data = streamed("wav", chunks())
    assert data[4:8] == data[40:44] == b"\xff\xff\xff\xff"
    with wave.open(io.BytesIO(encode_whole("wav", chunks()))) as w:
        assert (w.getframerate(), w.getnframes()) == (RATE, RATE * 2)
    assert data[44:] == b"".join(c.pcm for c in chunks())


def test_pcm_is_resampled_to_24khz() -> None:
    pcm = streamed("pcm", chunks())
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
