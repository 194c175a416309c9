"""Syntheses run on threads that stay for the next one: the thread a new line needs is warm, a
synthesis never waits for another, and an idle worker never holds the process at exit."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

from speakd.request.messages import SpeakRequest
from speakd.request.resolver import Resolver
from speakd.request.stream import Cancel
from speakd.request.workers import SynthesisWorkers
from tests.tone_engine import ToneEngine
from tests.waits import wait_until


def test_a_synthesis_after_another_runs_on_the_thread_the_last_one_left() -> None:
    seen: list[threading.Thread] = []

    class Recording(ToneEngine):
        def synthesize(self, *args, **kw):  # type: ignore[no-untyped-def]
            seen.append(threading.current_thread())
            yield from super().synthesize(*args, **kw)

    resolver = Resolver(Recording(compute_s=0.0))
    for text in ("one two", "three four", "five six"):
        stream = resolver.open(SpeakRequest(text))
        assert b"".join(c.pcm for c in stream.read(Cancel()))
        stream.release()
        wait_until(lambda: all(not t.busy for t in seen), "the synthesis thread to be idle")
    assert len(seen) == 3 and seen[0] is seen[1] is seen[2]
    assert seen[0].daemon and seen[0].name.startswith("speakd-synth-")


def test_concurrent_calls_get_threads_of_their_own_and_an_error_keeps_the_thread() -> None:
    workers = SynthesisWorkers("test-synth")
    release = threading.Event()
    running: list[threading.Thread] = []

    def hold() -> None:
        running.append(threading.current_thread())
        release.wait(5)

    workers.start(hold)
    workers.start(hold)
    wait_until(lambda: len(running) == 2, "both calls to run at once")
    assert running[0] is not running[1] and workers.threads == 2
    release.set()
    wait_until(lambda: not any(t.busy for t in running), "both workers to be idle")

    def fail() -> None:
        raise RuntimeError("boom")

    workers.start(fail)
    wait_until(lambda: not any(t.busy for t in running), "the failing call to end")
    after: list[threading.Thread] = []
    workers.start(lambda: after.append(threading.current_thread()))
    wait_until(lambda: len(after) == 1, "the next call")
    assert after[0] in running and workers.threads == 2  # no new thread: the pool kept both


EXIT_WITH_WORKERS = """
import threading, time
from speakd.request.workers import WORKERS
from speakd.lifecycle.process import exit_now
writing = threading.Event()
WORKERS.start(writing.wait)  # busy until the second starts, then idle: the pool made two
WORKERS.start(lambda: (writing.set(), time.sleep(0.3), print("stored", flush=True)))  # a store
writing.wait()  # the store is in flight as the exit begins
print("threads", WORKERS.threads, flush=True)
exit_now(0)
"""


def test_exit_waits_for_a_busy_worker_and_not_for_an_idle_one() -> None:
    t0 = time.monotonic()
    r = subprocess.run(
        [sys.executable, "-c", EXIT_WITH_WORKERS], capture_output=True, text=True, timeout=30
    )
    assert r.returncode == 0, r.stderr
    assert "threads 2" in r.stdout and "stored" in r.stdout  # the busy one finished first
    assert "exiting without waiting" not in r.stderr
    # an idle worker is never joined: the exit does not sit out EXIT_GRACE_S (1 s) for it
    assert time.monotonic() - t0 < 0.9 + _startup_s()


def _startup_s() -> float:
    t0 = time.monotonic()
    subprocess.run([sys.executable, "-c", "import speakd.lifecycle.process"], check=True)
    return time.monotonic() - t0


def test_a_forked_child_synthesizes_on_threads_of_its_own() -> None:
    """The parent's idle workers do not exist in a child: handing one a call would hang."""
    import os

    resolver = Resolver(ToneEngine(compute_s=0.0))
    stream = resolver.open(SpeakRequest("warm the pool"))
    assert b"".join(c.pcm for c in stream.read(Cancel()))
    stream.release()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            child = resolver.open(SpeakRequest("said in the child"))
            give_up = Cancel()  # a hung hand-over would block the read for good
            threading.Timer(10, give_up.set).start()
            code = 0 if b"".join(c.pcm for c in child.read(give_up)) else 1
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
