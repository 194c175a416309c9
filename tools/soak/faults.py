"""The faults, injected one at a time on a schedule while the traffic runs. Each returns what
happened; the requests a fault sends itself are in the ledger under ``faults``."""

from __future__ import annotations

import resource
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from speakd.library.client import Client

from .daemon import MAX_QUEUE, Supervised, cache_check, upgrade
from .device import FifoDevice
from .faulty import CRASH, HANG
from .ledger import Ledger
from .mosquitto import Mosquitto

ORDER = ("reload", "crash", "broker", "device", "hang", "disk_full", "term", "upgrade", "kill")
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
    burst: Callable[[int, str], int]  # MQTT says at once, returns once each is acknowledged
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
        """SIGKILL mid-traffic, just after a burst of MQTT says larger than the queue was
        acknowledged (the replay must queue every one); the cache checked while the daemon is
        down; restarted as a supervisor would, then warmed up again before its baseline."""
        return self._restart("kill", burst=MAX_QUEUE + 4)

    def fault_term(self) -> tuple[bool, str]:
        """SIGTERM mid-traffic (``systemctl restart``): exit 0, and the MQTT says it cut short
        are spoken after the start."""
        return self._restart("term")

    def fault_upgrade(self) -> tuple[bool, str]:
        """A package upgrade: every file of the running daemon replaced, then the restart."""
        return self._restart("upgrade")

    def _restart(self, how: str, burst: int = 0) -> tuple[bool, str]:
        """The first stop of a cycle ends a process with a baseline: its idle end is sampled;
        the later ones (no baseline taken) stop mid-traffic at once."""
        if how == "term":
            self.settle("end")
        self.ledger.open()
        time.sleep(2.0)  # traffic in flight when the signal lands
        self.ledger.close()  # the burst fills the queue: no new spd-say meets it (see _drained)
        sent = self.burst(burst, f"Burst number {self.count}.") if burst else 0
        down = time.monotonic()
        self.ledger.kills.append((down, float("inf")))
        replaced, code = upgrade(self.daemon.layout.lib) if how == "upgrade" else 0, None
        if how == "kill":
            self.daemon.kill()
        else:
            code = self.daemon.terminate()
        check = cache_check(self.daemon.layout.cache, self.pinned)
        self.cache_checks.append({"after": f"{how} {len(self.ledger.kills)}", **check})
        start_s = self.daemon.start()
        if burst:  # live requests are refused while the replay holds more than the queue
            self._drained()
        self.ledger.kills[-1] = (down, time.monotonic())
        self.ledger.open()
        if how == "kill":  # the last fault of a cycle: the new process's baseline
            time.sleep(self.rewarm_s)
            self.settle("baseline")
        ok = check["integrity"] == ["ok"] and not check["pinned_missing"]
        ok &= how == "kill" or code == 0
        detail = f"integrity {check['integrity'][:3]}, {len(check['pinned_missing'])} pinned "
        detail += f"missing, serving again after {start_s:.1f} s"
        detail += f", {sent} MQTT says acknowledged just before" if burst else ""
        detail += f", {replaced} files replaced" if replaced else ""
        return ok, detail + ("" if how == "kill" else f", exit {code}")

    def _drained(self, timeout: float = 300.0) -> None:
        """Until the replay has played out (``spd-say`` cannot tell a refusal from a failure,
        so the traffic waits rather than meet a queue the replay holds full)."""
        deadline = time.monotonic() + timeout
        while self.daemon.status()["queue_length"] and time.monotonic() < deadline:
            time.sleep(0.2)


def _outcomes(outcomes: list[str | None]) -> str:
    last, before = f"outcome {outcomes[-1]}", ", ".join(map(str, outcomes[:-1]))
    return f"{last} (before it: {before})" if before else last
