"""The ``bench`` command of ``speakd-tools``: one subcommand per bench module, each found in its
sub-package through ``GROUPS``.

A bare ``speakd-tools bench`` is an error that lists the subcommands: each benchmark measures
something different, and none is the obvious default.
"""

from __future__ import annotations

import argparse
import importlib
import json
from collections.abc import Callable
from typing import Any

# subcommand → one-line help, in the order ``speakd-tools bench --help`` lists them
BENCHMARKS = {
    "chattts": "ChatTTS torch vs speakd fp32/int8/int4: GPT step, RTF, peak RSS, start-up, cache",
    "engine": "speakd's ChatTTS engine vs ChatTTS's torch pipeline, one bundle, same steps",
    "batch": "batched ChatTTS decoding: throughput at B rows, a long text batched vs sequential",
    "streams": "the daemon under N concurrent Wyoming/HTTP/socket streams: first audio, gaps, RSS",
    "step": "the GPT decode step at 1/2/4/8 rows per precision: floor, FLOPs, kernel, invariance",
    "cache": "precompute throughput, and a cached say → first sample at the sink (real daemon)",
    "fleet": "a signed pack to N simulated boards on one mosquitto: time to 50/99/100 %, broker",
    "mqtt": "MQTT say → first sample at the sink (needs a running broker)",
    "vits": "VITS engine: load, RTF, first audio streamed by window vs one-shot, their SNR",
    "floor": "a new text's first audio in a Piper voice by part: ms, GFLOP, the fp32 floor",
    "profile": "where the ChatTTS step's time goes: node types, ORT profile, threads, machine",
    "wyoming": "Wyoming first-chunk latency, cached and new sentences, next to wyoming-piper",
    "http": "HTTP API: a cached /v1/audio/speech, p50/p99 alone and requests/s under load",
    "page": "a cached hit's p99 with the page open on a 20 000-clip cache, and without it",
    "voices": "many voices: RSS with 1, 2, 3 loaded, cold vs warm first audio, LRU at limit 1",
    "ssml": "SSML parser: a document, and the refusal of a billion laughs, a blowup, deep nesting",
    "memory": "daemon RSS at READY, after a warm-up and after N mixed socket requests",
    "values": "daemon RSS over N socket says, each with a pitch, speed and volume not sent before",
    "words": "Piper word timings against faster-whisper's word timestamps on the same audio",
    "cancel": "SSIP CANCEL → 703 CANCELED p50/p99 on the realtime null and WAV sinks",
    "journal": "CANCEL → 703 with and without MQTT says journaled at 20/s; an fsync's cost",
    "pitch": "pitch shifting (Rubber Band): first-chunk cost and ms per audio second, 3 texts",
    "screenreader": "Orca's SSIP traffic on speakd and Speech Dispatcher: key echo, cancel, marks",
    "wer": "Whisper tiny.en WER of the embedded voice on the English corpus, at given pitches",
}

# sub-package → its benches, each a module named for its subcommand
GROUPS = {
    "engine": ("chattts", "engine", "batch", "step", "vits", "floor", "profile", "pitch"),
    "frontends": (
        "streams",
        "cache",
        "mqtt",
        "wyoming",
        "http",
        "page",
        "ssml",
        "cancel",
        "journal",
    ),
    "memory": ("voices", "memory", "values"),
    "screenreader": ("screenreader",),
    "quality": ("words", "wer"),
    "fleet": ("fleet",),
}
MODULES = {name: f"{group}.{name}" for group, names in GROUPS.items() for name in names}


def _printed(module: Any) -> Callable[[argparse.Namespace], int]:
    """A bench's run as ``measure(args)`` then ``table(result)``, or JSON with ``--json``: one
    piece of code for every module that defines no ``run`` of its own."""

    def run(args: argparse.Namespace) -> int:
        result = module.measure(args)
        print(json.dumps(result, indent=2) if args.json else module.table(result))
        return 0

    return run


def add_parser(sub: Any) -> None:
    """Add ``bench`` and its subcommands to ``speakd-tools``' subparsers."""
    bench = sub.add_parser("bench", help="benchmarks: " + ", ".join(BENCHMARKS))
    names = bench.add_subparsers(dest="benchmark", required=True)
    for name, summary in BENCHMARKS.items():
        module = importlib.import_module(f"{__package__}.{MODULES[name]}")
        p = names.add_parser(
            name,
            help=summary.replace("%", "%%"),  # argparse formats help with %
            description=module.__doc__,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        module.add_arguments(p)
        p.set_defaults(func=getattr(module, "run", None) or _printed(module))
