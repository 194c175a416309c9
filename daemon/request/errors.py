"""The error every front-end answers with its code: one type, imported by whoever refuses; and
the warning for what is skipped instead of refused."""

from __future__ import annotations

from dataclasses import dataclass


class RequestError(ValueError):
    """A request that cannot be accepted; ``code`` is machine-readable, the text says why."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class InputWarning:
    """Part of a request that could not be honoured, while the rest is spoken (docs/reliability.md,
    "Lenient input"): the client is told ``code`` and why, and the daemon counts it."""

    code: str
    message: str

    def to_dict(self) -> dict[str, str]:
        return {"code": self.code, "message": self.message}
