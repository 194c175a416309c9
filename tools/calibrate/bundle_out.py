"""Writing the calibrated bundle's manifest: every file re-hashed
(``speakd.engines.bundle.file_entry``), precision, recipe, corpus hash and the report; the manifest
is written last so a half-written bundle never looks valid."""

from __future__ import annotations

import json
import shutil
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from speakd.engines.bundle import FORMAT, FORMAT_VERSION, MANIFEST, file_entry

REPORT_DIR = "report"


def prepare_out(out: Path, src: Path | None = None) -> None:
    """Create ``out``; refuse to write into the source bundle; drop a stale manifest first."""
    if src is not None and out.resolve() == src.resolve():
        from .errors import CalibrationError

        raise CalibrationError(f"{out}: --out must differ from the float bundle")
    out.mkdir(parents=True, exist_ok=True)
    (out / MANIFEST).unlink(missing_ok=True)


def write_manifest(out: Path, base: dict[str, Any], files: list[str], **fields: Any) -> dict:
    """``base`` (the float bundle's manifest or a fresh one) updated with ``fields``."""
    manifest = {
        **base,
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "name": out.name,
        "created": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        **fields,
        "files": {f: file_entry(out / f) for f in files},
    }
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n")
    return manifest


def copy_into(src: Path, out: Path, names: list[str]) -> None:
    for name in names:
        shutil.copyfile(src / name, out / name)
