"""One SSIP client's state: its settings (``SET SELF …``), whether it is inside a BLOCK, the
events held while a reply is being made, and the messages it queued.

``frontend`` serves the connections; ``commands`` answers their commands.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from speakd.frontends.ssip.parser import event
from speakd.frontends.ssip.settings import Settings
from speakd.request.messages import Event


@dataclass(eq=False)
class Connection:
    client_id: int
    writer: asyncio.StreamWriter
    peer: str
    settings: Settings = field(default_factory=Settings)
    in_block: bool = False
    busy: bool = False  # between a command and its reply: events wait in ``held``
    held: list[bytes] = field(default_factory=list)
    closed: bool = False  # QUIT received or the peer went away: read no further

    @property
    def key(self) -> str:
        return client_key(self.client_id)

    def write(self, data: bytes) -> None:
        if not self.writer.is_closing():
            self.writer.write(data)

    def answer(self, data: bytes) -> None:
        """Send a complete reply, then any events that came in while it was being made."""
        self.write(data)
        held, self.held = self.held, []
        for item in held:
            self.write(item)

    def notify(self, kind: str, code: int, msg_id: int, text: str, *extra: str) -> None:
        if kind not in self.settings.notify:
            return
        data = event(code, msg_id, self.client_id, text, *extra)
        if self.busy:
            self.held.append(data)
        else:
            self.write(data)


def origin(conn: Connection) -> str:
    """What a message is logged and counted under: its client's name, else its number."""
    return f"ssip:{conn.settings.client_name or conn.client_id}"


def client_key(client_id: int) -> str:
    return f"ssip:{client_id}"


@dataclass(eq=False)
class Message:
    """One queued SSIP message: its ids and whether its 225 reply went out yet."""

    msg_id: int
    client_id: int
    conn: Connection
    accepted: bool = False
    rejected: Event | None = None
