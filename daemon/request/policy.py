"""Queue policy as pure functions: (queue state, new request) → decision. No threads, no clocks.

SSIP's rules: important > message > text > notification (progress counts as notification).
- important interrupts whatever non-important speech is playing;
- text replaces pending text, and playing text;
- a notification is spoken only when nothing else is: it replaces pending notifications and is
  discarded while anything plays or waits; anything new interrupts a playing notification;
- the queue is bounded, ids are unique, and nothing is admitted while shutting down.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from speakd.request.messages import Priority


@dataclass(frozen=True)
class Entry:
    """What the policy needs to know of a queued or playing request."""

    id: str
    priority: Priority
    seq: int = 0


@dataclass(frozen=True)
class QueueState:
    pending: Sequence[Entry]
    current: Entry | None = None
    max_queue: int = 32
    closing: bool = False


@dataclass(frozen=True)
class Decision:
    reject: tuple[str, str] | None = None  # (error code, message): the new request is refused
    replace: tuple[str, ...] = ()  # pending ids dropped with status "replaced"
    interrupt: str | None = None  # the current request ends with this status
    discard: bool = False  # the new request ends at once, "discarded"


def decide(state: QueueState, new: Entry) -> Decision:
    if state.closing:
        return Decision(reject=("shutting_down", "speakd is shutting down"))
    everyone = [*state.pending, *([state.current] if state.current else [])]
    if any(e.id == new.id for e in everyone):
        return Decision(reject=("duplicate_id", f"a request with id {new.id!r} is already queued"))
    if len(state.pending) >= state.max_queue:
        return Decision(
            reject=("queue_full", f"queue is full ({state.max_queue} pending); try again later")
        )
    p, current = new.priority, state.current
    if p >= Priority.NOTIFICATION:
        replace = tuple(e.id for e in state.pending if e.priority >= Priority.NOTIFICATION)
        others = len(state.pending) > len(replace)
        return Decision(replace=replace, discard=current is not None or others)
    replace = tuple(e.id for e in state.pending if e.priority == Priority.TEXT and p == p.TEXT)
    if current is None:
        return Decision(replace=replace)
    interrupts = (
        (p == Priority.IMPORTANT and current.priority != Priority.IMPORTANT)
        or (p == Priority.TEXT and current.priority == Priority.TEXT)
        or current.priority >= Priority.NOTIFICATION
    )
    status = ("replaced" if p == Priority.TEXT else "interrupted") if interrupts else None
    return Decision(replace=replace, interrupt=status)


def next_entry(pending: Sequence[Entry]) -> Entry | None:
    """The most urgent pending request, first come first served within a priority."""
    return min(pending, key=lambda e: (int(e.priority), e.seq), default=None)
