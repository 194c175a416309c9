"""Loudness: the numpy BS.1770 meter against pyloudnorm, and every voice's clips at
audio.loudness_lufs through the daemon's own request path (library, resolver, cache)."""

from __future__ import annotations

import json
from pathlib import Path
from unittest.mock import ANY

import numpy as np
import pyloudnorm
import pytest

from speakd.audio import join_chunks
from speakd.cache.store import CacheStore
from speakd.config import load_config
from speakd.engines.base import SynthesisConfig
from speakd.engines.chattts.engine import ChatTTSEngine
from speakd.engines.vits.engine import VitsEngine
from speakd.engines.vits.params import EMBEDDED_LOUDNESS
from speakd.request.loudness import CALIBRATION, VoiceLoudness, integrated_loudness, recorded
from speakd.request.messages import SpeakRequest
from speakd.request.resolver import Resolver
from speakd.request.stream import Cancel
from speakd.request.voices import Voice, VoiceLibrary, build_library
from tests.tone_engine import ToneEngine

PIPER = "en_US-joe-medium"
TEXT = "Welcome aboard. The next stop is Central Station, change here for the airport."


@pytest.mark.parametrize("rate", [16000, 22050, 24000, 48000])
def test_the_meter_is_bs1770_as_pyloudnorm_measures_it(rate: int) -> None:
    rng = np.random.default_rng(rate)
    t = np.arange(int(rate * 3.3)) / rate
    signal = (
        0.3 * np.sin(2 * np.pi * 440 * t) * (t < 1.5)  # a tone, then quiet (gated out), then
        + 0.05 * rng.standard_normal(t.size) * (t > 2)  # noise, and a hum the high pass cuts
        + 0.2 * np.sin(2 * np.pi * 60 * t) * (t > 2.8)
    )
    ours = integrated_loudness(signal, rate)
    assert ours == pytest.approx(pyloudnorm.Meter(rate).integrated_loudness(signal), abs=0.01)
    assert integrated_loudness(0.1 * signal, rate) == pytest.approx(ours - 20, abs=0.01)
    assert integrated_loudness(np.zeros(rate), rate) == float("-inf")


@pytest.fixture(scope="module")
def piper() -> VitsEngine:
    return VitsEngine.embedded()


def resolver_at(tmp_path: Path, piper: VitsEngine, loudness: float | None) -> Resolver:
    """The embedded Piper voice and a generated one (tones, at its own level), one cache."""
    tone = ToneEngine()
    voices = [Voice(e, e.kind, lambda e=e: e, engine=e) for e in (piper, tone)]
    library = VoiceLibrary(voices, loudness=loudness)
    return Resolver(library, CacheStore(tmp_path / f"cache{loudness}.db"))


def said(resolver: Resolver, voice: str, text: str = TEXT) -> tuple[str, float]:
    config = SynthesisConfig(voice=voice)
    prepared = resolver.voices.prepare(text, config)
    request = SpeakRequest(text=text, config=config, prepared=prepared)
    chunk = join_chunks(resolver.stream(request, Cancel()))
    assert chunk is not None
    return prepared.key, integrated_loudness(chunk.samples() / 32768, chunk.sample_rate)


def test_two_voices_clips_measure_within_1_lu_of_the_target_and_are_stored_so(
    tmp_path: Path, piper: VitsEngine
) -> None:
    """At -20 (the default) and -28: each voice's one gain, measured on its calibration text,
    brings another text's clip there; the target is in the key, and the cache holds the
    normalised clip. Off, neither voice is at -20 by itself."""
    default = resolver_at(tmp_path, piper, -20.0)
    quiet = resolver_at(tmp_path, piper, -28.0)
    off = resolver_at(tmp_path, piper, None)
    for voice in (PIPER, "low"):
        key, level = said(default, voice)
        assert level == pytest.approx(-20, abs=1.0), voice
        quiet_key, quiet_level = said(quiet, voice)
        assert quiet_level == pytest.approx(-28, abs=1.0), voice
        assert quiet_key != key
        assert default.store is not None
        stored = default.store.get(key)
        assert stored is not None
        chunk = stored.chunk()
        assert integrated_loudness(chunk.samples() / 32768, chunk.sample_rate) == level
        off_key, off_level = said(off, voice)
        assert off_key not in (key, quiet_key)
        assert abs(off_level - level) > 1.0, voice  # neither voice is made at -20 by itself


def test_the_daemon_config_sets_the_target_and_0_turns_it_off(tmp_path: Path) -> None:
    path = tmp_path / "speakd.toml"
    path.write_text(f'[voices]\ndir = "{tmp_path}"\n')
    assert build_library(load_config(path)).loudness == -20.0
    path.write_text(f'[voices]\ndir = "{tmp_path}"\n[audio]\nloudness_lufs = 0\n')
    library = build_library(load_config(path))
    assert library.loudness is None
    assert "loudness" not in library.prepare("Hello.", SynthesisConfig()).params


def test_a_bundle_records_its_level_and_a_board_trusts_only_its_own_record(
    tiny_bundle: Path,
) -> None:
    """Export measured the ChatTTS voice over the calibration text into its manifest: the daemon
    takes that level without a synthesis of its own (seconds on a board). A record made for
    other bytes (an NPU plan's id) or another calibration text is not trusted: the board
    measures, and finds what the record says. (The tiny random-weight voice is near silence,
    which is recorded as None and gets no gain.)"""
    record = json.loads((tiny_bundle / "manifest.json").read_text())["loudness"]
    engine = ChatTTSEngine.load(tiny_bundle, threads=1)
    assert record == {"calibration": CALIBRATION, "bundle_id": engine.bundle_id, "lufs": ANY}
    level = float("-inf") if record["lufs"] is None else record["lufs"]
    assert recorded(engine) == level

    calls = []
    synthesize = engine.synthesize
    engine.synthesize = lambda *a, **kw: (calls.append(a[0]), (yield from synthesize(*a, **kw)))[1]
    target = -20.0
    gain = VoiceLoudness().gain(engine, target)
    assert calls == []  # the record, not a synthesis

    for stale in ({"calibration": CALIBRATION + 1}, {"bundle_id": f"{engine.bundle_id}+rknn"}):
        engine.loudness_record = {**record, **stale}
        assert recorded(engine) is None, stale
    assert VoiceLoudness().gain(engine, target) == pytest.approx(gain, rel=0.01)
    assert calls  # measured on this board instead


def test_the_embedded_voice_ships_the_level_speakd_tools_measures(capsys) -> None:
    """The record shipped in the code is what `speakd-tools loudness embedded` measures now (a
    changed calibration text, meter or voice package breaks it)."""
    from speakd_tools.cli import main

    assert main(["loudness", "embedded"]) == 0
    name, printed = capsys.readouterr().out.strip().split(": ", 1)
    measured = json.loads(printed)
    assert name == "embedded"
    assert {**measured, "lufs": ANY} == EMBEDDED_LOUDNESS
    assert measured["lufs"] == pytest.approx(EMBEDDED_LOUDNESS["lufs"], abs=0.05)
    assert recorded(VitsEngine.embedded()) == EMBEDDED_LOUDNESS["lufs"]
