"""A stand-in for Home Assistant's ingress: ``/api/hassio_ingress/<token>/…`` forwarded to the
add-on's port with the prefix taken off and ``X-Ingress-Path`` added, from the ingress
gateway's own address (HA's is 172.30.32.2; here a loopback alias, so speakd's
``http.no_token_from`` can tell it from the browser at 127.0.0.1). It also serves the frame page
Home Assistant shows the add-on in, at the same origin. Every request is logged."""

from __future__ import annotations

from dataclasses import dataclass, field

import aiohttp
from aiohttp import web

GATEWAY = "127.0.0.2"
HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "host", "content-length"}


@dataclass
class IngressProxy:
    upstream: str  # http://127.0.0.1:PORT of the add-on
    token: str = "3f1a0c9e_ingress_session"
    seen: list[tuple[str, str, int]] = field(default_factory=list)  # method, path, status
    _runner: web.AppRunner | None = None
    _session: aiohttp.ClientSession | None = None

    @property
    def prefix(self) -> str:
        return f"/api/hassio_ingress/{self.token}"

    async def start(self, port: int) -> str:
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(local_addr=(GATEWAY, 0)),
            auto_decompress=False,
        )
        app = web.Application()
        app.add_routes(
            [
                web.get("/hassio/ingress/speakd", self.frame),
                web.route("*", self.prefix + "/{tail:.*}", self.forward),
            ]
        )
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", port).start()
        return f"http://127.0.0.1:{port}"

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
        if self._runner is not None:
            await self._runner.cleanup()

    async def frame(self, request: web.Request) -> web.Response:
        html = (
            "<!doctype html><title>Home Assistant</title>"
            '<body style="margin:0"><iframe id="panel" '
            f'src="{self.prefix}/" style="border:0;width:100%;height:100vh"></iframe>'
        )
        return web.Response(text=html, content_type="text/html")

    async def forward(self, request: web.Request) -> web.StreamResponse:
        assert self._session is not None
        url = f"{self.upstream}/{request.match_info['tail']}"
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
        headers["X-Ingress-Path"] = self.prefix
        async with self._session.request(
            request.method, url, params=request.query, headers=headers, data=await request.read()
        ) as upstream:
            response = web.StreamResponse(status=upstream.status)
            for k, v in upstream.headers.items():
                if k.lower() not in HOP_BY_HOP:
                    response.headers[k] = v
            await response.prepare(request)
            async for chunk in upstream.content.iter_any():
                await response.write(chunk)
            await response.write_eof()
        self.seen.append((request.method, request.path_qs, upstream.status))
        return response
