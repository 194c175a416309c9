"""Audio as HTTP callers ask for it: WAV, raw PCM, FLAC, Ogg/Opus or MP3, encoded as it streams.

speakd's audio is mono int16 PCM at the engine's rate (``speakd.audio``). The OpenAI speech API
(docs/http.md) names the formats; the compressed ones come from libsndfile through ``soundfile``,
whose wheels carry libsndfile 1.2 with FLAC, Ogg Opus and MP3 (LAME) built in.

Streaming: an encoder takes chunks as synthesis makes them and returns the bytes that are final.
libsndfile writes forward except at close, when it seeks back to patch a header; those bytes have
gone to the client already, so the patch is dropped. What each format does about its length:

- WAV declares unknown sizes (0xFFFFFFFF, as OpenAI's API does); decoders read to the end.
- Ogg Opus carries its position in every page: nothing to patch.
- MP3 is constant-bitrate, so a decoder measures its length from its size. LAME opens a file with
  a silent frame that it fills with the Info tag (frame count, encoder delay) at close; a stream
  cannot fill it, and left empty it made libsndfile misjudge the length (10.1 s of a 12.9 s VBR
  stream), so a stream starts at the first audio frame instead. Without the tag a decoder keeps
  LAME's encoder delay and padding: ENCODER_DELAY samples of silence before the audio, under two
  frames after it.
- FLAC's STREAMINFO holds the total sample count, and libsndfile cannot read a FLAC whose count
  says "unknown", so FLAC is never streamed (``WHOLE_ONLY``): it is encoded once the audio is.

Audio that is whole before the response starts (a cache hit) is encoded in one piece, with exact
headers (MP3's Info tag included, so decoders trim the delay).

Rates: ``pcm`` is 24 kHz as OpenAI documents it (clients play it blind), and Opus takes 48 kHz, so
those two are resampled with soxr when the engine's rate differs; the others keep the engine's.
"""

from __future__ import annotations

import io
import struct
from collections import OrderedDict
from collections.abc import Iterable
from typing import Any, Protocol

import numpy as np
import soundfile
import soxr

from speakd.audio import SAMPLE_WIDTH, AudioChunk, join_chunks, wav_bytes

ENCODED_BYTES = 16 * 1024 * 1024  # the budget of EncodedClips
PCM_RATE = 24000  # OpenAI's ``pcm``: 24 kHz, 16-bit signed little-endian, mono, no header
OPUS_RATE = 48000  # Opus runs at 8/12/16/24/48 kHz only
# libsndfile's CBR scale (0 best): 64 kbit/s at 16-24 kHz (speech engines), 128 at 32-48 kHz
MP3_COMPRESSION = 0.63
ENCODER_DELAY = 1105  # samples of silence LAME puts before the audio (576 + the decoder's 529)
WHOLE_ONLY = ("flac",)  # formats whose header needs the whole clip, so never streamed

# format → (content type, libsndfile format and subtype or None, fixed output rate or None)
FORMATS: dict[str, tuple[str, tuple[str, str] | None, int | None]] = {
    "mp3": ("audio/mpeg", ("MP3", "MPEG_LAYER_III"), None),
    "opus": ("audio/ogg; codecs=opus", ("OGG", "OPUS"), OPUS_RATE),
    "flac": ("audio/flac", ("FLAC", "PCM_16"), None),
    "wav": ("audio/wav", None, None),
    "pcm": ("audio/pcm", None, PCM_RATE),
}


class FormatError(ValueError):
    """A response format speakd does not encode (the message lists those it does)."""


class Encoder(Protocol):
    content_type: str

    def feed(self, chunk: AudioChunk) -> bytes:
        """Encode one chunk; returns the bytes that are final (possibly none yet)."""
        ...

    def finish(self) -> bytes:
        """Flush the encoder; returns the last bytes."""
        ...


def check_format(name: str) -> str:
    if name not in FORMATS:
        raise FormatError(
            f"response_format {name!r} is not supported (supported: {', '.join(FORMATS)})"
        )
    return name


def encoder(name: str) -> Encoder:
    """A streaming encoder for format ``name``; the rate comes with the first chunk."""
    if check_format(name) in WHOLE_ONLY:
        raise FormatError(f"{name} is encoded whole (encode_whole), never streamed")
    return _encoder(name)


def _encoder(name: str) -> Encoder | _SoundFileStream:
    ctype, sndfile, rate = FORMATS[name]
    if name == "wav":
        return _WavStream(ctype)
    if name == "pcm":
        return _Pcm(ctype, rate)
    assert sndfile is not None
    return (_Mp3Stream if name == "mp3" else _SoundFileStream)(ctype, sndfile, rate)


def encode_whole(name: str, chunks: Iterable[AudioChunk]) -> bytes:
    """All of a clip at once, with exact headers (sizes, FLAC's sample count, MP3's Info tag)."""
    audio = join_chunks(chunks)
    if audio is None:
        raise ValueError("no audio to encode")
    if check_format(name) == "wav":
        return wav_bytes(audio)
    enc = _encoder(name)
    if isinstance(enc, _SoundFileStream):
        return enc.whole(audio)
    return enc.feed(audio) + enc.finish()


class EncodedClips:
    """Cached clips already encoded, by (clip key, format), least recently used out past a byte
    budget: a hit asked for in MP3 (OpenAI's default) or Opus is encoded once, not on every
    request (about 10 ms of CPU for a one-second clip on a 2-core VM, docs/benchmarks.md)."""

    def __init__(self, max_bytes: int = ENCODED_BYTES) -> None:
        self.max_bytes = max_bytes
        self._items: OrderedDict[tuple[str, str], bytes] = OrderedDict()
        self._bytes = 0

    def get(self, key: str, fmt: str) -> bytes | None:
        data = self._items.get((key, fmt))
        if data is not None:
            self._items.move_to_end((key, fmt))
        return data

    def put(self, key: str, fmt: str, data: bytes) -> None:
        if len(data) > self.max_bytes or (key, fmt) in self._items:
            return
        self._items[(key, fmt)] = data
        self._bytes += len(data)
        while self._bytes > self.max_bytes:
            _, old = self._items.popitem(last=False)
            self._bytes -= len(old)


class _Resampler:
    """Streaming int16 resampling to a fixed rate (a no-op when the rates already match)."""

    def __init__(self, target: int | None) -> None:
        self.target = target
        self.rate: int | None = None  # the output rate, set by the first chunk
        self._in_rate: int | None = None
        self._stream: Any = None

    def __call__(self, chunk: AudioChunk) -> np.ndarray:
        if self._in_rate is None:
            self._in_rate = chunk.sample_rate
            self.rate = self.target or chunk.sample_rate
            if self.rate != chunk.sample_rate:
                self._stream = soxr.ResampleStream(chunk.sample_rate, self.rate, 1, dtype="int16")
        elif chunk.sample_rate != self._in_rate:
            raise ValueError(
                f"sample rate changed mid-stream: {self._in_rate} → {chunk.sample_rate}"
            )
        samples = chunk.samples()
        return samples if self._stream is None else self._stream.resample_chunk(samples)

    def flush(self) -> np.ndarray:
        if self._stream is None:
            return np.zeros(0, dtype="<i2")
        return self._stream.resample_chunk(np.zeros(0, dtype="<i2"), last=True)


class _Pcm:
    def __init__(self, ctype: str, rate: int | None) -> None:
        self.content_type = ctype
        self._resample = _Resampler(rate)

    def feed(self, chunk: AudioChunk) -> bytes:
        return self._resample(chunk).astype("<i2").tobytes()

    def finish(self) -> bytes:
        return self._resample.flush().astype("<i2").tobytes()


class _WavStream:
    """A WAV header whose RIFF and data sizes say "unknown" (0xFFFFFFFF), then raw PCM."""

    def __init__(self, ctype: str) -> None:
        self.content_type = ctype
        self._rate: int | None = None

    def feed(self, chunk: AudioChunk) -> bytes:
        if self._rate is None:
            self._rate = chunk.sample_rate
            return _wav_header(chunk.sample_rate) + chunk.pcm
        if chunk.sample_rate != self._rate:
            raise ValueError(f"sample rate changed mid-stream: {self._rate} → {chunk.sample_rate}")
        return chunk.pcm

    def finish(self) -> bytes:
        return b""


def _wav_header(rate: int, channels: int = 1) -> bytes:
    unknown = 0xFFFFFFFF
    block = channels * SAMPLE_WIDTH
    return (
        struct.pack("<4sI4s", b"RIFF", unknown, b"WAVE")
        + struct.pack("<4sIHHIIHH", b"fmt ", 16, 1, channels, rate, rate * block, block, 16)
        + struct.pack("<4sI", b"data", unknown)
    )


class _ForwardBuffer:
    """The file libsndfile writes into: bytes past ``sent`` are handed out as they come; a write
    behind it (a header patch at close) is dropped for the part already sent."""

    def __init__(self) -> None:
        self.data = bytearray()  # bytes from offset ``sent`` on
        self.sent = 0
        self.pos = 0

    def write(self, b: Any) -> int:
        b = bytes(b)
        n, offset = len(b), self.pos - self.sent
        if offset < 0:  # a patch of bytes the client has: keep only what is still ours
            b, offset = b[-offset:], 0
        end = offset + len(b)
        if end > len(self.data):
            self.data.extend(bytes(end - len(self.data)))
        self.data[offset:end] = b
        self.pos += n
        return n

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: self.sent + len(self.data)}
        self.pos = base[whence] + offset
        return self.pos

    def tell(self) -> int:
        return self.pos

    def read(self, n: int = -1) -> bytes:  # libsndfile probes; a write-only stream has nothing
        return b""

    def take(self) -> bytes:
        out = bytes(self.data)
        self.sent += len(out)
        self.data.clear()
        return out


class _SoundFileStream:
    def __init__(self, ctype: str, sndfile: tuple[str, str], rate: int | None) -> None:
        self.content_type = ctype
        self._format, self._subtype = sndfile
        self._resample = _Resampler(rate)
        self._buffer = _ForwardBuffer()
        self._file: soundfile.SoundFile | None = None

    def _open(self, target: Any, rate: int) -> soundfile.SoundFile:
        cbr = self._format == "MP3"
        return soundfile.SoundFile(
            target,
            "w",
            samplerate=rate,
            channels=1,
            format=self._format,
            subtype=self._subtype,
            compression_level=MP3_COMPRESSION if cbr else None,
            bitrate_mode="CONSTANT" if cbr else None,
        )

    def feed(self, chunk: AudioChunk) -> bytes:
        samples = self._resample(chunk)
        if self._file is None:
            assert self._resample.rate is not None
            self._file = self._open(self._buffer, self._resample.rate)
        self._file.write(samples)
        return self._buffer.take()

    def finish(self) -> bytes:
        if self._file is None:
            return b""
        self._file.write(self._resample.flush())
        self._file.close()
        return self._buffer.take()

    def whole(self, audio: AudioChunk) -> bytes:
        samples = np.concatenate([self._resample(audio), self._resample.flush()])
        assert self._resample.rate is not None
        out = io.BytesIO()
        with self._open(out, self._resample.rate) as f:
            f.write(samples)
        return out.getvalue()


class _Mp3Stream(_SoundFileStream):
    """A streamed MP3 without LAME's first frame, the Info tag's placeholder (module docstring)."""

    def __init__(self, ctype: str, sndfile: tuple[str, str], rate: int | None) -> None:
        super().__init__(ctype, sndfile, rate)
        self._head = b""  # the placeholder's first bytes, until its header can be read
        self._skip: int | None = None  # bytes of the placeholder still to drop

    def feed(self, chunk: AudioChunk) -> bytes:
        return self._past_placeholder(super().feed(chunk))

    def finish(self) -> bytes:
        return self._past_placeholder(super().finish())

    def _past_placeholder(self, data: bytes) -> bytes:
        if self._skip is None:
            self._head += data
            if len(self._head) < 4:
                return b""
            data, self._head = self._head, b""
            self._skip = mp3_frame_bytes(data[:4])
        drop = min(self._skip, len(data))
        self._skip -= drop
        return data[drop:]


# MPEG audio Layer III: kbit/s by bitrate index (MPEG-1; MPEG-2 and 2.5), rates by version bits
_MP3_KBPS = (
    (0, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320),
    (0, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 144, 160),
)
_MP3_RATES = {3: (44100, 48000, 32000), 2: (22050, 24000, 16000), 0: (11025, 12000, 8000)}


def mp3_frame_bytes(header: bytes) -> int:
    """The length of the Layer III frame that starts with these 4 header bytes."""
    if len(header) < 4 or header[0] != 0xFF or header[1] & 0xE6 != 0xE2:
        raise ValueError(f"not an MPEG Layer III frame header: {header[:4].hex()}")
    version = (header[1] >> 3) & 3  # 3: MPEG-1, 2: MPEG-2, 0: MPEG-2.5
    kbps = _MP3_KBPS[version != 3][header[2] >> 4]
    rate = _MP3_RATES[version][(header[2] >> 2) & 3]
    return (144 if version == 3 else 72) * kbps * 1000 // rate + ((header[2] >> 1) & 1)
