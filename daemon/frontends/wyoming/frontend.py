"""Wyoming TTS server: how Home Assistant (Assist, media players, voice satellites) speaks through
speakd. Set ``[wyoming] uri`` and add it in Home Assistant as a Wyoming Protocol integration
(docs/wyoming.md).

The server listens on the ``wyoming`` package's own ``tcp://`` or ``unix://`` server, announces
itself over zeroconf when asked to, and answers each connection with a ``WyomingHandler``
(``connection.py``: the events and their answers), all in the daemon's event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
from typing import Any
from urllib.parse import urlparse

from wyoming.event import Event
from wyoming.server import AsyncServer, AsyncUnixServer

from speakd.config import WyomingConfig
from speakd.control import Control
from speakd.frontends.unixserver import widen_backlog
from speakd.frontends.wyoming.connection import WyomingHandler
from speakd.frontends.wyoming.wire import build_info

log = logging.getLogger(__name__)


class WyomingFrontend:
    """The server: one ``WyomingHandler`` per connection, all in the daemon's event loop."""

    def __init__(
        self,
        control: Control,
        config: WyomingConfig,
        *,
        max_event_bytes: int,
        max_pending: int,
        socket_mode: int,
    ) -> None:
        self.control = control
        self.config = config
        self.max_event_bytes = max_event_bytes  # limits.max_line_bytes
        self.max_pending = max_pending  # limits.max_queue, per connection
        self.socket_mode = socket_mode  # [socket] mode, for a unix:// server
        self.server: AsyncServer | None = None
        self._zeroconf: Any = None
        self._connections = itertools.count(1)

    async def start(self) -> None:
        self.server = AsyncServer.from_uri(self.config.uri)
        await self.server.start(self._handler)
        widen_backlog(self.server._server)  # the library listens with asyncio's backlog
        if isinstance(self.server, AsyncUnixServer):  # bound with the umask: same mode as ours
            os.chmod(self.server.socket_path, self.socket_mode)
        log.info("Wyoming server on %s", self.config.uri)
        if self.config.zeroconf:
            try:
                await self._announce()
            except OSError as e:  # no multicast route (yet): serve anyway, HA can add it by hand
                log.warning("Wyoming zeroconf announcement failed, serving without it: %s", e)

    async def close(self) -> None:
        """Stop listening and drop every connection (their work is cancelled)."""
        if self._zeroconf is not None:
            with contextlib.suppress(Exception):  # a network already gone must not stop a stop
                await self._zeroconf._aiozc.async_close()  # the library has no unregister
            self._zeroconf = None
        if self.server is not None:
            await self.server.stop()
            self.server = None

    def info_event(self) -> Event:
        """``info`` for the voices there are now (a reload may change them)."""
        return build_info(self.control.voices()).event()

    async def _announce(self) -> None:
        """Zeroconf (mDNS) so Home Assistant discovers the server, as wyoming-piper does."""
        from wyoming.zeroconf import HomeAssistantZeroconf

        url = urlparse(self.config.uri)
        assert url.port is not None  # WyomingConfig.validate: zeroconf needs tcp://HOST:PORT
        host = None if url.hostname in ("0.0.0.0", "::") else url.hostname
        self._zeroconf = HomeAssistantZeroconf(port=url.port, name=self.config.zeroconf, host=host)
        await self._zeroconf.register_server()
        log.info("Wyoming server announced over zeroconf as %r", self.config.zeroconf)

    def _handler(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> WyomingHandler:
        peer = writer.get_extra_info("peername")
        origin = f"wyoming:{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else "wyoming"
        return WyomingHandler(self, reader, writer, origin, f"wyoming:{next(self._connections)}")
