"""``speakd-tools voice add FILE.onnx``: check a Piper voice and copy it into ``voices.dir``.

The checks are the ones a board would otherwise fail on later: the JSON speakd reads (sample rate,
espeak voice, phoneme map, speakers), every phoneme espeak-ng makes for a test sentence having an
id in the voice's map, and the model loading and speaking that sentence (finite, not silent). With
``--int8`` the voice is also calibrated (``speakd-tools calibrate``) into ``NAME-int8/`` beside it:
a second voice of its own name. A running daemon picks both up on ``systemctl reload speakd``.
"""

from __future__ import annotations

import argparse
import logging
import shutil
import sys
import time
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)

TEST_SENTENCE = "The lift doors are closing. Mind the gap, please."


def add_parser(sub: argparse._SubParsersAction) -> None:
    v = sub.add_parser("voice", help="manage the voices of a board (voices.dir)")
    vs = v.add_subparsers(dest="voice_command", required=True)
    a = vs.add_parser(
        "add", help="check a Piper voice (NAME.onnx + NAME.onnx.json) and copy it into voices.dir"
    )
    a.add_argument("model", help="the voice's .onnx (its .onnx.json beside it)")
    a.add_argument("--dir", help="the voices folder (default: voices.dir of --config)")
    a.add_argument("--config", help="speakd.toml to read voices.dir from (default: speakd's)")
    a.add_argument("--int8", action="store_true", help="also calibrate an int8 copy, NAME-int8")
    a.add_argument("--force", action="store_true", help="replace a voice of the same name")
    a.add_argument("--text", default=TEST_SENTENCE, help="the test sentence")
    a.set_defaults(func=cmd_add)


def cmd_add(args: argparse.Namespace) -> int:
    from speakd.config import load_config
    from speakd.engines.base import EngineError

    model = Path(args.model)
    folder = Path(args.dir) if args.dir else Path(load_config(args.config).voices.dir)
    try:
        report = check_voice(model, args.text)
    except (EngineError, OSError) as e:
        print(f"voice add: {model}: {e}", file=sys.stderr)
        return 1
    for line in report:
        print(line)
    target = folder / model.name
    if target.exists() and not args.force:
        print(f"voice add: {target} exists (use --force to replace it)", file=sys.stderr)
        return 1
    folder.mkdir(parents=True, exist_ok=True)
    for source, name in _voice_files(model):
        shutil.copy2(source, folder / name)
    print(f"copied to {target}")
    if args.int8:
        out = folder / f"{model.stem}-int8"
        if _calibrate(model, out) != 0:
            print("voice add: calibration failed; the float voice is in place", file=sys.stderr)
            return 1
        print(f"calibrated copy: {out} (voice {out.name})")
    print("a running daemon serves it after `systemctl reload speakd` (or SIGHUP)")
    return 0


def _calibrate(model: Path, out: Path) -> int:
    """``speakd-tools calibrate --bundle MODEL --out OUT`` with the recipe's defaults."""
    from speakd_tools.calibrate.cli import add_parser as add_calibrate

    parser = argparse.ArgumentParser(prog="speakd-tools")
    add_calibrate(parser.add_subparsers())
    args = parser.parse_args(["calibrate", "--bundle", str(model), "--out", str(out)])
    return int(args.func(args))


def check_voice(model: Path, text: str = TEST_SENTENCE) -> list[str]:
    """What the voice is and how it spoke the test sentence; EngineError says what is wrong."""
    from speakd.engines.base import EngineError, SynthesisConfig
    from speakd.engines.vits.engine import VitsVoice
    from speakd.engines.vits.text import phonemize

    voice = VitsVoice.from_file(model)
    config = voice.config
    (info,) = voice.voices()
    missing = sorted(
        {
            p
            for sentence in phonemize(config.espeak_voice, text, config.vowel_clusters)
            for p in sentence
            if p not in config.phoneme_id_map
        }
    )
    if missing:
        raise EngineError(
            f"espeak-ng voice {config.espeak_voice!r} makes phonemes the voice has no id for: "
            f"{' '.join(missing)} (a voice for another espeak voice or phoneme set?)"
        )
    t0 = time.monotonic()
    engine = voice.load_model(threads=2)
    loaded = time.monotonic() - t0
    t0 = time.monotonic()
    chunks = list(engine.synthesize(text, SynthesisConfig(seed=0)))
    spoke = time.monotonic() - t0
    samples = np.concatenate([c.samples() for c in chunks]) if chunks else np.zeros(0, np.int16)
    if samples.size == 0 or not np.any(samples):
        raise EngineError("the voice produced no audio for the test sentence")
    seconds = samples.size / voice.sample_rate
    return [
        f"voice {info.name}: {voice.kind}, {info.language}, {voice.sample_rate} Hz, "
        f"espeak {config.espeak_voice}, licence {voice.licence}",
        f"speakers: {', '.join(info.speakers) if info.speakers else 'one'}",
        f"loaded in {loaded:.2f} s; said {seconds:.2f} s of audio in {spoke:.2f} s "
        f"(RTF {spoke / seconds:.2f})",
    ]


def _voice_files(model: Path) -> list[tuple[Path, str]]:
    """(file, name in voices.dir): the model, its JSON, and the MODEL_CARD Piper publishes with
    it (the licence), as ``NAME.MODEL_CARD`` since the folder holds many voices."""
    files = [(model, model.name), (Path(f"{model}.json"), f"{model.name}.json")]
    for card in (model.with_suffix(".MODEL_CARD"), model.parent / "MODEL_CARD"):
        if card.is_file():
            return [*files, (card, f"{model.stem}.MODEL_CARD")]
    return files
