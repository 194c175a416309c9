"""``speakd-tools precompute``: prompt files, keys that match the daemon's, pinned clips,
idempotence, parallel workers and the summary — on the tone engine and real SQLite."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import pytest

from speakd.cache.store import CacheStore
from speakd.config import DEFAULT_LUFS
from speakd.engines.base import SynthesisConfig
from speakd.markup.lexicon import Lexicon
from speakd.markup.plan import prepare_request
from speakd.request.loudness import record
from speakd.request.messages import SpeakRequest
from speakd.request.resolver import Resolver
from speakd.request.voices import VoiceLibrary
from speakd_tools.precompute import Prompt, PromptError, precompute, read_prompts
from tests.tone_engine import ToneEngine

TOML = """
voice = "high"

[[prompt]]
text = "Front door open."

[[prompt]]
text = "Back door open."
voice = "low"
speaker = "bert"
speed = 2
seed = 5
"""


def test_text_prompts_skip_blanks_and_comments(tmp_path: Path) -> None:
    f = tmp_path / "p.txt"
    f.write_text("# header\nHello there.\n\n  Second one.  \n#x\n")
    assert read_prompts(f) == [Prompt("Hello there."), Prompt("Second one.")]
    assert read_prompts(f, voice="high")[0].voice == "high"


def test_toml_prompts_with_defaults_and_overrides(tmp_path: Path) -> None:
    f = tmp_path / "p.toml"
    f.write_text(TOML)
    assert read_prompts(f, voice="ignored-when-file-says") == [
        Prompt("Front door open.", voice="high"),
        Prompt("Back door open.", voice="low", speaker="bert", speed=2.0, seed=5),
    ]
    assert read_prompts(f)[1].config().speaker == "bert"  # prepared as the daemon prepares it


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ('[[prompt]]\ntext = ""\n', r"prompt\[0\]\.text: missing or empty"),
        ('[[prompt]]\ntext = "a"\n[[prompt]]\ntxt = "b"\n', r"prompt\[1\]\.txt: unknown field"),
        ('[[prompt]]\ntext = "a"\nspeed = "fast"\n', r"prompt\[0\]\.speed: expected int"),
        ('[[prompt]]\ntext = "a"\nseed = true\n', r"prompt\[0\]\.seed: expected int"),
        ('title = "x"\n', r"unknown top-level key 'title'"),
        ("voice = \n", "not valid TOML"),
        ('voice = "x"\n', r"expected \[\[prompt\]\] tables"),
    ],
)
def test_bad_toml_names_the_prompt_and_field(tmp_path: Path, body: str, message: str) -> None:
    f = tmp_path / "p.toml"
    f.write_text(body)
    with pytest.raises(PromptError, match=message):
        read_prompts(f)


def test_pack_keys_match_the_daemon_and_reruns_are_idempotent(tmp_path: Path) -> None:
    engine = ToneEngine()
    f = tmp_path / "p.toml"
    f.write_text(TOML)
    prompts = [*read_prompts(f), Prompt("one two"), Prompt("one  two"), Prompt("one two")]
    pack = tmp_path / "pack.db"
    report = precompute(prompts, pack, lambda: engine, progress=False)
    assert report.synthesized == 3 and report.duplicates == 2 and report.failed == []
    assert report.bundle == "tone-1" and report.pack_clips == 3
    assert "synthesized" in report.table() and "clips/s" in report.table()
    with CacheStore(pack) as store:
        clips = list(store.clips())
    assert all(c.pinned and c.expires is None and c.bundle == "tone-1" for c in clips)
    # the daemon, asked with cache_only, finds every prompt: the keys are the same
    source = Resolver(VoiceLibrary.of(engine, DEFAULT_LUFS), CacheStore(pack))  # as the daemon
    engine.calls.clear()
    for text, voice, speed, seed in [
        ("Front door open.", "high", None, None),
        ("Back door open.", "low", 2.0, 5),
        ("one two", None, None, None),
    ]:
        req = SpeakRequest(text, cache_only=True)
        req.config = type(req.config)(voice=voice, speed=speed, seed=seed)
        assert b"".join(c.pcm for c in source.stream(req, threading.Event()))
    assert engine.calls == [] and source.counters["hits"] == 3
    source.close()
    # a second run synthesises nothing
    again = precompute(prompts, pack, lambda: engine, progress=False)
    assert again.synthesized == 0 and again.existing + again.duplicates == 5
    assert engine.calls == []


def test_parallel_workers_make_the_same_pack(tmp_path: Path) -> None:
    prompts = [Prompt(f"prompt number {i} " + "word " * (i % 4)) for i in range(12)]
    serial = precompute(prompts, tmp_path / "serial.db", ToneEngine, progress=False)
    parallel = precompute(prompts, tmp_path / "parallel.db", ToneEngine, jobs=2, progress=False)
    assert serial.synthesized == parallel.synthesized == 12
    with CacheStore(tmp_path / "serial.db") as a, CacheStore(tmp_path / "parallel.db") as b:
        assert {c.key: c.audio for c in a.clips()} == {c.key: c.audio for c in b.clips()}


def test_failed_prompts_are_reported_and_the_rest_stored(tmp_path: Path) -> None:
    prompts = [Prompt("fine words"), Prompt("this will FAIL"), Prompt("more fine words")]
    report = precompute(prompts, tmp_path / "pack.db", ToneEngine, progress=False)
    assert report.synthesized == 2
    assert report.failed == [("this will FAIL", "the tone engine was asked to fail")]
    assert "FAILED 'this will FAIL'" in report.table()


def test_cli_subcommand_reports_bad_input(tmp_path: Path, capsys) -> None:
    from speakd_tools.cli import main

    bad = tmp_path / "p.toml"
    bad.write_text('[[prompt]]\ntext = "a"\nvoice = 3\n')
    assert main(["precompute", str(bad), "--out", str(tmp_path / "o.db")]) == 2
    assert "prompt[0].voice: expected str" in capsys.readouterr().err
    assert not (tmp_path / "o.db").exists()


def test_an_ssml_prompt_packs_the_runs_the_daemon_plays(tmp_path: Path) -> None:
    """The daemon caches a marked-up request's runs of text, each keyed as plain text: the pack
    holds those, and the whole request then plays from it with cache_only."""
    engine = ToneEngine()
    ssml = '<speak>Front door <break time="300ms"/> open. <voice name="high">Now</voice></speak>'
    pack = tmp_path / "pack.db"
    report = precompute([Prompt(ssml)], pack, lambda: engine, progress=False)
    assert report.synthesized == 3 and report.failed == []
    source = Resolver(VoiceLibrary.of(engine, DEFAULT_LUFS), CacheStore(pack))  # as the daemon
    engine.calls.clear()
    prepared = prepare_request(source.voices, ssml, SynthesisConfig(), ssml=True)
    request = SpeakRequest(ssml, cache_only=True, prepared=prepared)
    audio = b"".join(c.pcm for c in source.stream(request, threading.Event()))
    assert engine.calls == [] and source.counters["hits"] == 3
    assert bytes(2 * 300 * engine.sample_rate // 1000) in audio  # the break, between hits
    source.close()


def test_an_audio_element_packs_the_text_around_it_not_its_content(tmp_path: Path) -> None:
    """Its sound (a pinned clip, say) is the board's; its content is said only without one."""
    pack = tmp_path / "pack.db"
    ssml = '<speak>Front door <audio src="Door chime.">ding dong</audio> open.</speak>'
    report = precompute([Prompt(ssml)], pack, lambda: ToneEngine(), progress=False)
    assert report.failed == []
    with CacheStore(pack) as store:
        assert sorted(c.text for c in store.clips()) == ["Front door", "open."]


def test_a_lexicon_packs_the_prompts_as_the_board_says_them(tmp_path: Path) -> None:
    engine = ToneEngine()
    (tmp_path / "en.toml").write_text('lang = "en"\n[replace]\n"nginx" = "engine x"\n')
    lexicon = Lexicon.load([tmp_path / "en.toml"])
    pack = tmp_path / "pack.db"
    precompute(
        [Prompt("Restart nginx.", lang="en")], pack, lambda: engine, progress=False, lexicon=lexicon
    )
    with CacheStore(pack) as store:
        assert [c.text for c in store.clips()] == ["Restart engine x."]
    source = Resolver(VoiceLibrary.of(engine, DEFAULT_LUFS), CacheStore(pack))  # as the daemon
    config = SynthesisConfig(lang="en")
    prepared = prepare_request(source.voices, "Restart nginx.", config, lexicon=lexicon)
    request = SpeakRequest("Restart nginx.", config=config, cache_only=True, prepared=prepared)
    assert b"".join(c.pcm for c in source.stream(request, threading.Event()))
    source.close()


def test_a_slow_host_is_not_a_hung_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    """A pack is made offline: 2 s before the first chunk (a busy host, a full-size model) is
    slow, not hung; the same wait past precompute's own limit is a failed prompt, not a
    stalled run."""
    import speakd_tools.precompute as pc

    engine = ToneEngine(compute_s=2.0)
    engine.loudness_record = record(engine, -20.0)  # no calibration text said at 2 s a word
    [clip] = pc.synthesize_batch(engine, [Prompt("Slow but sure.")])
    assert not isinstance(clip, Exception) and clip.audio
    monkeypatch.setattr(pc, "OFFLINE_HANG_TIMEOUT_S", 1.0)
    [failed] = pc.synthesize_batch(engine, [Prompt("Slow but sure.")])
    assert isinstance(failed, Exception) and "no audio for 1 s" in str(failed)


# A synthesis given up on, still inside onnxruntime when the command's work is done: a daemon
# thread looping over a MatMul session (seconds per run) as the command returns 0.
BUSY_AT_EXIT = """
import threading
import numpy as np, onnxruntime as ort
from onnx import TensorProto, helper
x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1500, 1500])
y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1500, 1500])
names = ["x", *(f"t{i}" for i in range(1, 30)), "y"]
nodes = [helper.make_node("MatMul", [names[i], "x"], [names[i + 1]]) for i in range(30)]
graph = helper.make_graph(nodes, "busy", [x], [y])
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
feed = {"x": np.full((1500, 1500), 1e-3, np.float32)}
running = threading.Event()
def loop():
    running.set()  # the next call is the run the command exits under (seconds long)
    while True:
        session.run(None, feed)
threading.Thread(target=loop, daemon=True).start()
running.wait()
import speakd_tools.cli as cli
cli.main = lambda argv=None: 0
cli.console()
"""


def test_the_command_exits_cleanly_while_a_given_up_synthesis_is_inside_onnxruntime() -> None:
    """Interpreter teardown under a running onnxruntime session aborts the process (exit 134,
    "terminate called without an active exception") in about one exit of three; the command
    leaves the way the daemon does instead, with the code its work earned."""
    for _ in range(5):
        r = subprocess.run([sys.executable, "-c", BUSY_AT_EXIT], capture_output=True, text=True)
        assert r.returncode == 0 and "terminate called" not in r.stderr, r.stderr[-2000:]
        assert "exiting without waiting for busy threads" in r.stderr
