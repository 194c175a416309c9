"""A small blocking client for the JSON-lines socket (the CLI's client commands use it)."""

from __future__ import annotations

import base64
import json
import socket
from collections.abc import Iterator
from typing import Any

from speakd.audio import AudioChunk, join_chunks


class ClientError(Exception):
    pass


class Client:
    def __init__(self, path: str, timeout: float | None = 10.0) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        try:
            self.sock.connect(path)
        except FileNotFoundError:
            raise ClientError(
                f"{path}: no such socket — is speakd running? (speakd serve)"
            ) from None
        except PermissionError:
            raise ClientError(f"{path}: permission denied — are you in speakd's group?") from None
        except OSError as e:
            raise ClientError(f"{path}: cannot connect: {e.strerror or e}") from None
        self._file = self.sock.makefile("rb")

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._file.close()
        self.sock.close()

    def send(self, message: dict[str, Any]) -> None:
        self.sock.sendall(json.dumps(message).encode() + b"\n")

    def events(self) -> Iterator[dict[str, Any]]:
        for raw in self._file:
            yield json.loads(raw)

    def request(self, message: dict[str, Any]) -> dict[str, Any]:
        """One op, one reply (status, voices, stop, cancel)."""
        self.send(message)
        for event in self.events():
            return event
        raise ClientError("speakd closed the connection without answering")

    def say(self, fields: dict[str, Any], wait: bool) -> Iterator[dict[str, Any]]:
        """Yield the request's events up to the terminal one (or just ``queued``)."""
        self.send({"op": "say", **fields, "wait": wait})
        for event in self.events():
            yield event
            if event["event"] in ("finished", "error") or (not wait and event["event"] == "queued"):
                return
        raise ClientError("speakd closed the connection before the request finished")

    def synth(self, fields: dict[str, Any]) -> tuple[AudioChunk | None, dict[str, Any]]:
        """The ``synth`` op: the audio (joined) and the terminal event."""
        self.send({"op": "synth", **fields})
        chunks: list[AudioChunk] = []
        for event in self.events():
            if event["event"] == "audio":
                fmt = event["format"]
                chunks.append(
                    AudioChunk(base64.b64decode(event["data"]), fmt["rate"], fmt["channels"])
                )
            elif event["event"] in ("finished", "error"):
                return join_chunks(chunks), event
        raise ClientError("speakd closed the connection before the audio ended")
