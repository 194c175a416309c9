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
    signing_key = "private key from `speakd-tools fleet keygen` (NAME.key)"
    p.add_argument("--sign", type=Path, metavar="KEY", default=None, help=f"sign it: {signing_key}")
    _add_version(p)
    p.set_defaults(func=cmd_publish)

    p = pack.add_parser(
        "sign", help="write a pack's signed manifest, for `speakd cache import` by hand"
    )
    _add_version(p)
    p.add_argument("pack", type=Path, help="prompt pack made by `speakd-tools precompute`")
    p.add_argument("--key", type=Path, required=True, help=signing_key)
    p.add_argument("--site", required=True, help="the site it is for (as with pack publish)")
    p.add_argument("--prefix", default="speakd", help="the boards' [mqtt] prefix")
    p.add_argument("--out", type=Path, default=None, help="default PACK.manifest.json")
    p.set_defaults(func=cmd_sign)

    fleet = sub.add_parser("fleet", help="every board's state over MQTT").add_subparsers(
        dest="fleet_command", required=True, metavar="ACTION"
    )
    s = fleet.add_parser("status", parents=[broker], help="one row per board (retained topics)")
    s.add_argument("--json", action="store_true", help="a JSON list instead of the table")
    s.set_defaults(func=cmd_status)
    k = fleet.add_parser("keygen", help="an Ed25519 key pair for signing packs (NAME.key, .pub)")
    k.add_argument("name", type=Path, help="writes NAME.key (private, 0600) and NAME.pub")
    k.set_defaults(func=cmd_keygen)


def _add_version(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--version",
        type=int,
        default=None,
        help="the signed version; must grow per site (default: now in milliseconds)",
    )


def cmd_publish(args: argparse.Namespace) -> int:
    from speakd.cache.trust import load_private
    from speakd_tools.fleet.broker import BrokerError, Session, broker_config
    from speakd_tools.fleet.publish import (
        DEFAULT_CHUNK_BYTES,
        PackError,
        publish_pack,
        read_pack,
        sign_manifest,
    )

    try:
        manifest, chunks = read_pack(
            args.pack, args.prefix, args.site, args.chunk_bytes or DEFAULT_CHUNK_BYTES
        )
        if args.sign is not None:
            manifest = sign_manifest(manifest, load_private(args.sign), args.version)
    except (PackError, CacheError, ValueError) as e:
        print(f"speakd-tools pack publish: {e}", file=sys.stderr)
        return EXIT_USAGE
    try:
        with Session(broker_config(args.broker, args.ca_file), args.timeout) as session:
            done = publish_pack(session, manifest, chunks)
    except BrokerError as e:
        print(f"speakd-tools pack publish: {e}", file=sys.stderr)
        return EXIT_FAILED
    signed = f", signed version {manifest.version}" if manifest.signature else ""
    print(
        f"pack {manifest.pack_id}{signed} ({manifest.name}: {manifest.clips} clips,"
        f" {manifest.size} bytes,"
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


def cmd_sign(args: argparse.Namespace) -> int:
    import json

    from speakd.cache.trust import load_private
    from speakd_tools.fleet.publish import PackError, read_pack, sign_manifest

    out = args.out or args.pack.with_name(args.pack.name + ".manifest.json")
    try:
        manifest, _ = read_pack(args.pack, args.prefix, args.site)
        manifest = sign_manifest(manifest, load_private(args.key), args.version)
    except (PackError, CacheError, ValueError) as e:
        print(f"speakd-tools pack sign: {e}", file=sys.stderr)
        return EXIT_USAGE
    out.write_text(json.dumps({**manifest.to_dict(), "site": manifest.site}, indent=2) + "\n")
    print(f"signed pack {manifest.pack_id} for site {args.site}, version {manifest.version}: {out}")
    return 0


def cmd_keygen(args: argparse.Namespace) -> int:
    from speakd.cache.trust import generate

    try:
        public = generate(args.name)
    except (OSError, FileExistsError) as e:
        print(f"speakd-tools fleet keygen: {e}", file=sys.stderr)
        return EXIT_FAILED
    print(f"wrote {args.name.with_suffix('.key')} (keep it off the boards) and its public key:")
    print(public)
    print(f'boards trust it with:  [fleet] trusted_keys = ["{public}"]')
    return 0
