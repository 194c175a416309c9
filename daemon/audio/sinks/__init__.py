"""Where PCM goes: a sounddevice stream, WAV files, or nowhere (here), or a Hermes audio server
over MQTT (``mqtt_speaker.py``). Sinks know nothing of requests.

A sink plays one utterance at a time: ``begin`` → ``write``… → ``drain`` (or ``abort`` to drop
what is buffered). A paused utterance is drained part-way and later continued with ``resume``
(other utterances may play in between): a sink that writes a file per utterance extends it.
``write`` blocks at playback speed on a real device (and on a realtime-paced null or WAV sink).
``interrupt`` (from any thread, when the playing utterance is stopped) lets a paced sink's
``write`` return at once, so a stop does not wait for the rest of the block; a device's block goes
to PortAudio in ``DEVICE_WRITE_MS`` pieces and its write stops at the next piece, and ``abort``
then drops what the device buffers.
A missing or vanished device is a state, not a crash: ``SinkUnavailable`` fails the request,
``status()`` says why, and the next ``begin`` retries. So is a wedged one: a device write that
does not return within ``max(WRITE_TIMEOUT_MIN_S, WRITE_TIMEOUT_FACTOR × its duration)``
(``START_TIMEOUT_S`` in the first seconds after the stream starts), or
a drain (PortAudio's stop) that does not within ``max(WRITE_TIMEOUT_MIN_S, WRITE_TIMEOUT_FACTOR ×
the stream's latency)``, fails the request and the stream is replaced.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from pathlib import Path
from typing import Any, Protocol

from speakd.audio import AudioChunk, read_wav, write_wav
from speakd.config import AudioConfig

log = logging.getLogger(__name__)

WRITE_TIMEOUT_MIN_S = 1.0  # a device write may block this long, however short the block
# ... and this long in the first START_TIMEOUT_S after the stream starts: a sound server fills
# its prebuffer before it plays, and until then a write waits once the device buffer is full
# (PulseAudio's null sink through ALSA's pulse plugin, PortAudio's default device on a desktop:
# 1–2 s on a loaded machine; the desktop set-up of tests/test_deb.py met it).
START_TIMEOUT_S = 5.0
WRITE_TIMEOUT_FACTOR = 4.0  # … or this many times the block's duration


class SinkUnavailable(Exception):
    """No usable output device right now (none present, unplugged, PortAudio missing)."""


class Sink(Protocol):
    name: str

    def begin(self, utterance_id: str, sample_rate: int) -> None: ...

    def resume(self, utterance_id: str, sample_rate: int) -> None: ...

    def write(self, pcm: bytes) -> None: ...

    def drain(self) -> None: ...

    def abort(self) -> None: ...

    def interrupt(self) -> None: ...

    def status(self) -> dict[str, Any]: ...

    def close(self) -> None: ...


class _Pacer:
    """Sleeps so an unpaced sink consumes audio no faster than a device would; ``interrupt``
    ends the sleep (a stop), until the next ``begin``."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self._rate = 1
        self._start = 0.0
        self._frames = 0
        self._interrupted = threading.Event()

    def begin(self, sample_rate: int) -> None:
        self._rate, self._start, self._frames = sample_rate, time.monotonic(), 0
        self._interrupted.clear()

    def interrupt(self) -> None:
        self._interrupted.set()

    def advance(self, frames: int) -> None:
        if not self.enabled:
            return
        self._frames += frames
        ahead = self._start + self._frames / self._rate - time.monotonic()
        if ahead > 0:
            self._interrupted.wait(ahead)


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

    def interrupt(self) -> None:
        self._pacer.interrupt()

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

    def interrupt(self) -> None:
        self._pacer.interrupt()

    def status(self) -> dict[str, Any]:
        return {"sink": self.name, "available": True, "wav_dir": str(self.directory)}

    def close(self) -> None:
        pass


# Held while PortAudio makes or destroys streams (open, close, re-init), never during a write
# or a stop: one of those can block for good on a wedged device.
PORTAUDIO = threading.Lock()
DEVICE_WRITE_MS = 10  # a block goes to PortAudio in pieces this long: a stop waits for one
CLOSE_WAIT_S = 2.0  # how long opening a stream waits for an abandoned one's close (may be stuck)


def _close_stream(stream: Any) -> None:
    with PORTAUDIO:
        try:
            stream.abort()
            stream.close()
        except Exception:  # the device may already be gone
            log.debug("closing a broken stream failed", exc_info=True)


class _DeviceCalls:
    """Runs device calls (writes, the end-of-utterance stop) on a thread of their own, so the
    caller can give up on one that never returns (a wedged driver). The abandoned thread closes
    the stream itself once that call returns, and ends: aborting or closing a stream while
    another thread is inside PortAudio for it crashes the process (SIGSEGV in the stuck write,
    seen in tests/test_faults.py::test_audio_device_that_stops_taking_audio). A call that never
    returns leaves its stream open."""

    def __init__(self) -> None:
        self._calls: queue.Queue[tuple[Any, tuple[Any, ...]] | None] = queue.Queue()
        self._results: queue.Queue[BaseException | None] = queue.Queue()
        self._orphan: Any = None
        self.ended = threading.Event()  # abandoned, and its stream closed
        threading.Thread(target=self._run, name="speakd-audio-device", daemon=True).start()

    def _run(self) -> None:
        while (call := self._calls.get()) is not None:
            fn, args = call
            try:
                fn(*args)
            except Exception as e:  # handed to the caller
                self._results.put(e)
            else:
                self._results.put(None)
        if self._orphan is not None:
            _close_stream(self._orphan)
        self.ended.set()

    def call(self, timeout: float, fn: Any, *args: Any) -> bool:
        """``fn(*args)`` on the device thread; False when it has not returned within ``timeout``
        (then ``abandon``), its exception re-raised."""
        self._calls.put((fn, args))
        try:
            error = self._results.get(timeout=timeout)
        except queue.Empty:
            return False
        if error is not None:
            raise error
        return True

    def abandon(self, stream: Any) -> None:
        """Give up on the stuck call: this thread closes ``stream`` once it returns, if ever."""
        self._orphan = stream
        self._calls.put(None)


class SoundDeviceSink:
    """A PortAudio output stream kept open between utterances (no open cost on a cache hit)."""

    name = "sounddevice"
    pads_tail = True  # the scheduler plays audio.tail_ms of silence before the drain
    RETRY_S = 2.0

    def __init__(self, device: str = "") -> None:
        self.device: int | str | None = int(device) if device.isdigit() else (device or None)
        self._stream: Any = None
        self._rate = 0
        self._error = ""
        self._last_try = 0.0
        self._wedged = False  # the last stream stopped taking writes: reopen at once
        self._started = 0.0  # monotonic time the stream last started (START_TIMEOUT_S)
        self._device: _DeviceCalls | None = None
        self._abandoned: list[_DeviceCalls] = []  # stuck calls whose stream is not closed yet
        self._lock = threading.Lock()
        self._interrupted = threading.Event()  # a stop: the write under way ends early

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
        self._abandoned = [d for d in self._abandoned if not d.ended.is_set()]
        if self._error and not self._wedged and time.monotonic() - self._last_try < self.RETRY_S:
            raise SinkUnavailable(self._error)
        if not PORTAUDIO.acquire(timeout=CLOSE_WAIT_S):
            self._error = self._error or "an abandoned output stream is still being closed"
            raise SinkUnavailable(self._error)
        try:
            # Devices are enumerated at PortAudio init: re-init to see a device that came back;
            # not after a wedge, nor under an abandoned stream (re-init closes every stream).
            if self._error and not self._wedged and not self._abandoned:
                sd._terminate()
                sd._initialize()
            self._last_try, self._wedged = time.monotonic(), False
            stream = sd.RawOutputStream(
                samplerate=sample_rate, channels=1, dtype="int16", device=self.device
            )
            stream.start()
        except Exception as e:  # PortAudioError, ValueError for unknown device names
            self._error = f"cannot open output device {self.device or 'default'!s}: {e}"
            raise SinkUnavailable(self._error) from e
        finally:
            PORTAUDIO.release()
        if self._error:
            log.info("audio device is back: %s", self.device or "default")
        self._stream, self._rate, self._error = stream, sample_rate, ""

    def _drop_stream(self) -> None:
        if self._stream is not None:
            _close_stream(self._stream)
            self._stream = None

    def begin(self, utterance_id: str, sample_rate: int) -> None:
        self._interrupted.clear()
        with self._lock:
            if self._stream is not None and self._rate != sample_rate:
                self._drop_stream()
            if self._stream is None:
                self._open(sample_rate)
                self._started = time.monotonic()
            elif self._stream.stopped:
                self._stream.start()
                self._started = time.monotonic()

    def resume(self, utterance_id: str, sample_rate: int) -> None:
        self.begin(utterance_id, sample_rate)

    def write(self, pcm: bytes) -> None:
        starting = time.monotonic() - self._started < START_TIMEOUT_S
        floor = START_TIMEOUT_S if starting else WRITE_TIMEOUT_MIN_S
        timeout = max(floor, WRITE_TIMEOUT_FACTOR * len(pcm) / 2 / self._rate)
        self._call(timeout, "a write", self._write_pieces, self._stream, pcm)

    def _write_pieces(self, stream: Any, pcm: bytes) -> None:
        """On the device thread: ``pcm`` in pieces of ``DEVICE_WRITE_MS``, until interrupted."""
        step = max(1, self._rate * DEVICE_WRITE_MS // 1000) * 2
        for i in range(0, len(pcm), step):
            if self._interrupted.is_set():
                return
            stream.write(pcm[i : i + step])

    def drain(self) -> None:
        with self._lock:
            stream = self._stream
        if stream is not None:  # stop() returns once the buffered audio has played
            timeout = max(WRITE_TIMEOUT_MIN_S, WRITE_TIMEOUT_FACTOR * float(stream.latency))
            self._call(timeout, "stopping the stream", stream.stop)

    def _call(self, timeout: float, what: str, fn: Any, *args: Any) -> None:
        """A device call bounded by ``timeout``: an error or a call that never returns makes
        the device unavailable (SinkUnavailable) and the stream is replaced next time."""
        self._device = self._device or _DeviceCalls()
        try:
            returned = self._device.call(timeout, fn, *args)
        except Exception as e:
            self._error = f"output device failed during playback: {e}"
            log.warning("%s", self._error)
            with self._lock:
                self._drop_stream()
            raise SinkUnavailable(self._error) from e
        if not returned:
            self._abandon(timeout, what)

    def _abandon(self, timeout: float, what: str) -> None:
        """A call is stuck in the driver: leave it and its stream behind (its thread closes the
        stream once the call returns); the next utterance opens a new stream."""
        self._error = (
            f"output device {self.device or 'default'!s} stopped taking audio: {what} did not "
            f"return within {timeout:.1f} s; the stream is reopened for the next utterance"
        )
        log.error("%s", self._error)
        with self._lock:
            stuck, self._stream = self._stream, None
        assert self._device is not None
        self._device.abandon(stuck)
        self._abandoned.append(self._device)
        self._device, self._wedged = None, True
        raise SinkUnavailable(self._error)

    def abort(self) -> None:
        with self._lock:
            if self._stream is not None:
                self._stream.abort()  # drops buffered audio now

    def interrupt(self) -> None:
        """The write under way stops at its next ``DEVICE_WRITE_MS`` piece (PortAudio's blocking
        write cannot be cut short, nor the stream aborted while it runs); ``abort`` then drops
        what the device buffers."""
        self._interrupted.set()

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
