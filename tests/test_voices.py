"""The voice library: every voice of every engine side by side, chosen by one rule, loaded when
first used and unloaded least-recently-used, with cached clips that play with the voice unloaded.

Voices here: the embedded Piper voice (22 050 Hz), a tiny generated two-speaker Piper voice and
the tiny random-weight ChatTTS bundle (24 000 Hz) — real files in a real ``voices.dir``.
"""

from __future__ import annotations

import shutil
import threading
from pathlib import Path

import numpy as np
import pytest

from speakd.audio import join_chunks
from speakd.cache.store import CacheStore
from speakd.config import ConfigError, load_config
from speakd.engines.base import SynthesisConfig
from speakd.request.errors import InputWarning, RequestError
from speakd.request.messages import SpeakRequest
from speakd.request.resolver import Resolver
from speakd.request.stream import Cancel
from speakd.request.voices import VoiceLibrary, build_library
from tests.tiny_voices import tiny_multispeaker_voice

PIPER = "en_US-joe-medium"
DUO = "xx_XX-duo-low"


def config_for(tmp_path: Path, voices: str = "", limits: str = ""):
    path = tmp_path / "speakd.toml"
    path.write_text(
        f'[voices]\ndir = "{tmp_path / "voices"}"\n{voices}\n[limits]\n{limits}\n'
        f'[cache]\npath = "{tmp_path / "cache.db"}"\n'
    )
    return load_config(path)


@pytest.fixture
def voices_dir(tmp_path: Path, tiny_bundle: Path) -> Path:
    folder = tmp_path / "voices"
    folder.mkdir()
    tiny_multispeaker_voice(folder, DUO)
    shutil.copytree(tiny_bundle, folder / "chattts-tiny")
    return folder


def test_every_voice_of_every_engine_is_listed_with_its_facts(
    tmp_path: Path, voices_dir: Path
) -> None:
    library = build_library(config_for(tmp_path))
    listed = {v["name"]: v for v in library.listing()}
    assert list(listed) == [PIPER, "chattts-tiny", DUO]  # the default first, then by folder
    assert listed[PIPER]["default"] and listed[PIPER]["licence"] == "CC0"
    assert listed["chattts-tiny"]["engine"] == "chattts"
    assert listed["chattts-tiny"]["sample_rate"] == 24000
    assert "CC BY-NC 4.0" in listed["chattts-tiny"]["licence"]
    assert listed["chattts-tiny"]["speakers"][0] == "default"
    assert listed[DUO]["speakers"] == ["anna", "bert"]
    assert listed[DUO]["sample_rate"] == 22050
    assert not any(v["loaded"] for v in listed.values())  # nothing loads until it is used


def test_one_rule_chooses_by_name_then_language_then_default(
    tmp_path: Path, voices_dir: Path
) -> None:
    library = build_library(config_for(tmp_path))
    assert library.select(None, None)[1] == PIPER
    assert library.select(None, "zh")[1:] == ("chattts-tiny", "zh")  # the only one speaking it
    assert library.select(None, "en-GB")[1:] == (PIPER, "en_US")  # the default speaks it
    assert library.select(DUO, None)[1] == DUO
    assert library.select("default", None)[1] == PIPER
    by_lang = build_library(config_for(tmp_path, 'by_lang = { en = "chattts-tiny" }'))
    assert by_lang.select(None, "en")[1:] == ("chattts-tiny", "en")
    assert by_lang.select(PIPER, "en")[1] == PIPER  # a named voice wins over by_lang
    with pytest.raises(RequestError) as e:
        library.select("nobody", None)
    assert e.value.code == "unknown_voice" and DUO in str(e.value)
    with pytest.raises(RequestError) as e:
        library.select(None, "fr")
    assert e.value.code == "unknown_language"


def test_a_speaker_a_voice_lacks_falls_back_to_its_default_speaker(
    tmp_path: Path, voices_dir: Path
) -> None:
    """Home Assistant sends speaker "0" (or the voice's name) to a single-speaker voice: its one
    speaker, silently. Any other speaker the voice lacks: its default one, with a warning."""
    library = build_library(config_for(tmp_path))
    duo, piper = library.by_name[DUO], library.by_name[PIPER]
    assert library.speaker(duo, DUO, "bert") == ("bert", None)
    assert library.speaker(duo, DUO, "1") == ("1", None)
    assert library.speaker(duo, DUO, None) == (None, None)
    for speaker in ("0", PIPER, ""):
        assert library.speaker(piper, PIPER, speaker) == (None, None)
    for voice, name in ((duo, DUO), (piper, PIPER)):
        spoken, warning = library.speaker(voice, name, "carl")
        assert spoken is None and warning is not None and warning.code == "unknown_speaker"
    assert "anna (0), bert (1)" in warning_of(library.speaker(duo, DUO, "carl"))
    assert "spoken by anna" in warning_of(library.speaker(duo, DUO, "carl"))


def test_voices_default_speaker_speaks_the_default_voice_when_none_is_named(
    tmp_path: Path, voices_dir: Path
) -> None:
    """The add-on's speaker option: a request naming no speaker gets it, on the default voice
    only; a speaker the voice lacks is a config error naming the ones it has."""
    library = build_library(config_for(tmp_path, f'default = "{DUO}"\ndefault_speaker = "bert"'))
    duo = library.by_name[DUO]
    assert library.speaker(duo, DUO, None) == ("bert", None)
    assert library.speaker(duo, DUO, "") == ("bert", None)
    assert library.speaker(duo, DUO, "anna") == ("anna", None)
    assert library.speaker(library.by_name[PIPER], PIPER, None) == (None, None)
    with pytest.raises(ConfigError, match=r"no speaker 'carl'.*anna, bert"):
        build_library(config_for(tmp_path, f'default = "{DUO}"\ndefault_speaker = "carl"'))


def warning_of(choice: tuple[str | None, InputWarning | None]) -> str:
    assert choice[1] is not None
    return choice[1].message


def test_each_voice_speaks_at_its_own_rate_and_speakers_differ(
    tmp_path: Path, voices_dir: Path
) -> None:
    resolver = Resolver(build_library(config_for(tmp_path)))

    def audio(**fields):
        config = SynthesisConfig(**fields)
        prepared = resolver.voices.prepare("Hello there.", config)
        request = SpeakRequest(text="Hello there.", config=config, prepared=prepared)
        return join_chunks(resolver.stream(request, Cancel()))

    assert audio(lang="zh").sample_rate == 24000
    assert audio(lang="en").sample_rate == 22050
    anna, bert = audio(voice=DUO, speaker="anna"), audio(voice=DUO, speaker="1")
    assert anna.pcm != bert.pcm


def test_a_name_clash_is_a_config_error_naming_both_files(tmp_path: Path, voices_dir: Path) -> None:
    sub = tmp_path / "elsewhere"
    sub.mkdir()
    clash = tiny_multispeaker_voice(sub, PIPER)  # the embedded voice's name
    shutil.copy(clash, voices_dir / clash.name)
    shutil.copy(clash.with_suffix(".onnx.json"), voices_dir / f"{clash.name}.json")
    with pytest.raises(ConfigError, match=rf"two voices named '{PIPER}'.*{voices_dir}"):
        build_library(config_for(tmp_path))


def test_a_broken_voice_is_named_and_the_others_are_served(
    tmp_path: Path, voices_dir: Path
) -> None:
    (voices_dir / "broken.onnx").write_bytes(b"not a model")
    (voices_dir / "broken.onnx.json").write_text("{not json")
    library = build_library(config_for(tmp_path))
    (problem,) = library.problems
    assert problem.source.endswith("broken.onnx") and "not a Piper voice config" in problem.error
    assert DUO in library.by_name and "chattts-tiny" in library.by_name
    assert library.status()["problems"][0]["source"] == problem.source


def test_least_recently_used_idle_voice_is_unloaded_never_a_busy_one(
    tmp_path: Path, voices_dir: Path
) -> None:
    library = build_library(config_for(tmp_path, limits="max_loaded_voices = 1"))
    piper, duo = library.by_name[PIPER], library.by_name[DUO]
    library.load(PIPER)
    library.load(DUO)
    assert (piper.engine, duo.engine is not None) == (None, True)
    # A voice mid-synthesis stays loaded while another loads; the limit holds again after.
    holding, release = threading.Event(), threading.Event()

    def synthesizing() -> None:
        with library.using(duo.model.bundle_id):
            holding.set()
            release.wait(30)

    worker = threading.Thread(target=synthesizing)
    worker.start()
    assert holding.wait(30)
    library.load(PIPER)
    assert piper.engine is not None and duo.engine is not None  # over budget, duo is busy
    release.set()
    worker.join(30)
    library.load("chattts-tiny")
    loaded = [name for name, v in library.by_name.items() if v.engine is not None]
    assert loaded == ["chattts-tiny"]
    assert library.status()["voices"][PIPER]["loads"] == 2


def test_a_cached_clip_plays_with_its_voice_unloaded(tmp_path: Path, voices_dir: Path) -> None:
    library = build_library(config_for(tmp_path, limits="max_loaded_voices = 1"))
    store = CacheStore(tmp_path / "cache.db")
    resolver = Resolver(library, store)
    config = SynthesisConfig(voice=DUO)

    def request() -> SpeakRequest:
        return SpeakRequest(text="Lift doors closing.", config=config)

    first = join_chunks(resolver.stream(request(), Cancel()))
    library.load(PIPER)  # duo is unloaded to make room
    assert library.by_name[DUO].engine is None
    again = resolver.open(request())
    try:
        assert again.from_cache and join_chunks(again.chunks).pcm == first.pcm
    finally:
        again.release()
    assert library.by_name[DUO].engine is None
    resolver.close()


def test_a_loaded_engine_alone_is_a_library() -> None:
    from tests.tone_engine import ToneEngine

    library = VoiceLibrary.of(ToneEngine())
    assert [v["name"] for v in library.listing()] == ["low", "high"]
    assert library.select(None, "en")[1] == "low"


def test_voice_add_checks_a_piper_voice_and_copies_it(tmp_path: Path) -> None:
    import json

    from speakd_tools.cli import main as tools

    (tmp_path / "made").mkdir()
    made = tiny_multispeaker_voice(tmp_path / "made", DUO)
    folder = tmp_path / "voices"
    assert tools(["voice", "add", str(made), "--dir", str(folder)]) == 0
    assert sorted(p.name for p in folder.iterdir()) == [f"{DUO}.onnx", f"{DUO}.onnx.json"]
    assert tools(["voice", "add", str(made), "--dir", str(folder)]) == 1  # no silent replace
    # A voice whose phoneme map does not fit its espeak voice is refused before it is copied.
    config = json.loads(Path(f"{made}.json").read_text())
    del config["phoneme_id_map"]["ð"]  # "The …": espeak makes a phoneme the map lacks
    wrong = tmp_path / "wrong" / "xx_XX-wrong-low.onnx"
    wrong.parent.mkdir()
    shutil.copy(made, wrong)
    Path(f"{wrong}.json").write_text(json.dumps(config))
    assert tools(["voice", "add", str(wrong), "--dir", str(folder)]) == 1
    assert not (folder / wrong.name).exists()


def test_doctor_lists_every_voice_with_its_licence_and_names_a_broken_one(
    tmp_path: Path, voices_dir: Path
) -> None:
    from speakd.lifecycle.doctor import _check_voices

    (voices_dir / "broken.onnx").write_bytes(b"junk")
    (voices_dir / "broken.onnx.json").write_text("{")
    ok, detail = _check_voices(config_for(tmp_path))
    assert ok == "warn"
    assert f"{PIPER} (vits, fp32, 22050 Hz, licence CC0) default" in detail
    assert "chattts-tiny (chattts, fp32, 24000 Hz, licence CC BY-NC 4.0" in detail
    assert "non-commercial use only" in detail
    assert "left out: " in detail and "broken.onnx" in detail


def longest_silence(pcm: np.ndarray) -> int:
    """The longest run of zero samples."""
    edges = np.diff(np.concatenate(([0], (pcm == 0).astype(np.int8), [0])))
    starts, ends = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
    return int((ends - starts).max(initial=0))


def test_audio_sentence_silence_ms_is_said_between_sentences_and_keyed(tmp_path: Path) -> None:
    """A Piper voice's ``sentence_silence`` defaults to audio.sentence_silence_ms: the zeros
    are between the sentences, and the key differs from the same text without them."""
    text = "Doors open. Mind the gap."

    def said(audio: str) -> tuple[str, np.ndarray]:
        path = tmp_path / "speakd.toml"
        path.write_text(f'[voices]\ndir = "{tmp_path / "none"}"\n[audio]\n{audio}\n')
        resolver = Resolver(build_library(load_config(path)))
        prepared = resolver.voices.prepare(text, SynthesisConfig())
        request = SpeakRequest(text=text, config=SynthesisConfig(), prepared=prepared)
        chunk = join_chunks(resolver.stream(request, Cancel()))
        assert chunk is not None
        return prepared.key, chunk.samples()

    plain_key, plain = said("")
    key, spaced = said("sentence_silence_ms = 400")
    assert key != plain_key
    assert longest_silence(spaced) >= 0.4 * 22050 > longest_silence(plain)
