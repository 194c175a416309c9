"""speakd: run the daemon, talk to it, or synthesize one file without it.

Each command calls one library function and turns its exceptions into a message and an exit code
(0 ok, 1 the request failed, 2 bad usage or configuration).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from speakd import __version__
from speakd.config import ConfigError
from speakd.engines.base import EngineError
from speakd.engines.bundle import BundleError
from speakd.library.client import Client, ClientError
from speakd.machine import logcontext
from speakd.paths import UnsafePath, close_own_dirs, private_umask
from speakd.request.errors import RequestError

EXIT_FAILED, EXIT_USAGE = 1, 2


def _socket_path(args: argparse.Namespace) -> str:
    """The daemon the user runs (``speakd.library.find``: the user's own, else the system's)."""
    from speakd.library.find import daemon_socket

    return daemon_socket(args.socket, args.config)


def _text(value: str) -> str:
    return sys.stdin.read() if value == "-" else value


def cmd_serve(args: argparse.Namespace) -> int:
    from speakd.lifecycle.service import serve
    from speakd.machine.memory import bound_heap

    bound_heap()
    private_umask()  # before any file: the cache, the journal, SQLite's -wal, onnxruntime's
    for path in close_own_dirs():
        logging.getLogger(__name__).warning("%s was open to other users: now 0700", path)
    return serve(args.config)


def _param(value: str) -> tuple[str, Any]:
    """``--param NAME=VALUE``: the value is read as JSON (0.3, true), else kept as a string."""
    name, sep, raw = value.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {value!r}")
    try:
        return name, json.loads(raw)
    except json.JSONDecodeError:
        return name, raw


def _add_request_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--voice", help="voice name (see `speakd voices`)")
    p.add_argument("--speaker", help="a speaker of a multi-speaker voice, by name or id")
    p.add_argument("--lang", help="language, e.g. en or zh (picks a voice that speaks it)")
    p.add_argument("--speed", type=float, help="speaking rate, 1.0 = normal")
    p.add_argument(
        "--pitch", type=float, help="pitch change in semitones, -12..12 (0 = the voice's own)"
    )
    p.add_argument("--seed", type=int, help="sampling seed (default: derived from the request)")
    p.add_argument(
        "--param",
        dest="params",
        type=_param,
        action="append",
        metavar="NAME=VALUE",
        help="an engine option (see `speakd voices`), e.g. --param temperature=0.3",
    )


def cmd_say(args: argparse.Namespace) -> int:
    fields: dict[str, Any] = {"text": _text(args.text), "priority": args.priority}
    keys = ("voice", "speaker", "lang", "speed", "pitch", "volume", "id", "seed")
    for key in (*keys, "punctuation", "chime"):
        if getattr(args, key) is not None:
            fields[key] = getattr(args, key)
    if args.params:
        fields["params"] = dict(args.params)
    if args.cache_only:
        fields["cache_only"] = True
    if args.explain:
        return _explain(args, fields)
    if args.output:
        return _fetch(args, fields)
    timeout = None if args.wait else 30.0
    with Client(_socket_path(args), timeout=timeout) as client:
        for event in client.say(fields, wait=args.wait):
            if args.json:
                print(json.dumps(event, ensure_ascii=False), flush=True)
            if event["event"] in ("warning", "error"):
                print(f"speakd: {event['code']}: {event['message']}", file=sys.stderr)
            if event["event"] == "error":
                return EXIT_FAILED
            if event["event"] == "finished" and event.get("status") != "done":
                print(f"speakd: request {event['id']} {event['status']}", file=sys.stderr)
                return EXIT_FAILED
    return 0


def _explain(args: argparse.Namespace, fields: dict[str, Any]) -> int:
    """``say --explain``: the text as each voice will read it (the socket's ``explain`` op)."""
    with Client(_socket_path(args)) as client:
        reply = client.request({"op": "explain", **fields})
    if args.json or reply["event"] == "error":
        print(json.dumps(reply, ensure_ascii=False))
        return EXIT_FAILED if reply["event"] == "error" else 0
    for part in reply["parts"]:
        if "silence_ms" in part:
            print(f"(silence {part['silence_ms']} ms)")
        elif "mark" in part:
            print(f"(mark {part['mark']})")
        elif "sound" in part:
            print(f"(sound {part['sound']})")
        else:
            how = f"{part['voice']}, {part['lang'] or '-'}, speed {part['speed']:g}"
            volume = f", volume {part['volume']:g}" if part["volume"] != 1.0 else ""
            pitch = f", pitch {part['pitch']:+g} st" if part["pitch"] else ""
            print(f"[{how}{pitch}{volume}] {part['reads']}")
    return 0


def _fetch(args: argparse.Namespace, fields: dict[str, Any]) -> int:
    """``say --output FILE``: the socket's ``synth`` op, the audio written to a WAV file."""
    from speakd.audio import write_wav

    with Client(_socket_path(args), timeout=None) as client:
        audio, event = client.synth(fields)
    if args.json:
        print(json.dumps(event, ensure_ascii=False))
    if event["event"] == "error":
        print(f"speakd: {event['code']}: {event['message']}", file=sys.stderr)
        return EXIT_FAILED
    if audio is None:
        print("speakd: no audio came back", file=sys.stderr)
        return EXIT_FAILED
    write_wav(Path(args.output), audio)
    print(f"{args.output}: {audio.duration:.2f} s of audio", file=sys.stderr)
    return 0


def _simple(op: str) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        message: dict[str, object] = {"op": op}
        if getattr(args, "request_id", None):
            message["id"] = args.request_id
        with Client(_socket_path(args)) as client:
            reply = client.request(message)
        print(
            json.dumps(reply, indent=2 if op in ("status", "voices") else None, ensure_ascii=False)
        )
        return EXIT_FAILED if reply.get("event") == "error" else 0

    return run


def cmd_synth(args: argparse.Namespace) -> int:
    from speakd.library.synth import synthesize_to_wav

    seconds = synthesize_to_wav(
        _text(args.text),
        Path(args.output),
        bundle=Path(args.bundle) if args.bundle else None,
        voice=args.voice,
        speaker=args.speaker,
        speed=args.speed,
        pitch=args.pitch,
        seed=args.seed,
        lang=args.lang,
        params=args.params,
        threads=args.threads,
    )
    print(f"{args.output}: {seconds:.2f} s of audio", file=sys.stderr)
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    from speakd.lifecycle.doctor import run_doctor

    return 0 if run_doctor(args.config, args.socket) else EXIT_FAILED


def cmd_cache(args: argparse.Namespace) -> int:
    from speakd.lifecycle.daemon_config import load_daemon_config

    config = load_daemon_config(args.config)  # the cache of the daemon this user runs
    if args.cache_command == "key-echo":  # a daemon's parts, not the cache's: lifecycle/
        from speakd.lifecycle.keyecho import build

        done = build(config, args.out)
        print(f"key-echo pack {args.out}: {done.made + done.found} clips")
        return 0
    from speakd.cache.cli import run

    private_umask()  # a cache it creates is as private as the daemon's
    return run(args, config)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="speakd", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"speakd {__version__}")
    parser.add_argument(
        "--log-level",
        default=os.environ.get("SPEAKD_LOG_LEVEL", "INFO"),
        help="DEBUG, INFO, WARNING… (default INFO, or $SPEAKD_LOG_LEVEL)",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(
        name: str, func: Callable[[argparse.Namespace], int], help: str
    ) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help, description=help)
        p.add_argument(
            "--config",
            type=Path,
            default=None,
            help="config file (default /etc/speakd/speakd.toml if present)",
        )
        p.set_defaults(func=func)
        return p

    command("serve", cmd_serve, "run the daemon in the foreground")

    p = command("say", cmd_say, "speak text through the running daemon")
    p.add_argument("text", help="what to say ('-' reads standard input)")
    p.add_argument("--wait", action="store_true", help="return when the audio has finished")
    p.add_argument(
        "--priority", default="text", help="important, message, text (default), notification"
    )
    _add_request_arguments(p)
    p.add_argument("--volume", type=float, help="gain, 1.0 = unchanged")
    p.add_argument(
        "--cache-only", action="store_true", help="play only from the cache (error not_cached)"
    )
    p.add_argument("-o", "--output", help="write the audio to this WAV file instead of playing it")
    p.add_argument(
        "--punctuation",
        metavar="LEVEL",
        help="say symbols by name: none (default), some, most or all, as speech-dispatcher",
    )
    p.add_argument(
        "--chime",
        metavar="NAME",
        help="a sound before the text: ding, ding-dong, attention or a pinned clip's text",
    )
    p.add_argument(
        "--explain",
        action="store_true",
        help="print the text as each voice would read it (markup, lexicon, punctuation)",
    )
    p.add_argument("--id", help="request id (default: generated)")
    p.add_argument("--json", action="store_true", help="print every event as JSON")

    command("stop", _simple("stop"), "stop speaking and clear the queue")
    p = command("cancel", _simple("cancel"), "cancel one request (or the current one)")
    p.add_argument("request_id", nargs="?", help="request id (default: the current request)")
    command("status", _simple("status"), "print the daemon's status as JSON")
    command("voices", _simple("voices"), "list the voices, their languages and the options")

    p = command("synth", cmd_synth, "synthesize text to a WAV file without the daemon")
    p.add_argument("text", help="what to say ('-' reads standard input)")
    p.add_argument("-o", "--output", required=True, help="WAV file to write")
    p.add_argument("--bundle", help="model bundle folder (default: the embedded voice)")
    _add_request_arguments(p)
    p.add_argument("--threads", type=int, default=2, help="onnxruntime threads (default 2)")

    command("doctor", cmd_doctor, "check config, model, audio device, socket and broker")

    from speakd.cache.cli import add_arguments as cache_arguments

    cache_arguments(command("cache", cmd_cache, "manage the audio cache and prompt packs"))

    for p in sub.choices.values():
        if "--socket" not in p._option_string_actions:
            p.add_argument(
                "--socket",
                help="JSON socket path (default: your own daemon's if it runs, else the config's)",
            )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logcontext.install()  # before any record is made: LOG_FORMAT needs %(request)s
    logging.basicConfig(
        level=args.log_level.upper(), format=logcontext.LOG_FORMAT, stream=sys.stderr
    )
    try:
        return args.func(args)
    except (ConfigError, BundleError, RequestError, UnsafePath) as e:  # a request out of range…
        print(f"speakd: {e}", file=sys.stderr)
        return EXIT_USAGE
    except (ClientError, EngineError) as e:
        print(f"speakd: {e}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        return 130
