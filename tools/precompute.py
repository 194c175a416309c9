"""``speakd-tools precompute``: fixed prompts → a prompt pack (a cache database of pinned clips).

The pack is made with the same engine the board runs (``speakd.engines.load_engine``) and keyed
with the same ``audio_key`` + default seed, so ``speakd cache import pack.db`` makes every prompt
a hit on the device. Two passes: every worker first computes keys (cheap, no synthesis) so prompts
already in the pack, and duplicates, are skipped; then only the missing clips are synthesised, in
``--jobs`` processes that each load their own engine with ``threads / jobs`` onnxruntime threads,
or with ``--ray ADDRESS`` in the workers of a Ray cluster (``precompute_ray.py``).

Prompts: a text file (one prompt a line; blank lines and ``#`` comments skipped) or TOML::

    voice = "default"            # defaults for every prompt (optional)
    speed = 1.0

    [[prompt]]
    text = "The door is open."
    voice = "en_US-joe-medium"   # per-prompt overrides: voice, speaker, lang, speed, seed, params,
    pitch = 1.2                  # and pitch (semitones, as a request's)
    params = { noise_scale = 0.5 }

TOML rather than YAML: ``tomllib`` is in the standard library, so the tool needs no extra parser.
A prompt whose root is ``<speak>`` is SSML: its runs of text are packed (``_parts``); with
``--lexicon`` the prompts are said as the board's ``[lexicon]`` says them, so the pack still hits.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import logging
import multiprocessing
import os
import sys
import time
import tomllib
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from speakd.audio import join_chunks
from speakd.cache.store import CacheError, CacheStore, Clip
from speakd.config import DEFAULT_LUFS
from speakd.engines.base import Engine, EngineError, SynthesisConfig
from speakd.engines.bundle import BundleError
from speakd.markup.lexicon import Lexicon, LexiconError
from speakd.markup.plan import prepare_request
from speakd.markup.ssml import is_ssml
from speakd.request.breaker import CircuitBreaker, Guard
from speakd.request.messages import SpeakRequest
from speakd.request.prepare import Prepared, Sound, Speech, prepare
from speakd.request.resolver import Resolver
from speakd.request.sounds import Sounds
from speakd.request.stream import Cancel
from speakd.request.voices import VoiceLibrary

log = logging.getLogger(__name__)

PROMPT_FIELDS = {"text", "voice", "speaker", "lang", "speed", "pitch", "seed", "params"}


class PromptError(ValueError):
    """The prompts file is wrong; the message names the file and the prompt."""


@dataclass(frozen=True)
class Prompt:
    text: str
    voice: str | None = None
    speaker: str | None = None  # a multi-speaker voice's speaker (ChatTTS: an embedding)
    lang: str | None = None
    speed: float | None = None
    pitch: float | None = None  # semitones (speakd.audio.pitch), as a request's ``pitch``
    seed: int | None = None
    params: tuple[tuple[str, Any], ...] = ()  # sorted items: hashable, so duplicates collapse

    def config(self) -> SynthesisConfig:
        return SynthesisConfig(
            voice=self.voice,
            speaker=self.speaker,
            speed=self.speed,
            pitch=self.pitch,
            seed=self.seed,
            lang=self.lang,
            extra=dict(self.params),
        )


def read_prompts(path: Path, voice: str | None = None) -> list[Prompt]:
    """Prompts from a text or TOML file; ``voice`` is the default for prompts that name none."""
    try:
        raw = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise PromptError(f"{path}: cannot read the prompts: {e}") from None
    if path.suffix.lower() == ".toml":
        return _toml_prompts(path, raw, voice)
    return [
        Prompt(line.strip(), voice)
        for line in raw.splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]


def _toml_prompts(path: Path, raw: str, voice: str | None) -> list[Prompt]:
    try:
        data = tomllib.loads(raw)
    except tomllib.TOMLDecodeError as e:
        raise PromptError(f"{path}: not valid TOML: {e}") from None
    unknown = set(data) - (PROMPT_FIELDS - {"text"}) - {"prompt"}
    if unknown:
        raise PromptError(f"{path}: unknown top-level key {sorted(unknown)[0]!r}")
    items = data.get("prompt")
    if not isinstance(items, list) or not items:
        raise PromptError(f"{path}: expected [[prompt]] tables with a text each")
    defaults = {k: v for k, v in data.items() if k != "prompt"}
    if voice is not None:
        defaults.setdefault("voice", voice)
    return [_prompt(f"{path}: prompt[{i}]", {**defaults, **item}) for i, item in enumerate(items)]


def key_echo_prompts(voice: str | None = None) -> list[Prompt]:
    """The daemon's key-echo pack (``speakd.frontends.ssip.keys``, at ``[ssip]``'s default rates
    and pitches) as prompts, built from the same request fields: letters, digits and key names.
    Symbols are left to the daemon's own prewarm: it says them by name through its punctuation
    (``speakd.markup.punctuation``), which a prompt has no field for."""
    from speakd.config import SsipConfig
    from speakd.frontends.ssip.keys import pack_fields

    return [
        Prompt(text=f["text"], voice=voice, speed=f.get("speed"), pitch=f.get("pitch"))
        for f in pack_fields(SsipConfig())
        if len(f["text"]) > 1 or f["text"].isalnum()
    ]


def _prompt(where: str, item: Any) -> Prompt:
    if not isinstance(item, dict):
        raise PromptError(f"{where}: expected a table")
    unknown = set(item) - PROMPT_FIELDS
    if unknown:
        raise PromptError(
            f"{where}.{sorted(unknown)[0]}: unknown field"
            f" (known: {', '.join(sorted(PROMPT_FIELDS))})"
        )
    checks: dict[str, tuple[type, ...]] = {
        "text": (str,),
        "voice": (str,),
        "speaker": (str,),
        "lang": (str,),
        "speed": (int, float),
        "pitch": (int, float),
        "seed": (int,),
        "params": (dict,),
    }
    for key, types in checks.items():
        value = item.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, types)):
            raise PromptError(f"{where}.{key}: expected {types[0].__name__}, got {value!r}")
    text = (item.get("text") or "").strip()
    if not text:
        raise PromptError(f"{where}.text: missing or empty")
    speed, pitch = item.get("speed"), item.get("pitch")
    return Prompt(
        text=text,
        voice=item.get("voice"),
        speaker=item.get("speaker"),
        lang=item.get("lang"),
        speed=None if speed is None else float(speed),
        pitch=None if pitch is None else float(pitch),
        seed=item.get("seed"),
        params=tuple(sorted((item.get("params") or {}).items())),
    )


# ---- workers (one engine per process) --------------------------------------------------------

_engine: Engine | None = None
_lexicon = Lexicon()


def _init_worker(factory: Callable[[], Engine], lexicon: Lexicon = _lexicon) -> None:
    global _engine, _lexicon
    logging.basicConfig(level=logging.WARNING)
    _engine, _lexicon = factory(), lexicon


Keyed = list[tuple[Prompt, str]]


def _keys(prompts: list[Prompt]) -> tuple[str, list[Keyed | Exception]]:
    """The bundle id and, for each prompt, the clips it needs with their audio keys (or the error
    that stops it, e.g. bad voice or markup)."""
    assert _engine is not None
    keys: list[Keyed | Exception] = []
    for p in prompts:
        try:
            keys.append([(part, _prepare(_engine, part).key) for part in _parts(p)])
        except Exception as e:
            keys.append(e)
    return _engine.bundle_id, keys


def _parts(p: Prompt) -> list[Prompt]:
    """A prompt as the runs of text the daemon caches for it, each a plain prompt keyed as the
    daemon keys it (``speakd.markup.plan``): the text after the lexicon, and an SSML prompt (root
    ``<speak>``) cut into its runs."""
    assert _engine is not None
    if not is_ssml(p.text) and not _lexicon.languages:
        return [p]
    library = VoiceLibrary.of(_engine, DEFAULT_LUFS)
    prepared = prepare_request(
        library, p.text, p.config(), ssml=is_ssml(p.text), lexicon=_lexicon, sounds=_EverySound()
    )
    runs = [s.prepared for s in prepared.parts if isinstance(s, Speech)]
    return [
        dataclasses.replace(
            p, text=r.text, voice=r.config.voice, lang=r.config.lang, speed=r.config.speed
        )
        for r in (runs if prepared.parts else [prepared])
    ]


class _EverySound(Sounds):
    """An ``<audio src>`` is the board's sound (docs/ssml.md): its content is not packed."""

    def find(self, name: str, bundle: str = "", voice: str = "") -> Sound:
        return Sound(name, name)


def synthesize_batch(engine: Engine, prompts: Sequence[Prompt]) -> list[Clip | Exception]:
    """One clip per prompt. A batching engine (``concurrent_synthesis``: ChatTTS with
    ``batch_size`` > 1) gets every prompt at once, one thread each, and decodes them in shared
    steps (docs/chattts-engine.md, "Batched decoding"); the clips are the same as one by one."""
    if getattr(engine, "concurrent_synthesis", False) and len(prompts) > 1:
        with ThreadPoolExecutor(len(prompts), thread_name_prefix="precompute") as pool:
            return list(pool.map(functools.partial(_clip, engine), prompts))
    return [_clip(engine, p) for p in prompts]


# A host may be slow or busy, and a pack is made offline: a prompt may take up to this long
# between two chunks before its engine counts as hung, and no speed is a failure (the daemon's
# 30 s and RTF 3 are for a board answering people; with a loaded host they failed a
# full-size ChatTTS pack's first sentences).
OFFLINE_HANG_TIMEOUT_S = 600.0


def _guard() -> Guard:
    return Guard(CircuitBreaker(), hang_timeout_s=OFFLINE_HANG_TIMEOUT_S, max_rtf=float("inf"))


def _clip(engine: Engine, p: Prompt) -> Clip | Exception:
    try:
        prepared = _prepare(engine, p)
        request = SpeakRequest(text=p.text, config=p.config(), prepared=prepared)
        audio = join_chunks(Resolver(engine, guard=_guard()).stream(request, Cancel()))
        if audio is None:
            raise ValueError("the engine produced no audio")
        return Clip(
            key=prepared.key,
            text=p.text,
            voice=prepared.config.voice or engine.default_voice(),
            params={**prepared.params, "seed": prepared.config.seed},
            bundle=engine.bundle_id,
            sample_rate=audio.sample_rate,
            audio=audio.pcm,
            words=audio.words,
            pinned=True,
        )
    except Exception as e:
        return e


def _prepare(engine: Engine, p: Prompt) -> Prepared:
    """A prompt prepared as the daemon prepares it, normalised to audio.loudness_lufs's default
    (``speakd.request.loudness``): a board with another level needs a pack made at it."""
    return prepare(engine, p.text, p.config(), loudness=DEFAULT_LUFS)


def _synthesize(prompts: list[Prompt]) -> list[Clip | Exception]:
    assert _engine is not None
    return synthesize_batch(_engine, prompts)


class _InProcess(Executor):
    """jobs = 1: the same worker functions, no child process."""

    def __init__(self, factory: Callable[[], Engine], lexicon: Lexicon) -> None:
        _init_worker(factory, lexicon)

    def map(self, fn: Callable[..., Any], *iterables: Any, **_: Any) -> Iterator[Any]:  # type: ignore[override]
        return map(fn, *iterables)


# ---- the run ------------------------------------------------------------------------------------


@dataclass
class Report:
    prompts: int = 0
    duplicates: int = 0
    existing: int = 0
    synthesized: int = 0
    failed: list[tuple[str, str]] = field(default_factory=list)  # (text, error)
    audio_s: float = 0.0
    wall_s: float = 0.0
    synth_s: float = 0.0
    bundle: str = ""
    pack_clips: int = 0
    pack_bytes: int = 0

    @property
    def clips_per_s(self) -> float:
        return self.synthesized / self.synth_s if self.synth_s > 0 else 0.0

    def table(self) -> str:
        rows = [
            ("bundle", self.bundle),
            ("prompts", str(self.prompts)),
            ("duplicates", str(self.duplicates)),
            ("already in pack", str(self.existing)),
            ("synthesized", str(self.synthesized)),
            ("failed", str(len(self.failed))),
            ("audio made", f"{self.audio_s:.1f} s"),
            ("pack", f"{self.pack_clips} clips, {self.pack_bytes / 1e6:.2f} MB"),
            ("synthesis time", f"{self.synth_s:.1f} s"),
            ("throughput", f"{self.clips_per_s:.2f} clips/s" if self.synthesized else "-"),
            ("realtime factor", f"{self.audio_s / self.synth_s:.1f}x" if self.synthesized else "-"),
            ("wall time", f"{self.wall_s:.1f} s"),
        ]
        width = max(len(k) for k, _ in rows)
        lines = [f"{k:<{width}}  {v}" for k, v in rows]
        lines += [f"FAILED {text[:50]!r}: {err}" for text, err in self.failed]
        return "\n".join(lines)


def _chunks(items: Sequence[Any], size: int) -> list[list[Any]]:
    return [list(items[i : i + size]) for i in range(0, len(items), size)]


def precompute(
    prompts: Sequence[Prompt],
    out: Path,
    engine_factory: Callable[[], Engine],
    *,
    jobs: int = 1,
    batch_size: int = 1,
    progress: bool = True,
    ray_address: str | None = None,
    lexicon: Lexicon = _lexicon,
) -> Report:
    """Synthesise every prompt not yet in ``out`` and store it pinned; idempotent.

    ``ray_address`` ("local" or a cluster's address) runs the workers on Ray, ``jobs`` of them
    (0 = one per CPU of the cluster); the pack gets the same rows as without. ``lexicon`` is
    applied to every prompt as the daemon's ``[lexicon]`` applies it."""
    from tqdm import tqdm

    t0 = time.monotonic()
    report = Report(prompts=len(prompts))
    unique = list(dict.fromkeys(prompts))
    report.duplicates = len(prompts) - len(unique)
    pool: Executor
    if ray_address is not None:
        from speakd_tools.precompute_ray import RayPool

        pool = RayPool(ray_address, jobs, _init_worker, (engine_factory, lexicon))
        jobs = pool.workers
    elif jobs == 1:
        pool = _InProcess(engine_factory, lexicon)
    else:
        pool = ProcessPoolExecutor(
            jobs,
            mp_context=multiprocessing.get_context("spawn"),
            initializer=_init_worker,
            initargs=(engine_factory, lexicon),
        )
    with CacheStore(out, max_bytes=1 << 62, ttl_s=0, recover=False) as store, pool:
        existing = store.keys()
        todo: dict[str, Prompt] = {}
        key_batches = _chunks(unique, max(1, -(-len(unique) // (4 * jobs))))
        for batch, (bundle, keys) in zip(key_batches, pool.map(_keys, key_batches), strict=True):
            report.bundle = bundle
            for prompt, keyed in zip(batch, keys, strict=True):
                if isinstance(keyed, Exception):
                    report.failed.append((prompt.text, str(keyed)))
                    continue
                for part, key in keyed:
                    if key in existing:
                        report.existing += 1
                    elif key in todo:
                        report.duplicates += 1  # other spelling, same audio (e.g. whitespace)
                    else:
                        todo[key] = part
        if report.bundle:
            store.set_meta("pack_bundle", report.bundle)
        t1 = time.monotonic()
        batches = _chunks(list(todo.values()), batch_size)
        with tqdm(total=len(todo), unit="clip", disable=not progress, file=sys.stderr) as bar:
            for batch, results in zip(batches, pool.map(_synthesize, batches), strict=True):
                clips = []
                for prompt, result in zip(batch, results, strict=True):
                    if isinstance(result, Exception):
                        report.failed.append((prompt.text, str(result)))
                    else:
                        clips.append(result)
                        report.audio_s += result.duration
                report.synthesized += store.put_many(clips)
                bar.update(len(batch))
        report.synth_s = time.monotonic() - t1
        stats = store.stats()
        report.pack_clips, report.pack_bytes = stats["clips"], stats["bytes"]
    report.wall_s = time.monotonic() - t0
    return report


# ---- command line -------------------------------------------------------------------------


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "prompts", type=Path, nargs="?", help="text file (one prompt a line) or .toml list"
    )
    p.add_argument(
        "--key-echo",
        action="store_true",
        help="add the daemon's key-echo pack: letters, digits and key names at Orca's pitches "
        "(docs/screen-readers.md)",
    )
    p.add_argument("--bundle", type=Path, help="model bundle (default: the embedded VITS voice)")
    p.add_argument("--out", type=Path, required=True, help="prompt pack to create or extend")
    p.add_argument("--voice", help="voice for prompts that do not name one")
    p.add_argument(
        "--jobs",
        type=int,
        default=None,
        help="worker processes (default 1; with --ray: one per CPU of the cluster)",
    )
    p.add_argument(
        "--threads",
        type=int,
        default=os.cpu_count() or 1,
        help="onnxruntime threads in total, split between the jobs (default: all cores; "
        "with --ray each worker holds one CPU and runs one thread)",
    )
    p.add_argument(
        "--ray",
        metavar="ADDRESS",
        help="run the workers on a Ray cluster: 'local' starts one on this host, else the "
        "cluster's address (ray://HEAD:10001 or HEAD:6379)",
    )
    p.add_argument(
        "--batch-size",
        type=int,
        default=8,
        help="prompts per engine call; a batching engine (ChatTTS, engine.batch_size) decodes "
        "them in shared steps (default 8)",
    )
    p.add_argument(
        "--lexicon",
        action="append",
        default=[],
        metavar="FILE",
        help="a pronunciation lexicon, as the board's [lexicon] files (repeat for each language)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    """The subcommand: exit 0 all stored, 1 some prompts failed, 2 bad input."""
    try:
        return _run(args)
    except (PromptError, BundleError, CacheError, LexiconError) as e:
        print(f"speakd-tools precompute: {e}", file=sys.stderr)
        return 2
    except EngineError as e:
        print(f"speakd-tools precompute: {e}", file=sys.stderr)
        return 1


def _run(args: argparse.Namespace) -> int:
    from speakd.engines import load_engine
    from speakd.library.synth import engine_config_for

    jobs = 1 if args.jobs is None and not args.ray else args.jobs or 0  # 0: Ray decides
    if (args.jobs is not None and args.jobs < 1) or args.batch_size < 1 or args.threads < 1:
        raise PromptError("--jobs, --threads and --batch-size must be at least 1")
    prompts = read_prompts(args.prompts, args.voice) if args.prompts else []
    if args.key_echo:
        prompts += key_echo_prompts(args.voice)
    if not prompts:
        raise PromptError("nothing to precompute: give a prompts file, --key-echo or both")
    threads = 1 if args.ray else max(1, args.threads // jobs)
    # ChatTTS decodes the --batch-size prompts of one call in as many rows, unpaced:
    # nobody listens to a pack as it is made, so throughput is all that counts
    engine_config = dataclasses.replace(
        engine_config_for(args.bundle, threads), batch_size=min(args.batch_size, 32), paced=False
    )
    factory = functools.partial(load_engine, engine_config)
    report = precompute(
        prompts,
        args.out,
        factory,
        jobs=jobs,
        batch_size=args.batch_size,
        progress=not args.no_progress,
        ray_address=args.ray,
        lexicon=Lexicon.load(args.lexicon),
    )
    print(report.table())
    return 1 if report.failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="speakd-tools precompute", description=__doc__)
    add_arguments(parser)
    logging.basicConfig(level=logging.WARNING)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
