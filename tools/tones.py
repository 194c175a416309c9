"""The built-in chimes and sound icons speakd ships (``speakd/data/chime-<name>.wav``,
``speakd.request.sounds``): made here from sums of decaying partials, so the WAVs in the package are
reproducible from code.

    python -m speakd_tools.tones daemon/data

writes them again; tests/test_chimes.py checks the shipped files are what this makes.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from speakd.audio import AudioChunk, write_wav

RATE = 22050
# of full scale: headroom for the loudness gain (speakd.request.sounds measures each once)
PEAK = 0.5
# A bell's partials (ratios to the note) and their levels: a struck bar's inharmonic overtones.
PARTIALS = ((1.0, 1.0), (2.0, 0.35), (2.76, 0.25), (5.4, 0.08))
# name: the notes (Hz, start s), each decaying over DECAY_S; the clip ends at the last note's end
TONES: dict[str, tuple[tuple[float, float], ...]] = {
    "ding": ((880.0, 0.0),),
    "ding-dong": ((659.25, 0.0), (523.25, 0.45)),
    "attention": ((523.25, 0.0), (659.25, 0.25), (783.99, 0.5)),
}
# Sound icons (speakd.request.sounds.ICONS): short enough to go before a letter at typing speed
ICON_TONES: dict[str, tuple[tuple[float, float], ...]] = {"capital": ((1318.5, 0.0),)}
NOTE_S = 0.9
DECAY_S = 0.18  # time constant: a note is at -43 dB when it ends
ICON_NOTE_S, ICON_DECAY_S = 0.09, 0.02
ATTACK_S = 0.004  # short ramps in and out, so neither end is a click
RELEASE_S = 0.02


def tone(
    notes: tuple[tuple[float, float], ...], note_s: float = NOTE_S, decay_s: float = DECAY_S
) -> AudioChunk:
    """The notes summed, scaled to ``PEAK``, as 16-bit PCM at ``RATE``."""
    length = max(start for _, start in notes) + note_s
    t = np.arange(round(length * RATE)) / RATE
    out = np.zeros_like(t)
    for freq, start in notes:
        local = t - start
        on = local >= 0
        envelope = np.exp(-local[on] / decay_s) * np.minimum(1.0, local[on] / ATTACK_S)
        for ratio, level in PARTIALS:
            out[on] += level * envelope * np.sin(2 * np.pi * freq * ratio * local[on])
    release = round(RELEASE_S * RATE)
    out[-release:] *= np.linspace(1.0, 0.0, release)
    out *= PEAK / np.abs(out).max()
    return AudioChunk.from_float(out, RATE)


def write_tones(folder: Path) -> list[Path]:
    paths = []
    for name, notes in TONES.items():
        path = folder / f"chime-{name}.wav"
        write_wav(path, tone(notes))
        paths.append(path)
    for name, notes in ICON_TONES.items():
        path = folder / f"chime-{name}.wav"
        write_wav(path, tone(notes, ICON_NOTE_S, ICON_DECAY_S))
        paths.append(path)
    return paths


if __name__ == "__main__":
    for written in write_tones(Path(sys.argv[1] if len(sys.argv) > 1 else "daemon/data")):
        print(written)
