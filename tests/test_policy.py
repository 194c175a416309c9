"""The queue policy as a table: (queue state, new request) → decision, no threads, no sleeps."""

from __future__ import annotations

import pytest

from speakd.request.messages import Priority
from speakd.request.policy import Decision, Entry, QueueState, decide, next_entry

I, M, T, N, P = (  # noqa: E741 (the priorities' initials)
    Priority.IMPORTANT,
    Priority.MESSAGE,
    Priority.TEXT,
    Priority.NOTIFICATION,
    Priority.PROGRESS,
)


def q(*priorities: Priority) -> list[Entry]:
    return [Entry(f"p{i}", p, i) for i, p in enumerate(priorities)]


def cur(p: Priority) -> Entry:
    return Entry("cur", p, -1)


# (pending, current, new) → (replaced pending ids, interrupt status, discarded)
TABLE = [
    # nothing playing: everything is queued, text replaces pending text only
    ((), None, I, (), None, False),
    (q(T, M), None, T, ("p0",), None, False),
    (q(T, T, M), None, M, (), None, False),
    # important interrupts anything but important
    ((), cur(M), I, (), "interrupted", False),
    ((), cur(T), I, (), "interrupted", False),
    ((), cur(I), I, (), None, False),
    # text replaces playing text, not a message
    ((), cur(T), T, (), "replaced", False),
    ((), cur(M), T, (), None, False),
    (q(T), cur(M), T, ("p0",), None, False),
    # a message waits its turn, except behind a notification
    ((), cur(M), M, (), None, False),
    ((), cur(N), M, (), "interrupted", False),
    ((), cur(P), T, (), "replaced", False),
    # notifications: spoken only into silence, the newest replaces pending ones
    ((), None, N, (), None, False),
    (q(N), None, N, ("p0",), None, False),
    (q(N, M), None, P, ("p0",), None, True),
    ((), cur(T), N, (), None, True),
    ((), cur(N), N, (), None, True),
]


@pytest.mark.parametrize(("pending", "current", "new", "replace", "interrupt", "discard"), TABLE)
def test_policy_table(pending, current, new, replace, interrupt, discard) -> None:
    decision = decide(QueueState(pending, current), Entry("new", new, 99))
    assert decision == Decision(replace=replace, interrupt=interrupt, discard=discard)


@pytest.mark.parametrize(
    ("state", "new_id", "code"),
    [
        (QueueState(q(M), closing=True), "new", "shutting_down"),
        (QueueState(q(M)), "p0", "duplicate_id"),
        (QueueState([], cur(M)), "cur", "duplicate_id"),
        (QueueState(q(M, M), max_queue=2), "new", "queue_full"),
    ],
)
def test_admission(state: QueueState, new_id: str, code: str) -> None:
    decision = decide(state, Entry(new_id, Priority.IMPORTANT))
    assert decision.reject is not None and decision.reject[0] == code
    assert (decision.replace, decision.interrupt, decision.discard) == ((), None, False)


def test_next_is_most_urgent_then_first_come() -> None:
    pending = [Entry("t", T, 0), Entry("m2", M, 2), Entry("m1", M, 1), Entry("n", N, 3)]
    assert next_entry(pending) == Entry("m1", M, 1)
    assert next_entry([]) is None
