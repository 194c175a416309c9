"""The daemon's face toward front-ends: build and validate requests, stop, cancel, status.

Every front-end goes through ``Control`` (never the engine or cache directly), so a JSON client,
an SSIP client and an MQTT publisher get the same validation and the same errors.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

from speakd.engines.base import Engine, SynthesisConfig
from speakd.messages import EventCallback, Priority, RequestError, SpeakRequest, validate_text
from speakd.scheduler import Scheduler

MAX_ID_CHARS = 128
# Engine sampling knobs a client may override, with their allowed ranges.
EXTRA_PARAMS: dict[str, tuple[float, float]] = {
    "temperature": (0.0, 2.0),
    "top_p": (0.0, 1.0),
    "top_k": (1, 626),
    "repetition_penalty": (1.0, 2.0),
    "max_new_token": (1, 4096),
    "min_new_token": (0, 4096),
    "noise_scale": (0.0, 2.0),
    "noise_w": (0.0, 2.0),
}


@dataclass
class Control:
    scheduler: Scheduler
    engine: Engine
    max_text_chars: int
    started: float = field(default_factory=time.monotonic)
    reloads: int = 0

    def voice_names(self) -> set[str]:
        return {v.name for v in self.engine.voices()} | {"default"}

    def build_request(
        self,
        fields: dict[str, Any],
        *,
        origin: str,
        client: str = "",
        on_event: EventCallback | None = None,
    ) -> SpeakRequest:
        """Validate a say request's fields (JSON/MQTT share the names) → SpeakRequest."""
        text = validate_text(fields.get("text"), self.max_text_chars)
        voice = fields.get("voice")
        if voice is not None and (not isinstance(voice, str) or voice not in self.voice_names()):
            known = ", ".join(sorted(self.voice_names()))
            raise RequestError("unknown_voice", f"unknown voice {voice!r} (known: {known})")
        priority = Priority.parse(fields.get("priority"))
        speed = _number(fields, "speed", 0.25, 4.0)
        volume = _number(fields, "volume", 0.0, 4.0)
        seed = fields.get("seed")
        if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool) or seed < 0):
            raise RequestError("bad_field", "seed must be a non-negative integer")
        params = fields.get("params") or {}
        if not isinstance(params, dict):
            raise RequestError("bad_field", "params must be an object")
        extra = {k: _number(params, k, *_range(k)) for k in params}
        config = SynthesisConfig(voice=voice, speed=speed, seed=seed, extra=extra)
        request = SpeakRequest(
            text=text,
            priority=priority,
            config=config,
            volume=1.0 if volume is None else volume,
            origin=origin,
            client=client,
            on_event=on_event,
            cache_only=bool(fields.get("cache_only", False)),
        )
        request_id = fields.get("id")
        if request_id is not None:
            if not isinstance(request_id, str | int) or isinstance(request_id, bool):
                raise RequestError("bad_field", "id must be a string")
            request_id = str(request_id)
            if not 0 < len(request_id) <= MAX_ID_CHARS or not request_id.isprintable():
                raise RequestError(
                    "bad_field", f"id must be 1..{MAX_ID_CHARS} printable characters"
                )
            request.id = request_id
        return request

    def say(self, request: SpeakRequest) -> None:
        self.scheduler.submit(request)

    def stop(self) -> int:
        return self.scheduler.stop()

    def cancel(self, request_id: str | None = None, client: str | None = None) -> int:
        return self.scheduler.cancel(request_id, client)

    def pause(self, client: str | None = None) -> None:
        self.scheduler.pause(client)

    def resume(self, client: str | None = None) -> bool:
        return self.scheduler.resume(client)

    def voices(self) -> list[dict[str, str]]:
        return [
            {"name": v.name, "language": v.language, "description": v.description}
            for v in self.engine.voices()
        ]

    def status(self) -> dict[str, Any]:
        return {
            **self.scheduler.status(),
            "engine": {
                "kind": self.engine.kind,
                "bundle": self.engine.bundle_id,
                "precision": self.engine.precision,
                "sample_rate": self.engine.sample_rate,
                "default_voice": self.engine.default_voice(),
            },
            "breaker": breaker.status()
            if (breaker := getattr(self.engine, "breaker", None))
            else None,
            "uptime_s": round(time.monotonic() - self.started, 1),
            "reloads": self.reloads,
        }


def _range(key: str) -> tuple[float, float]:
    if key not in EXTRA_PARAMS:
        raise RequestError(
            "bad_field", f"unknown param {key!r} (known: {', '.join(sorted(EXTRA_PARAMS))})"
        )
    return EXTRA_PARAMS[key]


def _number(fields: dict[str, Any], key: str, lo: float, hi: float) -> Any:
    value = fields.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise RequestError("bad_field", f"{key} must be a number")
    if isinstance(value, float) and not math.isfinite(value):  # (a huge int overflows isfinite)
        raise RequestError("bad_field", f"{key} must be a finite number")
    if not lo <= value <= hi:
        raise RequestError("bad_field", f"{key} must be within {lo}..{hi}, got {value}")
    return value
