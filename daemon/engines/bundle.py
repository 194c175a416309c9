"""Model bundles: a folder with ``manifest.json`` and the files it hashes.

The daemon verifies every file's sha256 before a session sees it and refuses a bundle that does
not match, naming the file, so a corrupt or tampered model never reaches onnxruntime.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
FORMAT = "speakd-bundle"
FORMAT_VERSION = 1
INT8_SUFFIX = "-int8"  # a calibrated sibling: models/chattts-int8 beside models/chattts


class BundleError(Exception):
    """The bundle cannot be used; the message names the file and says what is wrong."""


def sha256_file(path: Path, block: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(block):
            h.update(chunk)
    return h.hexdigest()


@dataclass(frozen=True)
class Bundle:
    path: Path
    manifest: dict[str, Any]

    @property
    def engine(self) -> str:
        return self.manifest["engine"]

    @property
    def precision(self) -> str:
        return self.manifest.get("precision", "fp32")

    @property
    def bundle_id(self) -> str:
        """Stable id of the model bytes: the hash of the (sorted) file hashes."""
        files = self.manifest["files"]
        digest = hashlib.sha256(
            json.dumps({k: v["sha256"] for k, v in sorted(files.items())}).encode()
        ).hexdigest()
        return f"{self.manifest.get('name', self.path.name)}-{digest[:16]}"

    def file(self, name: str) -> Path:
        if name not in self.manifest["files"]:
            raise BundleError(f"{self.path / MANIFEST}: no file {name!r} listed")
        return self.path / name


def load_bundle(path: Path | str, verify: bool = True) -> Bundle:
    path = Path(path)
    manifest_path = path / MANIFEST
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise BundleError(f"{manifest_path}: missing (is {path} a speakd bundle?)") from None
    except (OSError, ValueError) as e:
        raise BundleError(f"{manifest_path}: unreadable: {e}") from e
    if manifest.get("format") != FORMAT:
        raise BundleError(f"{manifest_path}: not a {FORMAT} manifest")
    if manifest.get("format_version") != FORMAT_VERSION:
        raise BundleError(
            f"{manifest_path}: format_version {manifest.get('format_version')!r}, "
            f"this speakd reads {FORMAT_VERSION}"
        )
    if not isinstance(manifest.get("files"), dict) or "engine" not in manifest:
        raise BundleError(f"{manifest_path}: needs 'engine' and 'files'")
    bundle = Bundle(path, manifest)
    if verify:
        verify_bundle(bundle)
    return bundle


def verify_bundle(bundle: Bundle) -> None:
    for name, entry in sorted(bundle.manifest["files"].items()):
        f = bundle.path / name
        if not f.is_file():
            raise BundleError(f"{f}: listed in the manifest but missing")
        if entry.get("bytes") is not None and f.stat().st_size != entry["bytes"]:
            raise BundleError(
                f"{f}: size {f.stat().st_size} bytes, manifest says {entry['bytes']} "
                "(truncated or replaced file)"
            )
        actual = sha256_file(f)
        if actual != entry["sha256"]:
            raise BundleError(
                f"{f}: sha256 {actual[:12]}… does not match the manifest's "
                f"{entry['sha256'][:12]}… (corrupt or tampered file)"
            )
    log.debug("bundle %s: %d files verified", bundle.path, len(bundle.manifest["files"]))


def file_entry(path: Path) -> dict[str, Any]:
    """Manifest entry for a file written by the host tools."""
    return {"sha256": sha256_file(path), "bytes": path.stat().st_size}
