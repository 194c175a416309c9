"""An audio device that can be unplugged: ALSA's ``file`` plugin writes the daemon's PortAudio
stream into a FIFO that a reader here drains (the soak's speaker, and tests/test_faults.py's).

No reader (or no directory) = no device; a reader that goes away = a device unplugged
mid-stream (writes fail like an unplugged USB card); a reader that keeps the FIFO open but stops
reading (``wedged``) = a driver that stops taking audio: once the pipe is full, PortAudio's write
blocks and never returns.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

READ_BYTES = 4096
READ_EVERY_S = 0.05  # ~80 kB/s, about twice real time for 22 kHz speech: playback takes a while


def asoundrc(fifo: Path) -> str:
    """An ``~/.asoundrc`` whose default device writes raw samples into ``fifo``."""
    return f'pcm.!default {{ type file; slave.pcm "null"; file "{fifo}"; format "raw" }}\n'


class FifoDevice:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.got_data = threading.Event()  # audio arrived since the caller last cleared it
        self.wedged = threading.Event()
        self.bytes_read = 0
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    def plug(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if not self.path.exists():
            os.mkfifo(self.path)
        self._stop.clear()
        self._thread = threading.Thread(target=self._read, name="fifo-device", daemon=True)
        self._thread.start()

    def _read(self) -> None:
        fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
        try:
            while not self._stop.is_set():
                try:
                    data = None if self.wedged.is_set() else os.read(fd, READ_BYTES)
                except BlockingIOError:
                    data = None
                if data:
                    self.bytes_read += len(data)
                    self.got_data.set()
                time.sleep(READ_EVERY_S)
        finally:
            os.close(fd)

    def wait_for_data(self, timeout: float = 10) -> bool:
        return self.got_data.wait(timeout)

    def unplug(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
            self._thread = None
