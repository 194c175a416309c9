"""Sounds by name (speakd.request.sounds): the built-in chimes as shipped, pinned clips of a real
imported pack found by their text (the request's voice's first), and every sound at the loudness
target."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from speakd.audio import read_wav
from speakd.cache.packs import import_pack
from speakd.cache.store import CacheStore, Clip
from speakd.request.errors import RequestError
from speakd.request.loudness import integrated_loudness
from speakd.request.sounds import CHIMES, ICONS, Sounds
from speakd_tools.tones import ICON_DECAY_S, ICON_NOTE_S, ICON_TONES, TONES, tone

DATA = Path(__file__).resolve().parent.parent / "daemon" / "data"
RATE = 16000


def noise(seconds: float, level: float, seed: int = 0) -> bytes:
    """Speech-like loudness without a voice: band-limited noise at ``level`` of full scale."""
    rng = np.random.default_rng(seed)
    samples = np.convolve(rng.standard_normal(round(seconds * RATE)), np.ones(8) / 8, "same")
    return (samples / np.abs(samples).max() * level * 32767).astype("<i2").tobytes()


def clip(key: str, text: str, bundle: str, voice: str, audio: bytes, **params: object) -> Clip:
    return Clip(key, text, voice, dict(params), bundle, RATE, audio, pinned=True)


def lufs(samples: np.ndarray, rate: int) -> float:
    return integrated_loudness(samples / 32768.0, rate)


@pytest.fixture
def store(tmp_path: Path):
    """A cache with a pack imported: "Mind the gap." in two voices, one of another bundle."""
    pack = tmp_path / "pack.db"
    with CacheStore(pack, ttl_s=0) as p:
        p.put_many(
            [
                clip("k-b", "Mind the gap.", "bundle-2", "bob", noise(1, 0.3, 1)),
                clip("k-a", "Mind the gap.", "bundle-1", "alice", noise(1, 0.3, 2)),
                clip("k-c", "Mind the gap.", "bundle-1", "carol", noise(1, 0.3, 3)),
            ]
        )
    with CacheStore(tmp_path / "cache.db") as s:
        assert import_pack(s, pack) == (3, 3)
        s.put(Clip("k-u", "Not pinned.", "alice", {}, "bundle-1", RATE, noise(1, 0.3)))
        yield s


def test_the_shipped_chimes_are_what_the_tool_makes() -> None:
    """``python -m speakd_tools.tones daemon/data`` makes them (to within a rounding step on
    another machine's float library)."""
    assert tuple(TONES) == CHIMES and tuple(ICON_TONES) == ICONS
    made_by_name = {name: tone(notes) for name, notes in TONES.items()}
    made_by_name |= {n: tone(notes, ICON_NOTE_S, ICON_DECAY_S) for n, notes in ICON_TONES.items()}
    for name, made in made_by_name.items():
        shipped = read_wav(DATA / f"chime-{name}.wav")
        assert shipped.sample_rate == made.sample_rate
        diff = shipped.samples().astype(int) - made.samples().astype(int)
        assert np.abs(diff).max() <= 1, name


@pytest.mark.parametrize("target", [-20.0, -28.0])
def test_every_chime_plays_at_the_loudness_target(target: float) -> None:
    sounds = Sounds(loudness=target)
    for name in CHIMES:
        sound = sounds.find(name)
        assert sound is not None and sound.loudness == target
        chunk = sounds.audio(sound, lambda key: None)
        assert lufs(chunk.samples(), chunk.sample_rate) == pytest.approx(target, abs=1.0), name


def test_without_a_target_a_chime_plays_as_shipped() -> None:
    sounds = Sounds()
    sound = sounds.find("ding")
    assert sound is not None
    shipped = read_wav(DATA / "chime-ding.wav")
    assert sounds.audio(sound, lambda key: None).pcm == shipped.pcm


def test_a_pinned_clip_is_found_by_its_text_in_the_requests_voice_first(store) -> None:
    sounds = Sounds(store)
    assert sounds.find("Mind the gap.", "bundle-1", "carol").key == "k-c"
    assert sounds.find(" Mind the gap. ", "bundle-1", "dave").key == "k-a"  # its bundle's first
    assert sounds.find("Mind the gap.", "bundle-2", "").key == "k-b"
    assert sounds.find("Mind the gap.", "bundle-9", "").key == "k-a"  # any, by key
    assert sounds.find("Not pinned.") is None  # only pinned clips are sounds
    assert sounds.find("mind the gap.") is None  # the text as it is
    assert sounds.names() == [*CHIMES, "Mind the gap."]


def test_a_clip_imported_later_is_found_and_one_gone_is_unknown_clip(store, tmp_path) -> None:
    sounds = Sounds(store)
    assert sounds.find("Battery low.") is None
    pack = tmp_path / "later.db"
    with CacheStore(pack, ttl_s=0) as p:
        p.put_many([clip("k-l", "Battery low.", "bundle-1", "alice", noise(1, 0.3))])
    import_pack(store, pack)
    sound = sounds.find("Battery low.")
    assert sound is not None and sound.key == "k-l"
    store.delete("k-l")
    with pytest.raises(RequestError) as e:
        sounds.audio(sound, store.get)
    assert e.value.code == "unknown_clip"


def test_a_clip_plays_at_the_target_by_its_level_or_measured(store) -> None:
    """A clip made at the target plays as stored; at another level it moves by the difference (its
    voice's one gain, not a measurement of the clip); with no level it is measured."""
    at_20 = noise(1, 0.3, 5)
    store.put_many(
        [
            clip("k-20", "At twenty.", "bundle-1", "alice", at_20, loudness={"lufs": -20.0}),
            clip("k-none", "No level.", "bundle-1", "alice", noise(1, 0.05, 6)),
        ]
    )
    played = Sounds(store, loudness=-20.0)
    assert played.audio(played.find("At twenty."), store.get).pcm == at_20
    quieter = Sounds(store, loudness=-26.0)
    scaled = quieter.audio(quieter.find("At twenty."), store.get).samples()
    original = np.frombuffer(at_20, dtype="<i2")
    assert np.allclose(scaled, original * 10 ** (-6 / 20), atol=1)
    measured = played.audio(played.find("No level."), store.get).samples()
    assert lufs(measured, RATE) == pytest.approx(-20.0, abs=1.0)
