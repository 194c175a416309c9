"""The clients: one thread per front-end, each sending one request at a time, as the real
clients would, until the run ends. Every request goes into the ledger with what came back.

- ``json``: socket ``say`` and ``synth`` (hits and misses, every voice, priorities), a ``say``
  interrupted by an ``important`` one, stopped by ``stop``, cancelled by ``cancel``, a ``synth``
  whose client leaves after its first audio;
- ``ssip``: the real ``spd-say -w`` (``SPEECHD_CMD=/bin/false``: it can never start the real
  Speech Dispatcher), sometimes cancelled by ``spd-say -C``;
- ``mqtt``: Hermes ``hermes/tts/say`` and speakd's ``speakd/<site>/say`` (the driver is
  tools/soak/mqtt_driver.py);
- ``wyoming``: the ``wyoming`` library's client, plain ``synthesize`` and Home Assistant's
  streaming sequence (start, chunks cut mid-word, the whole text, stop), and a client that leaves
  mid-stream;
- ``http``: the ``openai`` SDK in every format (a streaming reader that leaves early, too) and
  ``/v1/say``.
"""

from __future__ import annotations

import asyncio
import base64
import io
import os
import random
import shutil
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from speakd.library.client import Client

from .ledger import Ledger, Request

LONG = (
    "Attention. This is a long announcement that keeps going for a while, so that there is "
    "time to interrupt it. It has several sentences. Each one adds a few more seconds of speech."
)
TIMEOUT_S = 300.0  # a request that has no terminal event after this is missing
LOSSY = {"mp3", "opus"}
KILL_GRACE_S = 30.0  # how long a say may still end after the daemon it was sent to died


@dataclass(frozen=True)
class Endpoints:
    """Where the daemon listens; a front-end without one gets no traffic."""

    socket: str
    ssip: str = ""
    wyoming_port: int = 0  # on 127.0.0.1
    http_url: str = ""
    token: str = ""
    broker_port: int = 0  # on 127.0.0.1
    site: str = "default"


@dataclass
class Context:
    ledger: Ledger
    ep: Endpoints
    voices: list[str]
    hits: list[str]  # texts that are cached after warm-up (pinned ones among them)
    think_s: float = 0.5  # mean pause between a client's requests
    seed: int = 0
    misses: int = 0
    errors: list[str] = field(default_factory=list)  # the tool's own failures
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def miss_text(self, who: str) -> str:
        with self._lock:
            self.misses += 1
            n = self.misses
        return f"Soak {who} message {n}: the sensor in room {n % 7 + 1} reads {n % 90 + 5} degrees."

    def rng(self, who: str) -> random.Random:
        return random.Random(f"{self.seed}-{who}")


def run_driver(ctx: Context, name: str, step: Callable[[Context, random.Random], None]) -> None:
    """Call ``step`` until the run ends; an exception in the tool is recorded, not fatal."""
    rng = ctx.rng(name)
    while ctx.ledger.turn():
        try:
            step(ctx, rng)
        except Exception as e:  # the tool's own bug: say so in the report, keep going
            ctx.errors.append(f"{name}: {type(e).__name__}: {e}")
        time.sleep(rng.expovariate(1 / ctx.think_s))


def _failed(ctx: Context, req: Request, e: BaseException) -> None:
    req.note = f"{type(e).__name__}: {e}"
    ctx.ledger.end(req, None)


def pick(ctx: Context, rng: random.Random, who: str, miss_rate: float = 0.25) -> str:
    """A request's text: a new miss ``miss_rate`` of the time, else a cached one."""
    return ctx.miss_text(who) if rng.random() < miss_rate else rng.choice(ctx.hits)


# ---- the JSON socket --------------------------------------------------------------------------


def _terminal(events: Any) -> dict[str, Any] | None:
    for event in events:
        if event["event"] in ("finished", "error"):
            return event
    return None


def _outcome(event: dict[str, Any] | None) -> str | None:
    if event is None:
        return None
    return event["status"] if event["event"] == "finished" else event.get("code", "error")


def json_step(ctx: Context, rng: random.Random) -> None:
    kind = rng.choices(
        ["say", "synth", "vanish", "interrupt", "stop", "cancel", "notification"],
        [30, 30, 8, 8, 6, 6, 6],
    )[0]
    voice = rng.choice(ctx.voices)
    if kind in ("say", "notification"):
        text = pick(ctx, rng, "json")
        priority = "notification" if kind == "notification" else rng.choice(["message", "text"])
        _say(ctx, "json", kind, {"text": text, "voice": voice, "priority": priority})
    elif kind == "synth":
        _synth(ctx, rng, voice)
    elif kind == "vanish":
        _vanish(ctx, rng, voice)
    else:
        _disturbed(ctx, kind, voice)


def _say(ctx: Context, frontend: str, kind: str, fields: dict[str, Any]) -> Request:
    req = ctx.ledger.begin(frontend, kind, expect=[(fields["voice"], fields["text"])])
    req.tolerance_s = 0.02  # the log says the played seconds to 2 decimals
    try:
        with Client(ctx.ep.socket, timeout=TIMEOUT_S) as c:
            ctx.ledger.end(req, _outcome(_terminal(c.say({**fields, "id": req.id}, wait=True))))
    except Exception as e:  # no terminal event: a dead connection, a timeout
        _failed(ctx, req, e)
    return req


def _audio_s(event: dict[str, Any]) -> float:
    fmt = event["format"]
    return len(base64.b64decode(event["data"])) / (fmt["rate"] * fmt["width"] * fmt["channels"])


def _synth(ctx: Context, rng: random.Random, voice: str) -> None:
    text = pick(ctx, rng, "json")
    req = ctx.ledger.begin("json", "synth", expect=[(voice, text)])
    try:
        with Client(ctx.ep.socket, timeout=TIMEOUT_S) as c:
            c.send({"op": "synth", "text": text, "voice": voice, "id": req.id})
            audio = 0.0
            for event in c.events():
                if event["event"] == "audio":
                    audio += _audio_s(event)
                elif event["event"] in ("finished", "error"):
                    ctx.ledger.end(req, _outcome(event), audio)
                    return
        ctx.ledger.end(req, None)
    except Exception as e:  # no terminal event: a dead connection, a timeout
        _failed(ctx, req, e)


def _vanish(ctx: Context, rng: random.Random, voice: str) -> None:
    """A synth whose client leaves after the first audio (the synthesis must be cancelled)."""
    req = ctx.ledger.begin("json", "synth-vanish")
    try:
        with Client(ctx.ep.socket, timeout=TIMEOUT_S) as c:
            c.send({"op": "synth", "text": rng.choice([LONG, ctx.miss_text("json")]),
                    "voice": voice, "id": req.id})  # fmt: skip
            event = next(c.events(), None)
            if event is None or event["event"] != "audio":  # it ended before the client left
                ctx.ledger.end(req, _outcome(event))
                return
        ctx.ledger.abandon(req)
    except Exception as e:  # no terminal event: a dead connection, a timeout
        _failed(ctx, req, e)


def _disturbed(ctx: Context, kind: str, voice: str) -> None:
    """A long say, disturbed once it has started: ``interrupt`` by an important say, ``stop``,
    or ``cancel`` by its id. Both says are counted; the disturbing ops are replies."""
    req = ctx.ledger.begin("json", f"{kind}-long")
    try:
        with Client(ctx.ep.socket, timeout=TIMEOUT_S) as c:
            events = c.say({"text": LONG, "voice": voice, "id": req.id}, wait=True)
            for event in events:
                if event["event"] in ("started", "finished", "error"):
                    break
            if event["event"] == "started":
                if kind == "interrupt":
                    short = ctx.hits[len(req.id) % len(ctx.hits)]
                    important = {"text": short, "voice": voice, "priority": "important"}
                    _say(ctx, "json", "important", important)
                else:
                    with Client(ctx.ep.socket, timeout=60) as other:
                        other.request({"op": kind, **({"id": req.id} if kind == "cancel" else {})})
                event = _terminal(events) or {"event": "none"}
            ctx.ledger.end(req, _outcome(event) if event["event"] != "none" else None)
    except Exception as e:  # no terminal event: a dead connection, a timeout
        _failed(ctx, req, e)


# ---- SSIP: the real spd-say -------------------------------------------------------------------

SPD_SAY = shutil.which("spd-say")


def _spd_env(ctx: Context) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LC_", "SPEECHD_"))}
    return {**env, "LANG": "C.UTF-8", "SPEECHD_ADDRESS": f"unix_socket:{ctx.ep.ssip}",
            "SPEECHD_CMD": "/bin/false"}  # fmt: skip


def ssip_step(ctx: Context, rng: random.Random) -> None:
    assert SPD_SAY is not None
    env = _spd_env(ctx)
    priority = rng.choice(["message", "message", "text", "important"])
    cancel = rng.random() < 0.1
    text = LONG if cancel else pick(ctx, rng, "ssip")
    req = ctx.ledger.begin("ssip", "spd-say-cancelled" if cancel else f"spd-say-{priority}")
    proc = subprocess.Popen(
        [SPD_SAY, "-w", "-P", priority, text],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        if cancel:
            time.sleep(1.0)
            subprocess.run([SPD_SAY, "-C"], env=env, capture_output=True, timeout=60)
        deadline = time.monotonic() + TIMEOUT_S
        while proc.poll() is None:  # spd-say -w waits forever when its daemon was killed
            if time.monotonic() > deadline or ctx.ledger.gone_with_a_kill(req, KILL_GRACE_S):
                raise subprocess.TimeoutExpired(proc.args, TIMEOUT_S)
            time.sleep(0.2)
        _, err = proc.communicate()
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        req.note = "spd-say -w did not return"
        ctx.ledger.end(req, None)
        return
    if proc.returncode == 0:  # -w returns on the message's END or CANCEL event
        ctx.ledger.end(req, "ended")
    else:
        req.note = err.decode(errors="replace").strip()[-200:]
        ctx.ledger.end(req, None)


# ---- Wyoming, as Home Assistant uses it -------------------------------------------------------


def wyoming_step(ctx: Context, rng: random.Random) -> None:
    kind = rng.choices(["synthesize", "streaming", "vanish"], [50, 35, 15])[0]
    asyncio.run(_wyoming(ctx, rng, kind))


async def _wyoming(ctx: Context, rng: random.Random, kind: str) -> None:
    from wyoming.client import AsyncTcpClient
    from wyoming.tts import (
        Synthesize,
        SynthesizeChunk,
        SynthesizeStart,
        SynthesizeStop,
        SynthesizeVoice,
    )

    voice = rng.choice(ctx.voices)
    if kind == "streaming":
        sentences = [*rng.sample(ctx.hits, 2), ctx.miss_text("wyoming")]
    else:
        sentences = [LONG if kind == "vanish" else pick(ctx, rng, "wyoming")]
    req = ctx.ledger.begin("wyoming", kind, expect=[(voice, s) for s in sentences])
    full = " ".join(sentences)
    client = AsyncTcpClient("127.0.0.1", ctx.ep.wyoming_port, read_timeout=TIMEOUT_S)
    try:
        async with client:
            if kind == "streaming":
                await client.write_event(SynthesizeStart(SynthesizeVoice(name=voice)).event())
                cuts = sorted(rng.sample(range(1, len(full)), 3))
                for a, b in zip([0, *cuts], [*cuts, len(full)], strict=True):
                    await client.write_event(SynthesizeChunk(full[a:b]).event())
                await client.write_event(Synthesize(full, SynthesizeVoice(name=voice)).event())
                await client.write_event(SynthesizeStop().event())
                end = "synthesize-stopped"
            else:
                await client.write_event(Synthesize(full, SynthesizeVoice(name=voice)).event())
                end = "audio-stop"
            audio, bytes_per_s, error = 0.0, 1, None
            while True:
                try:
                    event = await client.read_event()
                except asyncio.IncompleteReadError:  # how a refused stream ends (wyoming.md)
                    event = None
                if event is None:  # after a refusal's error the connection ends (wyoming.md)
                    if error is None:
                        req.note = "connection closed"
                    ctx.ledger.end(req, error, audio if error else None)
                    return
                if event.type == "audio-start":
                    d = event.data
                    bytes_per_s = d["rate"] * d["width"] * d["channels"]
                elif event.type == "audio-chunk":
                    audio += len(event.payload or b"") / bytes_per_s
                    if kind == "vanish":
                        ctx.ledger.abandon(req)
                        return
                elif event.type == "error":
                    error = error or event.data.get("code", "error")
                elif event.type == end:
                    ctx.ledger.end(req, error or "done", audio)
                    return
    except Exception as e:  # no terminal event: a dead connection, a timeout
        _failed(ctx, req, e)


# ---- HTTP: the openai SDK and /v1/say ---------------------------------------------------------


def _decoded_s(content: bytes, fmt: str) -> float:
    if fmt == "pcm":
        return len(content) / 2 / 24000
    if fmt == "wav":  # a streamed WAV says "unknown length": count what follows the header
        rate = int.from_bytes(content[24:28], "little")
        return (len(content) - 44) / 2 / rate
    import soundfile

    samples, rate = soundfile.read(io.BytesIO(content), dtype="int16")
    return len(samples) / rate


class HttpDriver:
    def __init__(self, ctx: Context) -> None:
        import openai

        self.ctx = ctx
        self.openai = openai
        self.reconnect()

    def reconnect(self) -> None:
        """New clients: the old ones' pooled keep-alive connections close (quiet points count
        the daemon's fds)."""
        import httpx

        if hasattr(self, "http"):
            self.close()
        ep = self.ctx.ep
        self.sdk = self.openai.OpenAI(
            base_url=f"{ep.http_url}/v1", api_key=ep.token, max_retries=0, timeout=TIMEOUT_S
        )
        self.http = httpx.Client(
            base_url=ep.http_url, headers={"Authorization": f"Bearer {ep.token}"}, timeout=TIMEOUT_S
        )

    def step(self, ctx: Context, rng: random.Random) -> None:
        kind = rng.choices(["speech", "stream-vanish", "say"], [60, 10, 30])[0]
        voice = rng.choice([*ctx.voices, "alloy"])
        real_voice = ctx.voices[0] if voice == "alloy" else voice
        if kind == "say":
            self._say(ctx, rng, real_voice)
            return
        text = LONG if kind == "stream-vanish" else pick(ctx, rng, "http")
        fmt = rng.choice(["wav", "pcm", "flac", "mp3", "opus"])
        req = ctx.ledger.begin("http", f"{kind}-{fmt}", expect=[(real_voice, text)])
        req.tolerance_s = 0.15 if fmt in LOSSY else 0.01
        try:
            if kind == "stream-vanish":
                with self.sdk.audio.speech.with_streaming_response.create(
                    model="tts-1",
                    voice=voice,
                    input=text,
                    response_format=fmt,  # type: ignore[arg-type]
                ) as response:
                    next(response.iter_bytes(1024), None)
                ctx.ledger.abandon(req)
                return
            content = self.sdk.audio.speech.create(
                model="tts-1",
                voice=voice,
                input=text,
                response_format=fmt,  # type: ignore[arg-type]
            ).content
            ctx.ledger.end(req, "done", _decoded_s(content, fmt))
        except self.openai.APIStatusError as e:
            ctx.ledger.end(req, str(e.code or e.status_code))
        except Exception as e:  # no terminal event: a dead connection, a timeout
            _failed(ctx, req, e)

    def _say(self, ctx: Context, rng: random.Random, voice: str) -> None:
        text = pick(ctx, rng, "http")
        req = ctx.ledger.begin("http", "v1-say", expect=[(voice, text)])
        req.tolerance_s = 0.02
        try:
            r = self.http.post(
                "/v1/say", json={"text": text, "voice": voice, "id": req.id, "wait": True}
            )
            body = r.json()
            if "error" in body:
                ctx.ledger.end(req, body["error"].get("code", str(r.status_code)))
            else:
                ctx.ledger.end(req, body.get("status") if body.get("event") == "finished"
                               else body.get("code", "error"))  # fmt: skip
        except Exception as e:  # no terminal event: a dead connection, a timeout
            _failed(ctx, req, e)

    def close(self) -> None:
        self.http.close()
        self.sdk.close()
