"""speakd's own HTTP endpoints: play on the board, stop, cancel, status — the JSON socket's
``say``, ``stop``, ``cancel`` and ``status`` ops (``speakd.frontends.jsonlines``) over HTTP, with
the same fields, events and error codes.

``POST /v1/say`` answers 202 with the ``queued`` event (or the error that refused it); with
``"wait": true`` it answers once the request has ended, with its terminal event and every event
before it.
"""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web

from speakd.frontends.http.base import (
    client_key,
    error_response,
    ok,
    origin,
    read_json,
    refusals,
    state,
)
from speakd.request.messages import Event, EventType, RequestError


def routes() -> list[web.RouteDef]:
    return [
        web.post("/v1/say", say),
        web.post("/v1/stop", stop),
        web.post("/v1/cancel", cancel),
        web.get("/v1/status", status),
    ]


async def say(request: web.Request) -> web.Response:
    st = state(request)
    with refusals(request):
        body = await read_json(request)
        wait = body.get("wait", False)
        if not isinstance(wait, bool):
            raise RequestError("bad_field", "wait must be true or false")
    events: list[dict[str, Any]] = []
    ended: asyncio.Future[Event] = asyncio.get_running_loop().create_future()

    def on_event(event: Event) -> None:  # on the loop thread
        events.append(event.to_dict())
        if event.terminal and not ended.done():
            ended.set_result(event)

    speak = st.control.build_request(
        body, origin=origin(request), client=client_key(), on_event=on_event
    )
    st.control.say(speak)  # queued, or refused, is told at once
    if wait and not ended.done():
        await ended
    last = events[-1]
    if last["event"] == EventType.ERROR:
        return error_response(last["code"], last["message"], request_id=speak.id)
    warnings = {"warnings": [w.to_dict() for w in speak.warnings]} if speak.warnings else {}
    if not wait and last["event"] == EventType.QUEUED:
        return ok(last | warnings, status=202)
    return ok({**last, **warnings, "events": events})


async def stop(request: web.Request) -> web.Response:
    await read_json(request)  # an empty body or {}; a broken one is still an error
    return ok({"stopped": state(request).control.stop()})


async def cancel(request: web.Request) -> web.Response:
    body = await read_json(request)
    request_id = body.get("id")
    if request_id is not None and (
        not isinstance(request_id, str | int) or isinstance(request_id, bool)
    ):
        raise RequestError("bad_field", "id must be a string")
    control = state(request).control
    n = control.cancel(str(request_id)) if request_id is not None else control.cancel()
    return ok({"cancelled": n})


async def status(request: web.Request) -> web.Response:
    return ok(state(request).control.status())
