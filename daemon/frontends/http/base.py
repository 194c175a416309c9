"""What every HTTP endpoint shares: the app's state, JSON errors with the socket's codes, bodies
read within size and time limits, and the ``origin`` a request is logged and counted under.

Errors are OpenAI-shaped (``{"error": {"code", "message", "type"}}``: the ``openai`` SDK turns
them into its exceptions) and carry the same codes as the JSON socket
(``speakd.frontends.jsonlines``); the HTTP status follows the code (``STATUS``).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from speakd.audio.encode import EncodedClips
from speakd.config import HttpConfig
from speakd.control import Control
from speakd.control.metrics import Metrics
from speakd.request.messages import RequestError, SpeakRequest, error_data, parse_json

# error code → HTTP status; every other code is a client error (400)
STATUS = {
    "unauthorized": 401,
    "not_found": 404,
    "not_cached": 404,
    "method_not_allowed": 405,
    "duplicate_id": 409,
    "body_too_large": 413,
    "text_too_long": 413,
    "busy": 429,
    "queue_full": 429,
    "timeout": 408,
    "internal_error": 500,
    "synthesis_failed": 500,
    "engine_unavailable": 503,
    "engine_timeout": 503,
    "audio_unavailable": 503,
    "cache_locked": 503,
    "shutting_down": 503,
}
RETRY_AFTER_S = 1  # told to a client refused for load (429): the queue or the streams are full


@dataclass
class HttpState:
    """What the handlers need, kept on the app; ``config`` is swapped by a reload."""

    control: Control
    config: HttpConfig
    token: str | None  # the Bearer token; None = no authentication (loopback only)
    metrics: Metrics | None
    health: Callable[[], list[str]]  # why the daemon cannot speak now (empty: it can)
    encoded: EncodedClips = field(default_factory=EncodedClips)  # cache hits in MP3, Opus, FLAC


STATE = web.AppKey("speakd_http", HttpState)
_http_ids = itertools.count(1)


def state(request: web.Request) -> HttpState:
    return request.app[STATE]


def origin(request: web.Request) -> str:
    """``http:<peer address>``: the scheduler logs it, metrics count by its prefix."""
    return f"http:{request.remote or 'unknown'}"


def client_key() -> str:
    """A client key of its own for each HTTP request: HTTP has no connection-long session to
    pause or cancel by (SSIP's CANCEL SELF), so no two requests share one."""
    return f"http:{next(_http_ids)}"


WARNINGS_HEADER = "X-Speakd-Warnings"  # the codes of what a request skipped, comma-separated


def warning_headers(speak: SpeakRequest) -> dict[str, str]:
    """``X-Speakd-Warnings: unknown_clip, unknown_speaker`` for a request spoken with parts
    skipped (docs/reliability.md, "Lenient input"); nothing for one spoken whole."""
    codes = dict.fromkeys(w.code for w in speak.warnings)
    return {WARNINGS_HEADER: ", ".join(codes)} if codes else {}


def error_response(
    code: str, message: str, *, request_id: str | None = None, status: int | None = None
) -> web.Response:
    status = status or STATUS.get(code, 400)
    body: dict[str, Any] = {
        "error": {
            "code": code,
            "message": message,
            "type": "invalid_request_error" if status < 500 else "server_error",
        }
    }
    if request_id is not None:
        body["id"] = request_id
    headers = {"Retry-After": str(RETRY_AFTER_S)} if status == 429 else None
    if status == 401:
        headers = {"WWW-Authenticate": 'Bearer realm="speakd"'}
    return web.json_response(body, status=status, headers=headers, dumps=_dumps)


def failure(e: BaseException, request_id: str | None = None) -> web.Response:
    """Any request failure as its error response (the code as ``error_data`` names it)."""
    data = error_data(e)
    return error_response(data["code"], data["message"], request_id=request_id)


def ok(body: dict[str, Any], status: int = 200) -> web.Response:
    return web.json_response(body, status=status, dumps=_dumps)


def _dumps(obj: Any) -> str:
    # a lone surrogate echoed from a client's "\ud800" cannot be UTF-8: keep it escaped
    return json.dumps(obj, ensure_ascii=True, separators=(",", ":"))


@contextlib.contextmanager
def refusals(request: web.Request) -> Iterator[None]:
    """Around what a speaking handler checks before ``Control.build_request`` (which counts its
    own refusals): a ``RequestError`` raised inside is counted as refused, then answered."""
    try:
        yield
    except RequestError as e:
        state(request).control.refused(origin(request), e.code)
        raise


async def read_json(request: web.Request) -> dict[str, Any]:
    """The body as a JSON object, read within ``http.max_body_bytes`` and ``http.timeout_s``;
    an empty body is an empty object (``POST /v1/stop`` needs none)."""
    config = state(request).config
    try:
        raw = await asyncio.wait_for(request.read(), config.timeout_s)
    except TimeoutError:
        raise RequestError(
            "timeout", f"the request body did not arrive within {config.timeout_s:g} s"
        ) from None
    except web.HTTPRequestEntityTooLarge:
        raise RequestError(
            "body_too_large",
            f"the body exceeds {config.max_body_bytes} bytes (http.max_body_bytes)",
        ) from None
    if not raw.strip():
        return {}
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise RequestError("bad_encoding", "the body is not valid UTF-8") from None
    msg = parse_json(text)
    if not isinstance(msg, dict):
        raise RequestError("bad_request", "the body must be a JSON object")
    return msg
