"""Where PCM goes: a sounddevice stream, WAV files, or nowhere. Sinks know nothing of requests.

A sink plays one utterance at a time: ``begin`` → ``write``… → ``drain`` (or ``abort`` to drop
what is buffered). A paused utterance is drained part-way and later continued with ``resume``
(other utterances may play in between): a sink that writes a file per utterance extends it.
``write`` blocks at playback speed on a real device, so the scheduler's block size bounds the
stop latency. A missing or vanished device is a state, not a crash: ``SinkUnavailable`` fails the
request, ``status()`` says why, and the next ``begin`` retries.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path
from typing import Any, Protocol

from speakd.audio import AudioChunk, read_wav, write_wav
from speakd.config import AudioConfig

log = logging.getLogger(__name__)


class SinkUnavailable(Exception):
    """No usable output device right now (none present, unplugged, PortAudio missing)."""


class Sink(Protocol):
    name: str

    def begin(self, utterance_id: str, sample_rate: int) -> None: ...

    def resume(self, utterance_id: str, sample_rate: int) -> None: ...

    def write(self, pcm: bytes) -> None: ...

    def drain(self) -> None: ...

    def abort(self) -> None: ...

    def status(self) -> dict[str, Any]: ...

    def close(self) -> None: ...


class _Pacer:
    """Sleeps so an unpaced sink consumes audio no faster than a device would."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self._rate = 1
        self._start = 0.0
        self._frames = 0

    def begin(self, sample_rate: int) -> None:
        self._rate, self._start, self._frames = sample_rate, time.monotonic(), 0

    def advance(self, frames: int) -> None:
        if not self.enabled:
            return
        self._frames += frames
        ahead = self._start + self._frames / self._rate - time.monotonic()
        if ahead > 0:
            time.sleep(ahead)


class NullSink:
    name = "null"

    def __init__(self, realtime: bool = False) -> None:
        self._pacer = _Pacer(realtime)
        self.bytes_played = 0

    def begin(self, utterance_id: str, sample_rate: int) -> None:
        self._pacer.begin(sample_rate)

    def resume(self, utterance_id: str, sample_rate: int) -> None:
        self.begin(utterance_id, sample_rate)

    def write(self, pcm: bytes) -> None:
        self.bytes_played += len(pcm)
        self._pacer.advance(len(pcm) // 2)

    def drain(self) -> None:
        pass

    def abort(self) -> None:
        pass

    def status(self) -> dict[str, Any]:
        return {"sink": self.name, "available": True}

    def close(self) -> None:
        pass


class WavSink:
    """One ``<utterance id>.wav`` per request (renamed into place when complete or stopped)."""

    name = "wav"

    def __init__(self, directory: Path, realtime: bool = False) -> None:
        self.directory = directory
        self._pacer = _Pacer(realtime)
        self._id = ""
        self._rate = 0
        self._pcm: list[bytes] = []

    def begin(self, utterance_id: str, sample_rate: int) -> None:
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise SinkUnavailable(f"wav_dir {self.directory}: {e.strerror}") from e
        self._id, self._rate, self._pcm = utterance_id, sample_rate, []
        self._pacer.begin(sample_rate)

    def resume(self, utterance_id: str, sample_rate: int) -> None:
        """Continue the file written when the utterance was paused."""
        self.begin(utterance_id, sample_rate)
        path = self._path(utterance_id)
        if path.exists():
            self._pcm = [read_wav(path).pcm]

    def _path(self, utterance_id: str) -> Path:
        # The id comes from clients: keep only a safe file name.
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in utterance_id).lstrip(".")
        return self.directory / f"{safe or 'utterance'}.wav"

    def write(self, pcm: bytes) -> None:
        self._pcm.append(pcm)
        self._pacer.advance(len(pcm) // 2)

    def _flush(self) -> None:
        if not self._id:
            return
        final = self._path(self._id)
        tmp = final.with_suffix(".wav.part")
        write_wav(tmp, AudioChunk(b"".join(self._pcm), self._rate))
        os.replace(tmp, final)
        self._id, self._pcm = "", []

    def drain(self) -> None:
        self._flush()

    def abort(self) -> None:
        self._flush()

    def status(self) -> dict[str, Any]:
        return {"sink": self.name, "available": True, "wav_dir": str(self.directory)}

    def close(self) -> None:
        pass


class SoundDeviceSink:
    """A PortAudio output stream kept open between utterances (no open cost on a cache hit)."""

    name = "sounddevice"
    RETRY_S = 2.0

    def __init__(self, device: str = "") -> None:
        self.device: int | str | None = int(device) if device.isdigit() else (device or None)
        self._stream: Any = None
        self._rate = 0
        self._error = ""
        self._last_try = 0.0
        self._lock = threading.Lock()

    def _sd(self) -> Any:
        try:
            import sounddevice
        except OSError as e:  # libportaudio2 missing
            raise SinkUnavailable(
                f"PortAudio not found ({e}); apt-get install libportaudio2"
            ) from e
        return sounddevice

    def _open(self, sample_rate: int) -> None:
        sd = self._sd()
        if self._error:
            # Devices are enumerated at PortAudio init: re-init to see a device that came back.
            if time.monotonic() - self._last_try < self.RETRY_S:
                raise SinkUnavailable(self._error)
            sd._terminate()
            sd._initialize()
        self._last_try = time.monotonic()
        try:
            stream = sd.RawOutputStream(
                samplerate=sample_rate, channels=1, dtype="int16", device=self.device
            )
            stream.start()
        except Exception as e:  # PortAudioError, ValueError for unknown device names
            self._error = f"cannot open output device {self.device or 'default'!s}: {e}"
            raise SinkUnavailable(self._error) from e
        if self._error:
            log.info("audio device is back: %s", self.device or "default")
        self._stream, self._rate, self._error = stream, sample_rate, ""

    def _drop_stream(self) -> None:
        if self._stream is not None:
            try:
                self._stream.abort()
                self._stream.close()
            except Exception:  # the device may already be gone
                log.debug("closing a broken stream failed", exc_info=True)
            self._stream = None

    def begin(self, utterance_id: str, sample_rate: int) -> None:
        with self._lock:
            if self._stream is not None and self._rate != sample_rate:
                self._drop_stream()
            if self._stream is None:
                self._open(sample_rate)
            elif self._stream.stopped:
                self._stream.start()

    def resume(self, utterance_id: str, sample_rate: int) -> None:
        self.begin(utterance_id, sample_rate)

    def write(self, pcm: bytes) -> None:
        try:
            self._stream.write(pcm)
        except Exception as e:
            self._error = f"output device failed during playback: {e}"
            log.warning("%s", self._error)
            with self._lock:
                self._drop_stream()
            raise SinkUnavailable(self._error) from e

    def drain(self) -> None:
        with self._lock:
            if self._stream is not None:
                self._stream.stop()  # returns once the buffered audio has played

    def abort(self) -> None:
        with self._lock:
            if self._stream is not None:
                self._stream.abort()  # drops buffered audio now

    def status(self) -> dict[str, Any]:
        return {
            "sink": self.name,
            "device": self.device if self.device is not None else "default",
            "available": not self._error,
            "error": self._error or None,
        }

    def close(self) -> None:
        with self._lock:
            self._drop_stream()


def make_sink(config: AudioConfig) -> Sink:
    if config.sink == "null":
        return NullSink(config.realtime)
    if config.sink == "wav":
        return WavSink(Path(config.wav_dir), config.realtime)
    return SoundDeviceSink(config.device)
