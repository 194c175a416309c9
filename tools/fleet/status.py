"""``speakd-tools fleet status --broker URL``: one row per board, from its retained topics.

Every board keeps ``<prefix>/<site>/availability``, ``/status`` (``Control.status()`` plus
version and last_error) and ``/pack`` retained at the broker (speakd/frontends/mqtt/frontend.py),
so a snapshot of the retained messages is the fleet's state, boards that are down included.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass
from typing import Any

from speakd_tools.fleet.broker import Session

log = logging.getLogger(__name__)

KINDS = ("status", "availability", "pack")


@dataclass
class SiteRow:
    site: str
    online: bool | None = None  # None: the board never published its availability
    version: str | None = None
    engine: str | None = None
    bundle: str | None = None
    pack: str | None = None  # the pack the last pack status was about
    pack_state: str | None = None
    installed: dict[str, str] | None = None  # site → the pack the board holds for it
    cache_bytes: int | None = None
    hits: int | None = None
    misses: int | None = None
    last_error: str | None = None


def fleet_status(session: Session, prefix: str = "speakd") -> list[SiteRow]:
    """One row per site with any retained state, sorted by site."""
    by_site: dict[str, dict[str, bytes]] = {}
    for msg in session.retained([f"{prefix}/+/{kind}" for kind in KINDS]):
        site, _, kind = msg.topic[len(prefix) + 1 :].partition("/")
        if msg.payload:  # an empty retained message is a deleted one
            by_site.setdefault(site, {})[kind] = bytes(msg.payload)
    return [_row(site, found) for site, found in sorted(by_site.items())]


def _row(site: str, found: dict[str, bytes]) -> SiteRow:
    row = SiteRow(site)
    if "availability" in found:
        row.online = found["availability"] == b"online"
    status, pack = _json(site, found.get("status")), _json(site, found.get("pack"))
    engine = status.get("engine") or {}
    cache = (status.get("source") or {}).get("cache") or {}
    row.version = status.get("version")
    row.engine, row.bundle = engine.get("kind"), engine.get("bundle")
    row.hits, row.misses = cache.get("hits"), cache.get("misses")
    row.pack, row.pack_state = pack.get("pack_id"), pack.get("state")
    row.installed = pack.get("installed")
    row.cache_bytes = pack.get("cache_bytes", cache.get("bytes"))
    if pack.get("state") == "error":
        row.last_error = f"pack {pack.get('pack_id')}: {pack.get('reason')}"
    elif error := status.get("last_error"):
        row.last_error = f"{error.get('code')}: {error.get('message')}"
    return row


def _json(site: str, payload: bytes | None) -> dict[str, Any]:
    if payload is None:
        return {}
    try:
        obj = json.loads(payload)
    except (UnicodeDecodeError, ValueError):
        log.warning("site %s: unreadable retained JSON %r", site, payload[:80])
        return {}
    return obj if isinstance(obj, dict) else {}


def to_json(rows: list[SiteRow]) -> str:
    return json.dumps([asdict(r) for r in rows], indent=2, ensure_ascii=False)


def table(rows: list[SiteRow]) -> str:
    """A fixed-width table; ``-`` where a board never said."""

    def cell(value: Any) -> str:
        if value is None:
            return "-"
        if isinstance(value, bool):
            return "yes" if value else "no"
        return str(value)

    header = (
        *("site", "online", "version", "engine", "bundle", "pack", "state", "hits", "misses"),
        *("cache_mb", "packs"),
    )
    lines = [
        (
            *(r.site, r.online, r.version, r.engine, r.bundle, r.pack, r.pack_state),
            *(r.hits, r.misses, _mb(r.cache_bytes), _packs(r.installed)),
        )
        for r in rows
    ]
    cells = [list(header), *[[cell(v) for v in line] for line in lines]]
    widths = [max(len(c[i]) for c in cells) for i in range(len(header))]
    out = [
        "  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip() for line in cells
    ]
    out += [f"{r.site}: last error: {r.last_error}" for r in rows if r.last_error]
    return "\n".join(out)


def _mb(size: int | None) -> str | None:
    return None if size is None else f"{size / 1e6:.1f}"


def _packs(installed: dict[str, str] | None) -> str | None:
    """``site=pack id`` for each site the board holds a pack for."""
    return ",".join(f"{s}={p}" for s, p in sorted(installed.items())) if installed else None
