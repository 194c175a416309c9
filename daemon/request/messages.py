"""What front-ends hand to the scheduler, and the events that flow back to them.

Front-ends translate their protocol (JSON lines, SSIP, MQTT) into a validated ``SpeakRequest``
and turn ``Event``s back into their own replies; they never see the engine or the cache.
"""

from __future__ import annotations

import enum
import itertools
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from speakd.engines.base import EngineError, SynthesisConfig, UnknownVoiceError
from speakd.request.errors import InputWarning, RequestError

if TYPE_CHECKING:
    from speakd.request.prepare import Prepared


class Priority(enum.IntEnum):
    """SSIP's priorities, highest first (lower value = more urgent)."""

    IMPORTANT = 0
    MESSAGE = 1
    TEXT = 2
    NOTIFICATION = 3
    PROGRESS = 4  # SSIP's; treated like NOTIFICATION

    @classmethod
    def parse(cls, value: str | None) -> Priority:
        if value is None or value == "":
            return cls.TEXT
        try:
            return cls[str(value).upper()]
        except KeyError:
            names = ", ".join(p.name.lower() for p in cls)
            raise RequestError(
                "bad_priority", f"unknown priority {value!r} (one of {names})"
            ) from None


_ids = itertools.count(1)


def new_request_id() -> str:
    return f"r{int(time.time() * 1000) % 10**9:09d}-{next(_ids)}"


EventCallback = Callable[["Event"], None]


@dataclass
class SpeakRequest:
    """A request in the daemon: what the client asked (``text``, ``config``), how it is queued, and
    once a front-end has validated it, what it means (``prepared``, ``speakd.request.prepare``)."""

    text: str
    id: str = field(default_factory=new_request_id)
    priority: Priority = Priority.TEXT
    config: SynthesisConfig = field(default_factory=SynthesisConfig)
    volume: float = 1.0
    origin: str = ""  # "json:uid=1000", "ssip:…", "mqtt:…" — for logs
    client: str = ""  # a connection/client key: SSIP CANCEL SELF acts on it
    on_event: EventCallback | None = None  # called on the event loop thread
    cache_only: bool = False
    fresh: bool = False  # made anew whatever the cache holds (the page's re-synthesize)
    words: bool = False  # the caller wants a ``word`` event as playback reaches each word
    received: float = field(default_factory=time.monotonic)
    prepared: Prepared | None = None
    warnings: tuple[InputWarning, ...] = ()  # what is skipped, not refused (Control)


class EventType(enum.StrEnum):
    QUEUED = "queued"
    STARTED = "started"
    FINISHED = "finished"  # terminal: status "done" | "cancelled" | "interrupted"
    ERROR = "error"  # terminal
    PAUSED = "paused"  # playback held mid-utterance by a pause (SSIP PAUSE)
    RESUMED = "resumed"
    MARK = "mark"  # playback reached an SSML <mark>: its name and offset in samples
    WORD = "word"  # playback reached a word (asked with ``words``): ``Word.event``
    SENTENCE = "sentence"  # the same for a sentence, from an engine without word timings
    WARNING = "warning"  # part of the request is skipped, the rest spoken: its code and message


@dataclass(frozen=True)
class Event:
    type: EventType
    request_id: str
    data: dict[str, Any] = field(default_factory=dict)

    @property
    def terminal(self) -> bool:
        return self.type in (EventType.FINISHED, EventType.ERROR)

    def to_dict(self) -> dict[str, Any]:
        return {"event": self.type.value, "id": self.request_id, **self.data}


def parse_json(text: str) -> Any:
    """``json.loads`` for untrusted input: every failure is a ``bad_json`` RequestError — not only
    syntax, also nesting past the parser's recursion limit and integers too long to convert."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise RequestError("bad_json", f"not JSON: {e.msg} at column {e.colno}") from None
    except RecursionError:
        raise RequestError("bad_json", "not usable JSON: nested too deeply") from None
    except ValueError as e:  # int_max_str_digits
        raise RequestError("bad_json", f"not usable JSON: {str(e).split(':')[0]}") from None


def dump_json(obj: Any) -> bytes:
    """Compact UTF-8 JSON. A lone surrogate echoed from a client's ``\\ud800`` escape cannot be
    UTF-8 encoded: it goes out as that same JSON escape instead of failing the reply."""
    text = json.dumps(obj, ensure_ascii=False, separators=(",", ":"))
    return text.encode("utf-8", "backslashreplace")


def validate_text(text: Any, max_chars: int) -> str:
    """Shared by every front-end so each rejects bad text the same way."""
    if not isinstance(text, str):
        raise RequestError("bad_text", "text must be a string")
    if "\x00" in text:
        raise RequestError("bad_text", "text contains a NUL character")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate (JSON "\ud800"): not text an engine can read
        raise RequestError("bad_text", "text contains a lone UTF-16 surrogate") from None
    stripped = text.strip()
    if not stripped:
        raise RequestError("empty_text", "text is empty")
    if len(stripped) > max_chars:
        raise RequestError(
            "text_too_long", f"text has {len(stripped)} characters, the limit is {max_chars}"
        )
    return stripped


def error_data(e: BaseException) -> dict[str, Any]:
    """An error event's ``code`` and ``message`` for any failure of a request, the same for every
    front-end: a refused request keeps its code, an engine error names its own (``not_cached``,
    ``engine_timeout``…), anything else is an internal error."""
    if isinstance(e, RequestError):
        return {"code": e.code, "message": str(e)}
    if isinstance(e, UnknownVoiceError):
        return {"code": "unknown_voice", "message": str(e)}
    if isinstance(e, EngineError):
        return {"code": getattr(e, "code", "synthesis_failed"), "message": str(e)}
    return {"code": "internal_error", "message": f"{type(e).__name__}: {e}"}
