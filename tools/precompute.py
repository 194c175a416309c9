"""``speakd-tools precompute``: fixed prompts → a prompt pack (a cache database of pinned clips).

The pack is made with the same engine the board runs (``speakd.engines.load_engine``) and keyed
with the same ``audio_key`` + default seed, so ``speakd cache import pack.db`` makes every prompt
a hit on the device. Two passes: every worker first computes keys (cheap, no synthesis) so prompts
already in the pack, and duplicates, are skipped; then only the missing clips are synthesised, in
``--jobs`` processes that each load their own engine with ``threads / jobs`` onnxruntime threads,
or with ``--ray ADDRESS`` in the workers of a Ray cluster (``precompute_ray.py``).

Prompts: a text file or TOML (``speakd_tools.prompts``), or the daemon's key-echo set.
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
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from speakd.audio import join_chunks
from speakd.cache.store import CacheError, CacheStore, Clip
from speakd.config import DEFAULT_LUFS
from speakd.engines.base import Engine, EngineError
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

from .prompts import Prompt, PromptError, key_echo_prompts, read_prompts

log = logging.getLogger(__name__)

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
