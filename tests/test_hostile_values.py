"""A client that sends a new pitch, speed and volume with every request does not grow the daemon.

``speakd-tools bench values``' short form: 500 says over the JSON socket of a real daemon,
each with unrounded floats drawn from the whole pitch range (resampled by the voice up to ±6
semitones, Rubber Band beyond), a speed and a volume; RSS at the end must be within 16 MB of its
value after 100 such says (the voice, Rubber Band and onnxruntime's arenas loaded). A resampling
kernel kept per distinct pitch (65 KB each, never freed) grew it by 29.5 MB over 600, and 4.0
MB over 2 000 after the fix (docs/benchmarks-archive.md, "bench values"). Pitches are rounded
to 0.01 semitone where they are keyed, and the kernels are an LRU of ``resample.KERNELS``."""

from __future__ import annotations

import argparse
import random
import string
import tracemalloc

import pytest

from speakd.audio.pitch import resolved
from speakd.engines.vits.text import phonemize_cached
from speakd_tools.bench.memory.values import measure

REQUESTS = 500
GROWTH_MB = 16


@pytest.mark.timeout(900)  # 600 syntheses: ~1.5 min on a 2-core VM at load 3 (1 100: 3 min)
def test_thousands_of_distinct_pitches_speeds_and_volumes_leave_rss_flat() -> None:
    args = argparse.Namespace(requests=REQUESTS, warmup=100, seed=53)
    result = measure(args)
    assert result["outcomes"] == {"done": REQUESTS + 100}, result["outcomes"]
    assert result["growth_mb"] <= GROWTH_MB, (result["warmup"], result["end"])


def test_a_pitch_is_keyed_at_a_hundredth_of_a_semitone_never_coarser() -> None:
    """Finer than any front-end's step (SSIP's PITCH moves by 0.12 semitone, SSML's by 0.01):
    two pitches a client can tell apart stay apart, and two floats that differ past it are one."""
    assert resolved(1.2345678) == resolved(1.2300001) == 1.23
    assert resolved(0.12) != resolved(0.24) and resolved(-0.01) == -0.01
    assert resolved(0.004) is None and resolved(-0.0049) is None and resolved(None) is None


def test_long_tokens_a_client_sends_are_not_kept_by_the_word_cache() -> None:
    """Word timings phonemize each token alone, remembered for the words said again and again;
    300 distinct 2 000-character tokens (a text with no space) kept 8.5 MB there, and the 4 096
    it held about 115 MB."""
    rng = random.Random(53)
    phonemize_cached("en-us", "warm", None)  # espeak-ng loaded before the count starts
    tracemalloc.start()
    try:
        start = tracemalloc.get_traced_memory()[0]
        for _ in range(300):
            token = "".join(rng.choice(string.ascii_lowercase) for _ in range(2000))
            phonemize_cached("en-us", token, None)
        kept_mb = (tracemalloc.get_traced_memory()[0] - start) / 2**20
    finally:
        tracemalloc.stop()
    assert kept_mb < 2, kept_mb
