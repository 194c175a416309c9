"""The faults, injected one at a time on a schedule while the traffic runs. Each returns what
happened; the requests a fault sends itself are in the ledger under ``faults``."""

from __future__ import annotations

import resource
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from speakd.library.client import Client

from .daemon import Supervised, cache_check
from .device import FifoDevice
from .faulty import CRASH, HANG
from .ledger import Ledger
from .mosquitto import Mosquitto

ORDER = ("reload", "crash", "broker", "device", "hang", "disk_full", "kill")
DEVICE_GONE_S = 3.0
BROKER_DOWN_S = 1.0
DISK_FULL_S = 8.0
DISK_FULL_AT = 65536  # bytes: the WAL and the database cannot be written past this
PROBE_TRIES = 5  # says of a crash or hang probe before a traffic stop each time is a failure


@dataclass
class Faults:
    daemon: Supervised
    broker: Mosquitto
    device: FifoDevice
    ledger: Ledger
    config: Callable[[int], str]  # variant → the daemon's TOML
    pinned: set[str]
    voices: list[str]
    settle: Callable[[str], None]  # quiet point: "end" of an incarnation or its "baseline"
    rewarm_s: float
    variant: int = 0
    count: int = 0
    cache_checks: list[dict[str, Any]] = field(default_factory=list)

    def run(self, name: str) -> dict[str, Any]:
        self.count += 1
        t0 = time.monotonic()
        try:
            ok, detail = getattr(self, f"fault_{name}")()
        except Exception as e:  # a fault that could not be injected is a failed fault
            ok, detail = False, f"{type(e).__name__}: {e}"
        return {
            "fault": name,
            "ok": ok,
            "detail": detail,
            "took_s": round(time.monotonic() - t0, 1),
        }

    def _say(self, kind: str, text: str, voice: str | None = None) -> str | None:
        req = self.ledger.begin("faults", kind)
        try:
            with Client(self.daemon.layout.socket, timeout=300) as c:
                fields = {"text": text, "id": req.id, "priority": "important"}
                fields.update({"voice": voice} if voice else {})
                last = list(c.say(fields, wait=True))[-1]
            outcome = last["status"] if last["event"] == "finished" else last.get("code")
        except Exception as e:
            req.note = f"{type(e).__name__}: {e}"
            outcome = None
        self.ledger.end(req, outcome)
        return outcome

    def fault_reload(self) -> tuple[bool, str]:
        """``systemctl reload``: a changed config and SIGHUP."""
        self.variant += 1
        self.daemon.layout.config.write_text(self.config(self.variant))
        ok = self.daemon.reload()
        return ok, f"config variant {self.variant}: " + ("reloaded" if ok else "no reload seen")

    def _probe(self, kind: str, text: str) -> list[str | None]:
        """Say ``text`` until the fault shows: a say that the traffic's own ``stop`` (which the
        clients send at any time) ended first has not met the fault yet, so it is sent again."""
        outcomes = [self._say(kind, text)]
        while outcomes[-1] == "stopped" and len(outcomes) < PROBE_TRIES:
            outcomes.append(self._say(kind, text))
        return outcomes

    def fault_crash(self) -> tuple[bool, str]:
        outcomes = self._probe("engine-crash", f"{CRASH} number {self.count}.")
        return outcomes[-1] in ("internal_error", "engine_unavailable"), _outcomes(outcomes)

    def fault_hang(self) -> tuple[bool, str]:
        outcomes = self._probe("engine-hang", f"{HANG} number {self.count}.")
        return outcomes[-1] in ("engine_timeout", "engine_unavailable"), _outcomes(outcomes)

    def fault_broker(self) -> tuple[bool, str]:
        self.broker.stop()
        time.sleep(BROKER_DOWN_S)
        self.broker.start()
        return True, f"mosquitto down {BROKER_DOWN_S} s"

    def fault_device(self) -> tuple[bool, str]:
        self.device.unplug()
        time.sleep(DEVICE_GONE_S)
        self.device.plug()
        return True, f"device unplugged {DEVICE_GONE_S} s"

    def fault_disk_full(self) -> tuple[bool, str]:
        """No file may be written past DISK_FULL_AT bytes (RLIMIT_FSIZE on the daemon, SIGXFSZ
        ignored there: such writes fail with EFBIG, as on a full disk; its log is a pipe) while
        misses are synthesised: they must still play (or be ended by the traffic's own ``stop``,
        which the clients send at any time), and no clip may be lost."""
        pid = self.daemon.pid
        before = self.daemon.status()["source"]["cache"].get("errors", 0)
        _, hard = resource.prlimit(pid, resource.RLIMIT_FSIZE)
        resource.prlimit(pid, resource.RLIMIT_FSIZE, (DISK_FULL_AT, hard))
        try:
            ends = [self._say("disk-full-miss", f"The disk is full, message {self.count}.{i}.",
                              self.voices[i % len(self.voices)]) for i in range(2)]  # fmt: skip
            time.sleep(DISK_FULL_S)
        finally:
            resource.prlimit(pid, resource.RLIMIT_FSIZE, (hard, hard))
        errors = self.daemon.status()["source"]["cache"].get("errors", 0) - before
        ok = all(e in ("done", "stopped") for e in ends)
        return ok, f"misses {ends}, cache write errors +{errors}"

    def fault_kill(self) -> tuple[bool, str]:
        """SIGKILL mid-traffic; the cache checked while the daemon is down; restarted as a
        supervisor would, then warmed up again before its baseline."""
        self.settle("end")
        self.ledger.open()
        time.sleep(2.0)  # traffic in flight when the kill lands
        self.ledger.close()
        killed = time.monotonic()
        self.ledger.kills.append((killed, float("inf")))
        self.daemon.kill()
        check = cache_check(self.daemon.layout.cache, self.pinned)
        self.cache_checks.append({"after": f"kill {len(self.ledger.kills)}", **check})
        start_s = self.daemon.start()
        self.ledger.kills[-1] = (killed, time.monotonic())
        self.ledger.open()
        time.sleep(self.rewarm_s)
        self.settle("baseline")
        ok = check["integrity"] == ["ok"] and not check["pinned_missing"]
        return ok, (
            f"integrity {check['integrity'][:3]}, {len(check['pinned_missing'])} pinned missing, "
            f"serving again after {start_s:.1f} s"
        )


def _outcomes(outcomes: list[str | None]) -> str:
    last, before = f"outcome {outcomes[-1]}", ", ".join(map(str, outcomes[:-1]))
    return f"{last} (before it: {before})" if before else last
