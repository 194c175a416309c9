"""``speakd-tools pack publish`` and ``speakd-tools fleet status`` (docs/fleet.md)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from speakd.cache.store import CacheError

EXIT_FAILED, EXIT_USAGE = 1, 2


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    broker = argparse.ArgumentParser(add_help=False)
    broker.add_argument(
        "--broker",
        required=True,
        help="mqtt://[USER@]HOST[:PORT] or mqtts://… (password from $SPEAKD_MQTT_PASSWORD)",
    )
    broker.add_argument("--ca-file", default="", help="CA for mqtts:// (default: system CAs)")
    broker.add_argument("--prefix", default="speakd", help="the boards' [mqtt] prefix")
    broker.add_argument(
        "--timeout", type=float, default=30.0, help="seconds to wait for the broker (default 30)"
    )

    pack = sub.add_parser("pack", help="prompt packs over MQTT").add_subparsers(
        dest="pack_command", required=True, metavar="ACTION"
    )
    p = pack.add_parser(
        "publish",
        parents=[broker],
        help="roll a pack out to every board acting on a site (retained, late boards included)",
    )
    p.add_argument("pack", type=Path, help="prompt pack made by `speakd-tools precompute`")
    p.add_argument("--site", required=True, help="a board's site_id, or a group in its site_ids")
    p.add_argument("--chunk-bytes", type=int, default=None, help="chunk size (default 256 KiB)")
    p.set_defaults(func=cmd_publish)

    fleet = sub.add_parser("fleet", help="every board's state over MQTT").add_subparsers(
        dest="fleet_command", required=True, metavar="ACTION"
    )
    s = fleet.add_parser("status", parents=[broker], help="one row per board (retained topics)")
    s.add_argument("--json", action="store_true", help="a JSON list instead of the table")
    s.set_defaults(func=cmd_status)


def cmd_publish(args: argparse.Namespace) -> int:
    from speakd_tools.fleet.broker import BrokerError, Session, broker_config
    from speakd_tools.fleet.publish import DEFAULT_CHUNK_BYTES, PackError, publish_pack, read_pack

    try:
        manifest, chunks = read_pack(
            args.pack, args.prefix, args.site, args.chunk_bytes or DEFAULT_CHUNK_BYTES
        )
    except (PackError, CacheError) as e:
        print(f"speakd-tools pack publish: {e}", file=sys.stderr)
        return EXIT_USAGE
    try:
        with Session(broker_config(args.broker, args.ca_file), args.timeout) as session:
            done = publish_pack(session, manifest, chunks)
    except BrokerError as e:
        print(f"speakd-tools pack publish: {e}", file=sys.stderr)
        return EXIT_FAILED
    print(
        f"pack {manifest.pack_id} ({manifest.name}: {manifest.clips} clips, {manifest.size} bytes,"
        f" bundles {', '.join(manifest.bundles)}) published to {manifest.topic()}"
        f" in {len(chunks)} chunks"
    )
    if done.replaced:
        print(f"replaced pack {done.replaced}; cleared its {done.cleared} retained chunks")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    from speakd_tools.fleet.broker import BrokerError, Session, broker_config
    from speakd_tools.fleet.status import fleet_status, table, to_json

    try:
        with Session(broker_config(args.broker, args.ca_file), args.timeout) as session:
            rows = fleet_status(session, args.prefix)
    except BrokerError as e:
        print(f"speakd-tools fleet status: {e}", file=sys.stderr)
        return EXIT_FAILED
    print(to_json(rows) if args.json else table(rows))
    return 0
