"""``speakd cache import PACK | export OUT | ls | stats | prune | verify | key-echo OUT``.

The commands open the cache file directly (``cache.path`` from the config, or ``--db PATH``), so
they work with or without the daemon running; SQLite's locking keeps the two apart. Clips imported
while the daemon runs are hits at once (from SQLite); ``systemctl reload speakd`` also prewarms
them into RAM.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from speakd.config import CacheConfig, Config

if TYPE_CHECKING:  # the store pulls in sqlite-utils and numpy: not at `speakd stop` start-up
    from speakd.cache.store import CacheStore

EXIT_FAILED, EXIT_USAGE = 1, 2


def add_arguments(parser: argparse.ArgumentParser) -> None:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--db", type=Path, default=argparse.SUPPRESS, help="cache file (default: cache.path)"
    )
    # SUPPRESS: a value given before the subcommand is not overwritten by this default.
    common.add_argument("--config", type=Path, default=argparse.SUPPRESS, help="config file")
    parser.add_argument("--db", type=Path, default=None, help="cache file (default: cache.path)")
    sub = parser.add_subparsers(dest="cache_command", required=True, metavar="ACTION")

    def action(name: str, help: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=help, description=help, parents=[common])

    p = action("import", "merge a prompt pack's clips into the cache (pinned; existing kept)")
    p.add_argument("pack", type=Path, help="prompt pack made by `speakd-tools precompute`")
    p.add_argument(
        "--manifest",
        type=Path,
        default=None,
        help="its signed manifest (`speakd-tools pack sign`; default PACK.manifest.json)",
    )
    p = action("export", "write the pinned clips (or all, --all) to a new prompt pack")
    p.add_argument("out", type=Path, help="pack file to create")
    p.add_argument("--all", action="store_true", help="unpinned clips too (exported pinned)")
    p = action("ls", "list the cached clips, most recently used first")
    p.add_argument("--pinned", action="store_true", help="only pinned clips")
    p.add_argument("--json", action="store_true", help="one JSON object per clip")
    action("stats", "clip count, bytes, pinned, hits, expired")
    action("prune", "drop expired clips, then evict least recently used down to max_bytes")
    action("verify", "PRAGMA integrity_check plus a check of every clip; exit 1 if damaged")
    p = action(
        "key-echo",
        "make the key-echo pack for the config's [engine] and embedded voices (not voices.dir) "
        "into a new file, to ship read-only as cache.shipped_pack",
    )
    p.add_argument("out", type=Path, help="pack file to create")


def _open(args: argparse.Namespace, config: CacheConfig, create: bool = False) -> CacheStore:
    from speakd.cache.store import CacheError, CacheStore

    path = args.db or Path(config.path)
    if not create and not path.exists():
        raise CacheError(f"{path}: no cache database here (set cache.path or pass --db)")
    return CacheStore(
        path,
        max_bytes=config.max_bytes,
        ttl_s=config.ttl_s,
        ttl_jitter=config.ttl_jitter,
        recover=False,  # a tool reports damage; only the daemon moves files aside
    )


def run(args: argparse.Namespace, config: Config) -> int:
    """``config``: what the daemon this user runs serves with (``speakd.cli`` reads it), so that
    a desktop user's command opens their own daemon's cache, not the system service's."""
    from speakd.cache.store import CacheError
    from speakd.cache.trust import TrustError

    try:
        return _run(args, config)
    except CacheError as e:
        print(f"speakd cache: {e}", file=sys.stderr)
        return EXIT_FAILED
    except TrustError as e:
        print(f"speakd cache: refused: {e}", file=sys.stderr)
        return EXIT_FAILED


def _run(args: argparse.Namespace, config: Config) -> int:
    from speakd.cache.packs import export_pack, import_by_hand
    from speakd.cache.trust import Trust
    from speakd.cache.versions import PackVersions

    command = args.cache_command
    with _open(args, config.cache, create=command == "import") as store:
        if command == "import":
            versions = PackVersions.in_state_dir(config.state.dir)  # the daemon's record
            try:
                done = import_by_hand(
                    store,
                    args.pack,
                    args.manifest,
                    Trust(tuple(config.fleet.trusted_keys)),
                    versions,
                )
            finally:
                versions.close()
                _keep_owners([store.path, Path(versions.path)])
            print(f"imported {done.added} of {done.clips} clips from {args.pack} into {store.path}")
        elif command == "export":
            n = export_pack(store, args.out, args.all)
            print(f"exported {n} clips to {args.out}")
        elif command == "ls":
            _ls(store, args.pinned, args.json)
        elif command == "stats":
            print(json.dumps(store.stats(), indent=2))
        elif command == "prune":
            result = store.prune()
            print(f"removed {result['expired']} expired and {result['evicted']} evicted clips")
        elif command == "verify":
            problems = store.integrity_check()
            for line in problems:
                print(line)
            if problems:
                return EXIT_FAILED
            print(f"{store.path}: ok ({store.stats()['clips']} clips)")
    return 0


def _keep_owners(databases: list[Path]) -> None:
    """Run as root (``sudo speakd cache import``), a database file this command made, and what
    SQLite made beside it, takes the owner of the directory it is in (the service's
    ``/var/cache/speakd``, ``/var/lib/speakd``): left root's, the daemon could not write it (a
    root-owned ``pack-versions.db`` refuses every signed pack). SQLite itself gives a ``-wal`` or
    ``-shm`` the owner of an existing database."""
    from speakd.cache.schema import database_files

    if os.geteuid() != 0:
        return
    for path in (f for db in databases for f in database_files(db) if f.exists()):
        folder = path.parent.stat()
        if path.stat().st_uid == 0 and folder.st_uid != 0:
            os.chown(path, folder.st_uid, folder.st_gid)


def _ls(store: CacheStore, pinned: bool, as_json: bool) -> None:
    rows = store.listing(pinned_only=pinned)
    if as_json:
        for row in rows:
            print(json.dumps({**row, "params": json.loads(row["params"])}, ensure_ascii=False))
        return
    print(f"{'key':12}  {'pin':3}  {'sec':>5}  {'bytes':>8}  {'hits':>5}  {'voice':16}  text")
    for r in rows:
        print(
            f"{r['key'][:12]}  {'yes' if r['pinned'] else '':3}  {r['duration']:5.2f}  "
            f"{r['bytes']:8d}  {r['hits']:5d}  {r['voice'][:16]:16}  {r['text'][:60]}"
        )
