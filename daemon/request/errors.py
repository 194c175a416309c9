"""The error every front-end answers with its code: one type, imported by whoever refuses."""

from __future__ import annotations


class RequestError(ValueError):
    """A request that cannot be accepted; ``code`` is machine-readable, the text says why."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
