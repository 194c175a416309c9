"""speakd's HTTP API, served by aiohttp inside the daemon's event loop (``[http] listen``).

Routes: OpenAI's speech API (``speakd.frontends.http.openai``), speakd's own say/stop/cancel/
status (``speakd.frontends.http.speakd``), ``GET /healthz``, ``GET /metrics`` (Prometheus) and a
page for installers at ``/`` (``speakd/data/index.*``: plain HTML and JavaScript, no build step).

Security (docs/http.md): with ``http.token`` set every route but the page and ``/healthz`` needs
``Authorization: Bearer <token>``, except from the peers in ``http.no_token_from`` (a proxy that
authenticates its users itself: Home Assistant's ingress); listening beyond loopback without a
token is a configuration error (``speakd.config``). There is no TLS here: put a reverse proxy
in front for that. Bodies are capped (``http.max_body_bytes``), a body or a reader slower than
``http.timeout_s`` is cut off, and every failure becomes a JSON error with the socket's codes
(``base.STATUS``); nothing a client sends can take the daemon down.
"""

from __future__ import annotations

import hmac
import importlib.resources
import itertools
import logging
import time
from collections.abc import Awaitable, Callable

from aiohttp import web
from prometheus_client import Counter

from speakd.config import HttpConfig
from speakd.control import Control
from speakd.control.metrics import CONTENT_TYPE, Metrics
from speakd.frontends.http import openai, page, speakd
from speakd.frontends.http.base import (
    STATE,
    HttpState,
    error_response,
    failure,
    ok,
    state,
)
from speakd.frontends.unixserver import listen_backlog
from speakd.request.messages import error_data

log = logging.getLogger(__name__)

PAGE_FILES = {
    "/": "index.html",
    "/index.js": "index.js",
    "/panels.js": "panels.js",
    "/index.css": "index.css",
}
OPEN_PATHS = (*PAGE_FILES, "/healthz")  # no token needed: no data in them
PAGE_TYPES = {"html": "text/html", "js": "text/javascript", "css": "text/css"}
PAGE_HEADERS = {
    # the page loads only its own files and plays only what it fetched (blob: URLs); only a page
    # of the same origin may frame it (Home Assistant's ingress panel, served through HA's origin)
    "Content-Security-Policy": "default-src 'self'; media-src 'self' blob:; frame-ancestors 'self'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
SHUTDOWN_S = 2.0  # how long requests in flight get at shutdown (a say with wait may not end)
_ids = itertools.count(1)


class HttpFrontend:
    """The aiohttp server: its app, its lifetime in the daemon, reloads and the health check."""

    def __init__(
        self, control: Control, config: HttpConfig, metrics: Metrics | None = None
    ) -> None:
        """Without ``metrics`` (tests/test_docs.py builds the app to list its routes) /metrics
        answers 404 and responses are not counted."""
        self.state = HttpState(control, config, config.token_value(), metrics, self.health)
        self.host, self.port = config.address
        self._runner: web.AppRunner | None = None
        self._responses = (
            Counter(
                "speakd_http_responses",
                "HTTP responses by route and status",
                ["route", "status"],
                registry=metrics.registry,
            )
            if metrics is not None
            else None
        )

    def app(self) -> web.Application:
        app = web.Application(
            middlewares=[self._guard, self._auth],
            client_max_size=self.state.config.max_body_bytes,
        )
        app[STATE] = self.state
        app.on_response_prepare.append(_server_header)
        app.add_routes(openai.routes() + speakd.routes() + page.routes())
        app.add_routes(
            [
                web.get("/healthz", healthz),
                web.get("/metrics", metrics),
                *(web.get(path, _page(name)) for path, name in PAGE_FILES.items()),
            ]
        )
        return app

    async def start(self) -> None:
        self._runner = web.AppRunner(
            self.app(),
            access_log=None,
            keepalive_timeout=self.state.config.timeout_s,
            shutdown_timeout=SHUTDOWN_S,
        )
        await self._runner.setup()
        site = web.TCPSite(
            self._runner, self.host, self.port, reuse_address=True, backlog=listen_backlog()
        )
        await site.start()
        log.info(
            "HTTP API on %s (%s)",
            self.state.config.listen,
            "Bearer token required" if self.state.token else "no token: loopback only",
        )

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def reconfigure(self, config: HttpConfig) -> None:
        """A reload: the token and ``timeout_s`` for bodies and readers change at once; the
        address, the body limit and the idle-connection timeout are the running server's."""
        old = self.state.config
        if (config.listen, config.max_body_bytes) != (old.listen, old.max_body_bytes):
            log.warning("http.listen and http.max_body_bytes changes take effect after a restart")
        self.state.config, self.state.token = config, config.token_value()

    def health(self) -> list[str]:
        """Why the daemon cannot speak now (empty: it can)."""
        status = self.state.control.status()
        reasons = []
        breaker = status.get("breaker") or {}
        if breaker.get("state") == "open":
            reasons.append(
                f"engine unavailable: circuit breaker open ({breaker.get('last_error')})"
            )
        audio = status.get("audio") or {}
        if not audio.get("available", True):
            reasons.append(f"audio unavailable: {audio.get('error') or audio.get('sink')}")
        return reasons

    # ---- middlewares ------------------------------------------------------------------------

    @web.middleware
    async def _guard(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Every failure as a JSON error, every request logged with its id and counted."""
        rid, t0 = f"h{next(_ids)}", time.monotonic()
        try:
            response = await handler(request)
        except web.HTTPException as e:  # aiohttp's own: unknown route, wrong method, too large
            response = _http_error(e)
        except Exception as e:  # refused, failed, or a bug: the client hears it, speakd goes on
            if error_data(e)["code"] == "internal_error":
                log.exception("HTTP %s %s %s failed", rid, request.method, request.path)
            response = failure(e)
        level = logging.DEBUG if response.status < 400 else logging.INFO
        log.log(
            level,
            "HTTP %s %s %s %s → %d in %.1f ms",
            rid,
            request.remote,
            request.method,
            request.path,
            response.status,
            (time.monotonic() - t0) * 1000,
        )
        if self._responses is not None:
            resource = request.match_info.route.resource
            route = resource.canonical if resource is not None else "unmatched"
            self._responses.labels(route, str(response.status)).inc()
        return response

    @web.middleware
    async def _auth(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        st = state(request)
        token = st.token
        if (
            token
            and request.path not in OPEN_PATHS
            and request.remote not in st.config.no_token_from
        ):
            scheme, _, given = request.headers.get("Authorization", "").partition(" ")
            if scheme.lower() != "bearer" or not hmac.compare_digest(
                given.strip().encode(), token.encode()
            ):
                return error_response("unauthorized", "a valid Bearer token is required")
        return await handler(request)


async def _server_header(request: web.Request, response: web.StreamResponse) -> None:
    response.headers["Server"] = "speakd"  # not aiohttp's and Python's versions


def _http_error(e: web.HTTPException) -> web.Response:
    codes = {404: "not_found", 405: "method_not_allowed", 413: "body_too_large"}
    code = codes.get(e.status, "bad_request")
    return error_response(
        code, e.reason if e.status != 413 else e.text or e.reason, status=e.status
    )


async def healthz(request: web.Request) -> web.Response:
    reasons = state(request).health()
    if reasons:
        return web.json_response({"status": "unavailable", "reasons": reasons}, status=503)
    return ok({"status": "ok"})


async def metrics(request: web.Request) -> web.Response:
    collected = state(request).metrics
    if collected is None:
        return error_response("not_found", "metrics are not collected here", status=404)
    return web.Response(body=collected.exposition(), headers={"Content-Type": CONTENT_TYPE})


def _page(name: str) -> Handler:
    """The page's files, read once from the package (they ship as package data)."""
    body = (importlib.resources.files("speakd") / "data" / name).read_bytes()
    headers = {
        **PAGE_HEADERS,
        "Content-Type": PAGE_TYPES[name.rsplit(".", 1)[1]] + "; charset=utf-8",
    }

    async def page(request: web.Request) -> web.Response:
        return web.Response(body=body, headers=headers)

    return page
