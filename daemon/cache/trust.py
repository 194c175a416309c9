"""Who may make a board's prompt packs: Ed25519 signatures over a pack's manifest.

The manifest names the file's sha256 and every chunk's, so signing it signs the pack. What is
signed is the manifest as a JSON object without its ``signature`` field, with the site it is for
(``site``) and a ``version`` that only grows per site, in canonical form (sorted keys, no spaces):
a pack signed for one site fails the check on another's topic, and an older signed pack is
refused as a replay. A public key is the 32 raw bytes in base64 (``speakd-tools fleet keygen``);
a board trusts the keys in ``[fleet] trusted_keys``, several at a time so a key can be rotated.

The library is ``cryptography`` (pyca): maintained by the Python Cryptographic Authority, wheels
for aarch64 and armv7 Linux, and the one most distributions already ship.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from speakd.config import ed25519_public_bytes

# The refusal reasons a board counts (speakd_pack_refusals_total{reason}); REPLAYED is checked
# against what the cache remembers (speakd.cache.packs), the others here.
UNSIGNED, BAD_SIGNATURE, UNTRUSTED_KEY, REPLAYED = (
    "unsigned_pack",
    "bad_signature",
    "untrusted_key",
    "replayed",
)


class TrustError(Exception):
    """A pack this board must not take; ``str()`` is ``reason: detail``."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


def public_key(text: str) -> Ed25519PublicKey:
    """A base64 public key (as ``fleet keygen`` prints it); ValueError says what is wrong."""
    return Ed25519PublicKey.from_public_bytes(ed25519_public_bytes(text))


def encode_public(key: Ed25519PublicKey) -> str:
    raw = key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return base64.b64encode(raw).decode()


def signed_bytes(body: dict[str, Any], site: str) -> bytes:
    """What the signature covers: the manifest without ``signature``, for ``site``, canonical."""
    covered = {k: v for k, v in body.items() if k != "signature"}
    covered["site"] = site
    return json.dumps(covered, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def sign(body: dict[str, Any], site: str, key: Ed25519PrivateKey) -> dict[str, Any]:
    """``body`` with ``site``, ``key`` (the public half) and ``signature`` added."""
    signed = {**body, "site": site, "key": encode_public(key.public_key())}
    signature = key.sign(signed_bytes(signed, site))
    return {**signed, "signature": base64.b64encode(signature).decode()}


@dataclass(frozen=True)
class Trust:
    """The keys a board accepts packs from; none means packs are taken unsigned (the old way)."""

    keys: tuple[str, ...] = ()

    @property
    def required(self) -> bool:
        return bool(self.keys)

    def verify(self, body: dict[str, Any], site: str) -> int:
        """The manifest's version when it is signed for ``site`` by a trusted key, else raise."""
        signature, key = body.get("signature"), body.get("key")
        if not signature or not key:
            raise TrustError(UNSIGNED, "the manifest carries no signature")
        if not isinstance(key, str) or key not in self.keys:
            raise TrustError(UNTRUSTED_KEY, f"signed by {key!r}, not one of fleet.trusted_keys")
        version = body.get("version")
        if isinstance(version, bool) or not isinstance(version, int):
            raise TrustError(BAD_SIGNATURE, f"the signed manifest's version is {version!r}")
        try:
            raw = base64.b64decode(str(signature), validate=True)
            public_key(key).verify(raw, signed_bytes(body, site))
        except (binascii.Error, ValueError, InvalidSignature):
            raise TrustError(
                BAD_SIGNATURE, f"the signature does not match the manifest for site {site}"
            ) from None
        return version


def generate(out: Path) -> str:
    """Write ``OUT.key`` (PKCS #8 PEM, mode 0600) and ``OUT.pub``; returns the public key."""
    key = Ed25519PrivateKey.generate()
    private, public = out.with_suffix(".key"), out.with_suffix(".pub")
    for path in (private, public):
        if path.exists():
            raise FileExistsError(f"{path}: exists; keygen never overwrites a key")
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    private.touch(mode=0o600)
    private.write_bytes(pem)
    text = encode_public(key.public_key())
    public.write_text(text + "\n")
    return text


def load_private(path: Path) -> Ed25519PrivateKey:
    """A key written by ``generate``; ValueError names the file when it is not one."""
    try:
        key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    except (OSError, ValueError, TypeError) as e:
        raise ValueError(f"{path}: not an unencrypted Ed25519 private key ({e})") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise ValueError(f"{path}: not an Ed25519 private key")
    return key
