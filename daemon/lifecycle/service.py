"""``speakd serve``: load the ``[engine]`` voice and read the others (speakd.request.voices), start
the scheduler and the listeners, then tell systemd.

READY=1 goes out only after the model is loaded and every listener is up; WATCHDOG=1 is sent from
the event loop itself, so a wedged loop stops the pings and systemd restarts the daemon. SIGHUP
reloads the config and rescans ``voices.dir`` (the [engine] model is reloaded only when its section
changed; voices still there stay loaded); SIGTERM stops speech and exits 0. While a model loads,
EXTEND_TIMEOUT_USEC keeps systemd's start (or reload) timeout from firing on a slow board; STATUS=
follows what the daemon does. The cache's page index is built after READY (cache/indexing.py)."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from speakd.audio import AudioChunk, join_chunks
from speakd.audio.sinks import Sink, make_sink
from speakd.cache.packs import adopt_versions
from speakd.cache.versions import PackVersions
from speakd.config import Config, ConfigError, EngineConfig
from speakd.control import Control
from speakd.control.metrics import Metrics
from speakd.engines import load_engine
from speakd.engines.base import Engine
from speakd.frontends.http.frontend import HttpFrontend
from speakd.frontends.jsonlines import JsonLinesFrontend
from speakd.frontends.mqtt.frontend import MqttFrontend
from speakd.frontends.ssip import keys as ssip_keys
from speakd.frontends.ssip.frontend import SsipFrontend
from speakd.frontends.unixserver import AccessPolicy, start_unix_server
from speakd.frontends.wyoming.frontend import WyomingFrontend
from speakd.lifecycle.changes import model_changed, mqtt_changed, sink_changed
from speakd.lifecycle.daemon_config import load_daemon_config
from speakd.lifecycle.loopcare import LoopCare
from speakd.lifecycle.notify import keep_notifying, listen_fds, notify, watchdog_interval
from speakd.lifecycle.process import exit_now, install_debug_wedge, memory_guard
from speakd.markup.lexicon import Lexicon, LexiconError
from speakd.mqtt.journal import Journal
from speakd.request.breaker import CircuitBreaker, Guard
from speakd.request.messages import SpeakRequest
from speakd.request.resolver import Resolver
from speakd.request.scheduler import Scheduler
from speakd.request.voices import VoiceLibrary, build_library

log = logging.getLogger(__name__)

LOAD_EXTEND_S = 20.0  # while a model loads, ask systemd for this much more time, twice per period
LOAD_EXTEND_MAX_S = 600.0  # a load still running after this is stuck: stop extending
FALLBACK_RETRY_S = (5.0, 30.0, 120.0, 600.0, 0.0)  # waits after failed fallback attempts


@dataclass
class Daemon:
    config: Config
    config_path: Path | None = None
    guard: Guard | None = None
    control: Control | None = None
    mqtt: MqttFrontend | None = None
    journal: Journal | None = None  # MQTT says not yet spoken; one for every MqttFrontend
    versions: PackVersions | None = None  # signed pack versions, in the state directory
    wyoming: WyomingFrontend | None = None
    http: HttpFrontend | None = None
    metrics: Metrics | None = None
    servers: list[asyncio.AbstractServer] = field(default_factory=list)
    _stopping: asyncio.Event = field(default_factory=asyncio.Event)
    _tasks: list[asyncio.Task[Any]] = field(default_factory=list)
    _owned_paths: list[Path] = field(default_factory=list)  # sockets we bound (not inherited)
    _exit_code: int = 0
    _halt: threading.Event = field(default_factory=threading.Event)  # stops background synthesis
    _reload_lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        # The [engine] voice loads before READY; only the library holds it (unloaded, it is freed)
        library = await self._library(self.config, await _load_engine(self.config.engine))
        self.guard = make_guard(self.config.engine)
        scheduler = self._make_scheduler(library)
        self.versions = PackVersions.in_state_dir(self.config.state.dir)
        if scheduler.resolver.store is not None:  # before any pack can arrive
            await asyncio.to_thread(adopt_versions, scheduler.resolver.store, self.versions)
        self._prepare_fallback(scheduler, self.config.engine.fallback_text)
        limits = self.config.limits
        self.control = Control(
            scheduler, limits.max_text_chars, limits.max_streams, limits.stream_wait_s
        )
        self.control.lexicon = _lexicon(self.config)
        self.metrics = Metrics(self.control)
        self.guard.on_synthesis = self.metrics.synthesis
        self._tasks.append(asyncio.create_task(scheduler.run(), name="scheduler"))
        await self._start_listeners()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._stopping.set)
        loop.add_signal_handler(signal.SIGHUP, self._on_sighup)
        install_debug_wedge(loop)
        self._tasks.append(asyncio.create_task(self._memory_guard(), name="memory-guard"))
        if os.environ.get("NOTIFY_SOCKET"):
            notifier = keep_notifying(watchdog_interval(), self._status_line)
            self._tasks.append(asyncio.create_task(notifier, name="notifier"))
        self.control.loop = LoopCare(self.control.idle)  # after start-up's allocations
        self._tasks += self.control.loop.start()
        notify("READY=1", f"STATUS={self._status_line()}")
        log.info("speakd ready: %s", self._status_line())
        self._tasks.append(asyncio.create_task(self.control.index_cache(self._halt), name="index"))
        if self.config.socket.ssip_path and self.config.ssip.prewarm_keys:  # after READY
            prewarm = ssip_keys.prewarm(self.control, self.config.ssip, self._halt)
            self._tasks.append(asyncio.create_task(prewarm, name="key-echo"))
        await self._stopping.wait()
        await self.shutdown()
        return self._exit_code

    @staticmethod
    async def _replace_sink(scheduler: Scheduler, sink: Sink) -> None:
        old = scheduler.replace_sink(sink)
        if old is not None:
            await asyncio.to_thread(old.close)

    def _prepare_fallback(self, scheduler: Scheduler, text: str) -> None:
        """Make the fallback prompt in the background: a cache hit in a few ms, a synthesis on a
        first run — either way READY does not wait for it."""

        async def prepare() -> None:
            for delay in FALLBACK_RETRY_S:  # a busy or briefly failing engine gets more tries
                audio = await asyncio.to_thread(
                    _fallback_audio, scheduler.resolver, text, self._halt
                )
                if audio is not None:  # a failed attempt keeps the previous prompt
                    scheduler.fallback = audio
                    return
                if self._halt.is_set():
                    return
                await asyncio.sleep(delay)

        self._tasks.append(asyncio.create_task(prepare(), name="fallback"))

    @staticmethod
    async def _library(
        config: Config, engine: Engine | None, previous: VoiceLibrary | None = None
    ) -> VoiceLibrary:
        """The voices the config names (the folder is read on a worker thread), voices still
        loaded in ``previous`` kept loaded, ``voices.preload`` loaded."""
        library = await asyncio.to_thread(build_library, config, engine, previous)
        for name in config.voices.preload:
            await asyncio.to_thread(library.load, name)
        log.info(
            "voices: %s (default %s)%s",
            ", ".join(library.by_name),
            library.default,
            f"; {len(library.problems)} left out (see above)" if library.problems else "",
        )
        return library

    def _make_scheduler(self, library: VoiceLibrary) -> Scheduler:
        audio = self.config.audio
        assert self.guard is not None
        return Scheduler(
            Resolver.from_config(library, self.config.cache, self.guard),
            make_sink(audio),
            max_queue=self.config.limits.max_queue,
            block_ms=audio.block_ms,
            volume=audio.volume,
            tail_ms=audio.tail_ms,
        )

    async def _start_listeners(self) -> None:
        assert self.control is not None
        inherited = listen_fds()
        json_frontend = JsonLinesFrontend(self.control, self.config.limits.max_line_bytes)
        await self._listen(
            json_frontend.handle,
            self.config.socket.path,
            inherited.pop("json", None),
            JsonLinesFrontend.REFUSAL,
        )
        if self.config.socket.ssip_path:
            ssip_frontend = SsipFrontend(self.control, self.config.limits.max_line_bytes)
            await self._listen(
                ssip_frontend.handle,
                self.config.socket.ssip_path,
                inherited.pop("ssip", None),
                SsipFrontend.REFUSAL,
            )
        for name in inherited:
            log.warning("ignoring inherited socket %r (known names: json, ssip)", name)
        if self.config.mqtt.enabled:
            await self._open_journal()
            await self._start_mqtt(self._mqtt_frontend(self.config), replay=True)
        await self._start_wyoming()
        if self.config.http.listen:
            self.http = HttpFrontend(self.control, self.config.http, self.metrics)
            await self.http.start()

    async def _open_journal(self) -> None:
        """The MQTT journal is state ([state] dir) and outlives reloads (mqtt/journal/); one
        left beside the cache by an older version is moved in. Opened off the loop."""
        assert self.control is not None
        if self.journal is None:
            path = Path(self.config.state.dir) / "mqtt-journal.db"
            legacy = Path(self.config.cache.path).parent / "mqtt-journal.db"
            self.journal = await asyncio.to_thread(Journal, path, legacy)
            self.control.mqtt_journal = self.journal.status

    def _mqtt_frontend(self, config: Config) -> MqttFrontend:
        assert self.control is not None and self.journal is not None
        return MqttFrontend(
            self.control,
            config.mqtt,
            config.limits,
            config.fleet,
            journal=self.journal,
            versions=self.versions,
        )

    async def _start_mqtt(self, frontend: MqttFrontend, replay: bool = False) -> None:
        """MQTT runs beside the sockets; a configured remote speaker replaces the local sink.
        ``replay``: at start, the says journaled before a crash are queued first."""
        assert self.control is not None
        self.mqtt = frontend
        if frontend.speaker is not None:
            await self._replace_sink(self.control.scheduler, frontend.speaker)
        await frontend.start(replay)

    async def _start_wyoming(self) -> None:
        """(Re)start the Wyoming server when [wyoming] changed (its info follows the engine)."""
        assert self.control is not None
        wanted, limits = self.config.wyoming, self.config.limits
        if self.wyoming is not None:
            if self.wyoming.config == wanted:
                return
            await self.wyoming.close()
            self.wyoming = None
        if wanted.uri:
            self.wyoming = WyomingFrontend(
                self.control,
                wanted,
                max_event_bytes=limits.max_line_bytes,
                max_pending=limits.max_queue,
                socket_mode=self.config.socket.mode_bits,
            )
            await self.wyoming.start()

    async def _listen(self, handler: Any, path: str, inherited: Any, refusal: bytes = b"") -> None:
        sock = self.config.socket
        server = await start_unix_server(
            handler,
            path,
            mode=sock.mode_bits,
            group=sock.group,
            inherited=inherited,
            limit=self.config.limits.max_line_bytes,
            policy=AccessPolicy(tuple(sock.allow_uids), tuple(sock.allow_gids)),
            refusal=refusal,
        )
        self.servers.append(server)
        if inherited is None:
            self._owned_paths.append(Path(path))

    def _status_line(self) -> str:
        """One line for `systemctl status`: what it is doing, then what it serves."""
        assert self.control is not None
        state = self.control.scheduler.status()
        doing = f"{state['state']} {state['current']}" if state["current"] else "idle"
        if state["queue_length"]:
            doing += f", {state['queue_length']} queued"
        library = self.control.library
        loaded = sum(1 for v in library.by_bundle.values() if v.engine is not None)
        return (
            f"{doing}; {len(library.by_bundle)} voices ({loaded} loaded), default "
            f"{library.default} on {self.config.socket.path}"
        )

    async def _memory_guard(self) -> None:
        """Over limits.max_rss_mb, speakd stops cleanly with exit 1 and systemd restarts it."""
        await memory_guard(lambda: self.config.limits.max_rss_mb)
        self._exit_code = 1
        self._stopping.set()

    def _on_sighup(self) -> None:
        if self._stopping.is_set():
            log.info("SIGHUP ignored: shutting down")
            return
        self._tasks.append(asyncio.create_task(self.reload(), name="reload"))

    async def reload(self) -> None:
        """SIGHUP: re-read the config; keep the loaded model unless the model keys changed.

        Reloads run one at a time; whatever fails, systemd hears READY=1 again and the daemon
        keeps serving with the configuration it had.
        """
        async with self._reload_lock:
            notify("RELOADING=1", "STATUS=reloading configuration")
            try:
                await self._reload()
            except Exception as e:
                log.error("reload failed, keeping the running configuration: %s", e)
                notify("READY=1", f"STATUS=reload failed: {e}")

    async def _reload(self) -> None:
        assert self.control is not None
        new = load_daemon_config(self.config_path)
        lexicon = _lexicon(new)  # read again: an edited file applies from now on
        guard = self.guard
        new_model = model_changed(self.config.engine, new.engine)
        # the [engine] voice as it is now (None when unloaded: it is described again)
        engine = self.control.library.primary.engine
        if new_model:
            engine = await _load_engine(new.engine)
        if new.engine != self.config.engine:  # a new model, or new watchdog/breaker settings
            guard = make_guard(new.engine)
            guard.on_synthesis = self.metrics.synthesis if self.metrics else None
        if (new.socket, new.limits.max_line_bytes) != (
            self.config.socket,
            self.config.limits.max_line_bytes,
        ):
            log.warning("[socket] and limits.max_line_bytes changes take effect after a restart")
        scheduler = self.control.scheduler
        mqtt: MqttFrontend | None = None
        if mqtt_changed(self.config, new) or (
            self.mqtt is not None and self.mqtt.credentials_changed()
        ):
            # Made before the old one closes: says in flight report through it (see close).
            if new.mqtt.enabled:
                await self._open_journal()
            mqtt = self._mqtt_frontend(new) if new.mqtt.enabled else None
            if self.mqtt is not None:
                await self.mqtt.close(successor=mqtt)
            self.mqtt = None
        if sink_changed(self.config, new):
            await self._replace_sink(scheduler, make_sink(new.audio))
        assert guard is not None
        library = await self._library(new, engine, self.control.library)
        old_resolver = scheduler.resolver
        resolver = await asyncio.to_thread(  # prewarm reads from disk
            Resolver.from_config, library, new.cache, guard, old_resolver.store
        )
        scheduler.resolver = resolver
        await asyncio.to_thread(old_resolver.close, resolver)
        self._tasks.append(asyncio.create_task(self.control.index_cache(self._halt), name="index"))
        if new_model or new.engine.fallback_text != self.config.engine.fallback_text:
            self._prepare_fallback(scheduler, new.engine.fallback_text)
        scheduler.max_queue = new.limits.max_queue
        scheduler.block_ms, scheduler.volume = new.audio.block_ms, new.audio.volume
        scheduler.tail_ms = new.audio.tail_ms
        self.config, self.guard = new, guard
        self.control.max_text_chars = new.limits.max_text_chars
        self.control.max_streams = new.limits.max_streams
        self.control.stream_wait_s = new.limits.stream_wait_s
        self.control.lexicon = lexicon
        self.control.reloads += 1
        if mqtt is not None:
            await self._start_mqtt(mqtt)
        await self._start_wyoming()
        if self.http is not None:
            self.http.reconfigure(new.http)
        elif new.http.listen:
            log.warning("http.listen changes take effect after a restart")
        log.info("configuration reloaded (%d)", self.control.reloads)
        if self.control.loop is not None:  # the probe and the collector go on
            self.control.loop.freeze()  # what the reload made is frozen
        notify("READY=1", f"STATUS={self._status_line()}")

    async def shutdown(self) -> None:
        notify("STOPPING=1", "STATUS=stopping")
        self._halt.set()
        log.info("stopping")
        for server in self.servers:
            server.close()
        if self.wyoming is not None:  # its clients' streams are released before the resolver
            await self.wyoming.close()
        if self.http is not None:
            await self.http.close()
        if self.mqtt is not None:  # says the stop cuts short stay journaled for the next start
            self.mqtt.hold()
        if self.control is not None:
            await self.control.scheduler.close()
            self.control.scheduler.sink.close()
            self.control.scheduler.resolver.close()
        if self.mqtt is not None:  # after the scheduler: its last sayFinished go out first
            await self.mqtt.close()
        if self.journal is not None:
            await asyncio.to_thread(self.journal.close)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for path in self._owned_paths:
            path.unlink(missing_ok=True)


def _lexicon(config: Config) -> Lexicon:
    try:
        return Lexicon.load(config.lexicon.files)
    except LexiconError as e:
        raise ConfigError(f"lexicon.files: {e}") from None


def make_guard(config: EngineConfig) -> Guard:
    breaker = CircuitBreaker(config.breaker_failures, config.breaker_reset_s)
    return Guard(
        breaker,
        config.hang_timeout_s,
        config.max_rtf,
        trace_parts=config.trace_parts,
        nice=config.nice,
    )


def _fallback_audio(resolver: Resolver, text: str, halt: threading.Event) -> AudioChunk | None:
    """The prompt played when the engine fails: synthesized (and cached) while it still works."""
    if not text:
        return None
    try:
        audio = join_chunks(resolver.stream(SpeakRequest(text=text), halt))
        if halt.is_set():
            return None
    except Exception as e:
        log.warning("no fallback prompt (%s): engine failures will be silent", e)
        return None
    log.info("fallback prompt ready: %r (%.2f s)", text, audio.duration if audio else 0.0)
    return audio


async def _load_engine(config: EngineConfig) -> Engine:
    """Load a model in a worker thread; meanwhile extend systemd's timeout and say so in STATUS."""
    what = f"{config.kind} model {config.bundle or '(embedded voice)'}"
    loading = asyncio.ensure_future(asyncio.to_thread(load_engine, config))
    t0 = time.monotonic()
    while True:
        elapsed = time.monotonic() - t0
        if elapsed < LOAD_EXTEND_MAX_S:
            notify(
                f"EXTEND_TIMEOUT_USEC={int(LOAD_EXTEND_S * 1e6)}",
                f"STATUS=loading {what} ({elapsed:.0f} s)",
            )
        done, _ = await asyncio.wait({loading}, timeout=LOAD_EXTEND_S / 2)
        if done:
            return loading.result()


def serve(config_path: Path | None) -> NoReturn:
    config = load_daemon_config(config_path)
    exit_now(asyncio.run(Daemon(config, config_path).run()))
