"""``bench screenreader``'s navigation phase: new text as a screen reader makes it.

Orca reads each line the caret arrows onto, each menu item it lands on (its label and role) and,
for say-all, one sentence per ``SPEAK``; every message is Orca's SSML with a ``<mark/>`` before
every word, after its ``CANCEL self`` and its voice (``RATE 0``, ``PITCH 10``…). None of it is in
a cache: the texts are drawn afresh each run (``fresh``), the same ones for both contenders.

Two instants per message, from the moment the ``SPEAK`` goes out: its ``701 BEGIN``, and its
**first audio**, the text's own first sample above ``SILENT`` reaching the sink (a voice that
starts with 80 ms of silence is heard 80 ms after BEGIN):

* speakd: its realtime-paced WAV sink writes BEGIN's block first and plays on at the sample rate,
  so first audio = BEGIN + the first loud sample's offset in the message's WAV file / rate.
* Speech Dispatcher: ``parec`` records its PulseAudio null sink's monitor; a sample's instant is
  its block's arrival less the samples after it in the block (PulseAudio's own buffering counts,
  as it would on a card).

Each message is heard to its end before the next key, so one message's tail is never taken for
the next one's start.
"""

from __future__ import annotations

import os
import random
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

SILENT = 104  # |sample| below −50 dBFS is silence (Piper's floor between words is near −85)
PACE_S = 0.15  # quiet after each message's END before the next key
RATE = 22050  # what parec records the monitor at

SUBJECTS = (
    "The report",
    "Our team",
    "This chapter",
    "The invoice",
    "Every board",
    "The meeting",
    "Her letter",
    "The budget",
    "My neighbour",
    "The printer",
    "Your order",
    "The garden",
)
VERBS = ("describes", "covers", "mentions", "lists", "explains", "compares", "follows", "needs")
OBJECTS = (
    "the new schedule",
    "three open questions",
    "last year's figures",
    "a short summary",
    "the delivery dates",
    "two small changes",
    "the river crossing",
    "every kitchen tool",
    "the winter plans",
    "a blue folder",
    "the hotel rooms",
    "four missing pages",
)
PLACES = (
    "in detail",
    "before Friday",
    "on page nine",
    "for the council",
    "at the end",
    "without a table",
    "by the window",
    "for new staff",
    "in one line",
    "after lunch",
)
LABELS = (
    "Open",
    "Save",
    "Print",
    "Export",
    "Rename",
    "Duplicate",
    "Insert",
    "Format",
    "Sort",
    "Filter",
    "Share",
    "Archive",
    "Compare",
    "Merge",
    "Restore",
    "Lock",
)
THINGS = (
    "document",
    "selection",
    "table",
    "picture",
    "page",
    "chart",
    "column",
    "comment",
    "template",
    "folder",
    "bookmark",
    "outline",
)
ROLES = (
    "menu item",
    "menu",
    "check menu item not checked",
    "check menu item checked",
    "radio menu item selected",
)
SAY_ALL_FIRST = (
    "{s} {v} {o} {p}, and then it goes on to explain why the changes matter to everyone who "
    "reads it, one careful paragraph at a time."
)


@dataclass(frozen=True)
class Texts:
    lines: tuple[str, ...]
    menu: tuple[str, ...]
    say_all: tuple[str, ...]


def fresh(seed: int, n_lines: int, n_menu: int, n_say_all: int) -> Texts:
    """Distinct texts, none of them a key-echo text: ``seed`` differs run to run."""
    rng = random.Random(seed)

    def draw(n: int, make) -> tuple[str, ...]:  # type: ignore[no-untyped-def]
        out: dict[str, None] = {}
        while len(out) < n:
            out[make()] = None
        return tuple(out)

    def line() -> str:
        s, v, o, p = (rng.choice(x) for x in (SUBJECTS, VERBS, OBJECTS, PLACES))
        return f"{s} {v} {o} {p}."

    def item() -> str:
        return f"{rng.choice(LABELS)} {rng.choice(THINGS)} {rng.choice(ROLES)}"

    def first() -> str:
        s, v, o, p = (rng.choice(x) for x in (SUBJECTS, VERBS, OBJECTS, PLACES))
        return SAY_ALL_FIRST.format(s=s, v=v, o=o.lower(), p=p)

    return Texts(draw(n_lines, line), draw(n_menu, item), draw(n_say_all, first))


def first_loud(pcm: np.ndarray) -> int | None:
    """Index of the first sample above ``SILENT``; None when there is none."""
    loud = np.flatnonzero(np.abs(pcm.astype(np.int32)) >= SILENT)
    return int(loud[0]) if loud.size else None


@dataclass
class Spoken:
    """One message: what was said, when its SPEAK went out and its 701 arrived (monotonic s)."""

    phase: str
    text: str
    msg_id: str
    sent: float
    begin: float
    end: float = 0.0


class FirstAudio(Protocol):
    def first_audio(self, m: Spoken) -> float | None: ...

    def mark(self) -> None:
        """The measured part of the run starts (after its warm-up)."""

    def figures(self, nav: NavTrial) -> dict[str, Any]:
        """What the server itself says of the run since ``mark`` (speakd: its parts, its loop)."""
        return {}

    def close(self) -> None: ...


class WavOffsets:
    """speakd's realtime WAV sink: BEGIN + the first loud sample's place in the message's file."""

    def __init__(self, wav_dir: Path) -> None:
        self.wav_dir = wav_dir

    def first_audio(self, m: Spoken) -> float | None:
        from speakd.audio import read_wav

        path = self.wav_dir / f"ssip-{m.msg_id}.wav"
        deadline = time.monotonic() + 5
        while not path.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        if not path.exists():
            return None
        clip = read_wav(path)
        at = first_loud(np.frombuffer(clip.pcm, np.int16))
        return None if at is None else m.begin + at / clip.sample_rate

    def close(self) -> None:
        pass


class Monitor:
    """A PulseAudio sink's monitor recorded by ``parec``, each block timed as it arrives."""

    def __init__(self, env: dict[str, str], source: str) -> None:
        self.blocks: list[tuple[float, np.ndarray]] = []
        self._lock = threading.Lock()
        self._proc = subprocess.Popen(
            [
                *("parec", "-d", source, "--raw", "--format=s16le", f"--rate={RATE}"),
                *("--channels=1", "--latency-msec=2"),
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        assert self._proc.stdout is not None
        self._fd = self._proc.stdout.fileno()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        odd = b""
        while data := os.read(self._fd, 4096):
            now = time.monotonic()
            data, odd = odd + data, b""
            if len(data) % 2:
                data, odd = data[:-1], data[-1:]
            with self._lock:
                self.blocks.append((now, np.frombuffer(data, np.int16)))

    def first_audio(self, m: Spoken) -> float | None:
        with self._lock:
            blocks = [(t, b) for t, b in self.blocks if m.sent < t <= m.end + 0.5]
        for t, block in blocks:
            at = first_loud(block)
            if at is not None:
                return max(m.sent, t - (block.size - at) / RATE)
        return None

    def mark(self) -> None:
        pass

    def figures(self, nav: NavTrial) -> dict[str, Any]:
        return {}

    def close(self) -> None:
        self._proc.terminate()
        self._proc.wait(10)
        self._reader.join(5)


@dataclass
class NavTrial:
    spoken: list[Spoken] = field(default_factory=list)
    first: dict[str, float | None] = field(default_factory=dict)  # msg id → first audio (s)


def samples(trial: NavTrial, phases: tuple[str, ...], first_audio: bool) -> list[float]:
    """ms from SPEAK to BEGIN (or to first audio) of the messages of ``phases``."""
    out = []
    for m in trial.spoken:
        if m.phase not in phases:
            continue
        at = trial.first.get(m.msg_id) if first_audio else m.begin
        if at is not None:
            out.append((at - m.sent) * 1000)
    return out
