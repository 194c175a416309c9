"""OpenAI's speech API on speakd: ``POST /v1/audio/speech``, ``GET /v1/audio/voices``,
``GET /v1/models`` — so Open WebUI, n8n, LiveKit agents or the ``openai`` SDK speak through speakd
with nothing changed but the base URL and the key (docs/http.md).

``model`` is accepted whatever it names (``voice`` picks the voice, of any engine);
``instructions`` and any field speakd does not know are ignored, as OpenAI's clients expect.
OpenAI's voice names (alloy, echo…) mean the default voice; speakd's own voice names work as
themselves, each at its own sample rate. speakd's request fields ``speaker``, ``lang``, ``seed``,
``params``, ``cache_only``, ``chime``, ``punctuation``, ``pitch``, ``capitals`` and ``id`` may ride
along (the SDK's ``extra_body``), and ``"timestamps": true`` makes the answer JSON lines of audio
and word events.
The audio is the request path's (``Control.stream``): from the cache on a hit, else sent as it is
synthesised, chunk by chunk, encoded by ``speakd.audio.encode`` — except FLAC, whose header needs
the whole clip, so a FLAC miss is sent once its synthesis has finished.
"""

from __future__ import annotations

import asyncio
import base64
import logging
from typing import Any

from aiohttp import web

from speakd.audio import AudioChunk
from speakd.audio.encode import (
    FORMATS,
    PCM_RATE,
    WHOLE_ONLY,
    FormatError,
    check_format,
    encode_whole,
    encoder,
)
from speakd.control import Control
from speakd.frontends.http.base import (
    client_key,
    ok,
    origin,
    read_json,
    refusals,
    state,
    warning_headers,
)
from speakd.machine.logcontext import request_context
from speakd.request.errors import RequestError
from speakd.request.messages import SpeakRequest, dump_json
from speakd.request.stream import AudioStream

log = logging.getLogger(__name__)

OPENAI_VOICES = (
    "alloy", "ash", "ballad", "cedar", "coral", "echo", "fable",
    "marin", "nova", "onyx", "sage", "shimmer", "verse",
)  # fmt: skip
MODELS = ("speakd", "tts-1", "tts-1-hd", "gpt-4o-mini-tts")
SPEAKD_FIELDS = (
    "speaker", "lang", "seed", "params", "cache_only", "chime", "punctuation",
    "punctuation_important", "id", "pitch", "capitals",
)  # fmt: skip
DEFAULT_FORMAT = "mp3"  # OpenAI's default
CHEAP_FORMATS = ("wav", "pcm")  # encoded on the event loop; the others on a worker thread
LINES_TYPE = "application/x-ndjson"  # "timestamps": true: JSON lines of audio and word events


class SlowReader(ConnectionError):
    """The client stopped reading (http.timeout_s): it is treated as gone."""


def routes() -> list[web.RouteDef]:
    return [
        web.post("/v1/audio/speech", speech),
        web.get("/v1/audio/voices", voices),
        web.get("/v1/models", models),
        web.get("/v1/models/{model}", model),
    ]


def speech_fields(body: dict[str, Any], control: Control) -> dict[str, Any]:
    """OpenAI's request as the fields every front-end hands to ``Control.build_request``."""
    voice = body.get("voice")
    if isinstance(voice, dict):  # the API's newer {"id": "..."} form
        voice = voice.get("id")
    own = {v["name"] for v in control.voices()}
    if isinstance(voice, str) and voice not in own and voice.lower() in OPENAI_VOICES:
        voice = None  # the default voice
    if body.get("stream_format") not in (None, "audio"):
        raise RequestError("bad_field", "stream_format: only 'audio' is supported")
    fields = {"text": body.get("input"), "voice": voice, "speed": body.get("speed")}
    fields.update({k: body[k] for k in SPEAKD_FIELDS if k in body})
    return fields


def response_format(body: dict[str, Any]) -> str:
    name = body.get("response_format") or DEFAULT_FORMAT
    try:
        return check_format(str(name))
    except FormatError as e:
        raise RequestError("bad_format", str(e)) from None


async def speech(request: web.Request) -> web.StreamResponse:
    st = state(request)
    with refusals(request):
        body = await read_json(request)
        fmt = response_format(body)
        fields = speech_fields(body, st.control)
        timestamps = body.get("timestamps", False)
        if not isinstance(timestamps, bool):
            raise RequestError("bad_field", "timestamps must be true or false")
    speak = st.control.build_request(fields, origin=origin(request), client=client_key())
    sent: list[web.StreamResponse] = []  # the streamed response, once its headers are out
    with request_context(speak.id, speak.config.voice or "default"):
        try:
            async with st.control.stream(speak) as stream:
                respond = _respond_lines if timestamps else _respond
                return await respond(request, stream, fmt, speak, sent)
        except Exception as e:
            if not sent:  # nothing sent yet: the client gets a JSON error (middleware)
                raise
            # Headers are out: the status cannot change. Cut the connection so the client sees
            # a truncated body (an error), never a short file that looks complete.
            gone = isinstance(e, ConnectionError)
            log.log(
                logging.INFO if gone else logging.WARNING, "speech %s cut short: %s", speak.id, e
            )
            if request.transport is not None:
                request.transport.abort()
            return sent[0]


async def _respond(
    request: web.Request,
    stream: AudioStream,
    fmt: str,
    speak: SpeakRequest,
    sent: list[web.StreamResponse],
) -> web.StreamResponse:
    headers = {
        "Content-Type": FORMATS[fmt][0],
        "X-Request-Id": speak.id,
        "X-Speakd-Cache": "hit" if stream.from_cache else "miss",
        **warning_headers(speak),
    }
    if fmt == "pcm":
        headers["X-Sample-Rate"] = str(PCM_RATE)
    response = web.StreamResponse(headers=headers)
    timeout = state(request).config.timeout_s

    async def send(data: bytes = b"", eof: bool = False) -> None:
        """A reader that stalls (a full socket buffer) times out instead of holding on."""
        try:
            if data:
                await asyncio.wait_for(response.write(data), timeout)
            if eof:
                await asyncio.wait_for(response.write_eof(), timeout)
        except TimeoutError:
            raise SlowReader(f"the client read nothing for {timeout:g} s") from None

    chunks = stream.aread()
    # Whole already (a cache hit), or a format that needs the whole clip (FLAC): exact headers,
    # a Content-Length. A FLAC miss waits here for the end of its synthesis.
    if stream.done or fmt in WHOLE_ONLY:
        encoded = state(request).encoded
        data = encoded.get(stream.key, fmt) if fmt not in CHEAP_FORMATS else None
        if data is None:
            audio = [c async for c in chunks]
            if not audio:
                raise RequestError("synthesis_failed", "the engine produced no audio")
            data = await _encode(fmt, encode_whole, fmt, audio)
            if fmt not in CHEAP_FORMATS:
                encoded.put(stream.key, fmt, data)
        response.content_length = len(data)
        await response.prepare(request)
        sent.append(response)
        await send(data)
    else:
        first = await anext(chunks, None)  # an engine that fails at once gets a JSON error
        if first is None:
            raise RequestError("synthesis_failed", "the engine produced no audio")
        response.enable_chunked_encoding()
        await response.prepare(request)
        sent.append(response)
        enc = encoder(fmt)
        await send(await _encode(fmt, enc.feed, first))
        async for chunk in chunks:
            await send(await _encode(fmt, enc.feed, chunk))
        await send(await _encode(fmt, enc.finish))
    await send(eof=True)
    return response


async def _encode(fmt: str, op: Any, *args: Any) -> bytes:
    """WAV and PCM on the event loop (a copy); the codecs on a worker thread."""
    return op(*args) if fmt in CHEAP_FORMATS else await asyncio.to_thread(op, *args)


async def _respond_lines(
    request: web.Request,
    stream: AudioStream,
    fmt: str,
    speak: SpeakRequest,
    sent: list[web.StreamResponse],
) -> web.StreamResponse:
    """``"timestamps": true``: JSON lines, the socket ``synth``'s events — ``warning`` first for
    each part skipped, ``audio`` (base64 of the format's bytes as they are encoded; FLAC in one
    piece at the end), ``word`` ahead of the audio it starts in, then ``finished`` — so a client
    gets the audio and its word timings at once."""
    headers = {"Content-Type": LINES_TYPE, "X-Request-Id": speak.id, **warning_headers(speak)}
    response = web.StreamResponse(headers=headers)
    response.enable_chunked_encoding()
    timeout = state(request).config.timeout_s
    whole = fmt in WHOLE_ONLY
    enc = None if whole else encoder(fmt)
    kept: list[AudioChunk] = []  # FLAC: encoded once the audio is whole

    async def send(event: dict[str, Any]) -> None:
        if not sent:
            await response.prepare(request)
            sent.append(response)
        try:
            await asyncio.wait_for(response.write(dump_json(event) + b"\n"), timeout)
        except TimeoutError:
            raise SlowReader(f"the client read nothing for {timeout:g} s") from None

    async def audio(data: bytes) -> None:
        if data:
            await send({"event": "audio", "format": fmt, "data": base64.b64encode(data).decode()})

    for warning in speak.warnings:
        await send({"event": "warning", **warning.to_dict()})
    offset = 0
    async for chunk in stream.aread():
        for word in chunk.words:
            await send({"event": word.kind, **word.event(offset, chunk.sample_rate)})
        offset += chunk.frames
        if enc is None:
            kept.append(chunk)
        else:
            await audio(await _encode(fmt, enc.feed, chunk))
    if offset == 0:
        raise RequestError("synthesis_failed", "the engine produced no audio")
    await audio(
        await (_encode(fmt, encode_whole, fmt, kept) if enc is None else _encode(fmt, enc.finish))
    )
    await send(
        {
            "event": "finished",
            "status": "done",
            "duration_s": round(stream.duration, 3),
            "cached": stream.from_cache,
        }
    )
    await asyncio.wait_for(response.write_eof(), timeout)
    return response


async def voices(request: web.Request) -> web.Response:
    control = state(request).control
    return ok(
        {
            "voices": [{"id": v["name"], **v} for v in control.voices()],
            "default": control.default_voice(),
            "openai_voices": list(OPENAI_VOICES),
            "options": control.options(),
            "formats": list(FORMATS),
        }
    )


def _model(name: str) -> dict[str, Any]:
    return {"id": name, "object": "model", "created": 0, "owned_by": "speakd"}


async def models(request: web.Request) -> web.Response:
    return ok({"object": "list", "data": [_model(m) for m in MODELS]})


async def model(request: web.Request) -> web.Response:
    return ok(_model(request.match_info["model"]))  # any model name is accepted for speech
