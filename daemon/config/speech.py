"""The sections of what the board says and how: [engine], [voices], [lexicon], [audio],
[limits], [cache] and [state]; each validates its own keys."""

from __future__ import annotations

from dataclasses import dataclass, field

from speakd.config.checks import ConfigError, choice, in_range
from speakd.machine.npu import ACCELERATORS
from speakd.paths import cache_dir, data_dir, state_dir

# The engine kinds a file may name (engine.kind), as data: speakd.engines.registry says what each
# one is and how to load it, under these names (tests/test_config.py holds the two together).
# The registry imports speakd.config's EngineConfig; speakd.config never imports the registry.
ENGINE_KINDS = ("vits", "chattts")
DEFAULT_LUFS = -20.0  # audio.loudness_lufs: a broadcast-style level (EBU R 128 is -23)
SHIPPED_PACK = "/usr/share/speakd/key-echo.db"  # the Debian package's key-echo pack


@dataclass(frozen=True)
class EngineConfig:
    kind: str = "vits"  # "vits" (embedded default voice) | "chattts"
    bundle: str = ""  # path to a bundle; empty = the embedded default voice
    # "int8": load <bundle>-int8 instead when that calibrated sibling exists (the default that
    # ships); "exact": load exactly `bundle` (speakd.engines.resolve_bundle)
    precision: str = "int8"
    voice: str = "default"
    threads: int = 2  # onnxruntime intra-op threads (= cores on a Pi-class board)
    # How much nicer than the daemon's event loop and playback its synthesis threads run
    # (speakd.machine.priority); 0 = the same priority
    nice: int = 5
    # ChatTTS: decode rows sharing one step (sentences of a request and concurrent requests,
    # docs/chattts-engine.md); 1 = one sentence at a time. Each row's KV slot costs memory.
    batch_size: int = 4
    # ChatTTS batching favours the sentence being played so it never runs dry (batch_scheduler.py,
    # "Pacing"); off = every row steps every time (throughput only: precompute)
    paced: bool = True
    # Degradation: a failing, hung or too slow engine opens a circuit breaker; while it is open
    # (and for requests the engine failed) the fallback prompt plays instead of silence.
    fallback_text: str = "Sorry, I cannot say that right now."
    hang_timeout_s: float = 30.0  # no audio for this long = the engine hung
    max_rtf: float = 3.0  # slower than this (compute s per audio s) counts as a failure
    breaker_failures: int = 3  # consecutive failures that open the breaker
    breaker_reset_s: float = 30.0  # how long it stays open before one trial request
    # A Rockchip NPU (docs/boards.md, "The RK3588's NPU"): "cpu" runs every graph on the CPU;
    # "rknn" and "auto" run the [engine] bundle's .rknn graphs (speakd-tools rknn convert) on the
    # NPU when its driver, librknnrt.so and rknn-toolkit-lite2 are there, else the CPU, saying why
    # in one line (a warning for "rknn"). NPU audio is another precision: its own bundle id.
    accelerator: str = "cpu"
    trace_parts: bool = False  # log each synthesis' parts in ms (speakd.engines.spans)

    def validate(self) -> None:
        choice("engine.kind", self.kind, ENGINE_KINDS)
        choice("engine.precision", self.precision, ("int8", "exact"))
        choice("engine.accelerator", self.accelerator, ACCELERATORS)
        if self.kind == "chattts" and not self.bundle:
            raise ConfigError("engine.bundle: kind 'chattts' needs a bundle path")
        in_range("engine.threads", self.threads, 1, 64)
        in_range("engine.nice", self.nice, 0, 19)
        in_range("engine.batch_size", self.batch_size, 1, 32)
        in_range("engine.hang_timeout_s", self.hang_timeout_s, 0.5, 3600)
        in_range("engine.max_rtf", self.max_rtf, 0.1, 1000)
        in_range("engine.breaker_failures", self.breaker_failures, 1, 1000)
        in_range("engine.breaker_reset_s", self.breaker_reset_s, 0.1, 86400)


@dataclass(frozen=True)
class VoicesConfig:
    """Every voice the board has (docs/models.md): the embedded one, [engine]'s, and a folder of
    Piper voices and bundles, loaded when first used."""

    dir: str = field(default_factory=lambda: str(data_dir() / "voices"))
    embedded: bool = True  # the embedded Piper voice is one of them
    default: str = ""  # the voice a request without voice or lang gets; empty = engine.voice
    default_speaker: str = ""  # that voice's speaker for a request naming none; empty = its first
    by_lang: dict[str, str] = field(default_factory=dict)  # lang = "voice name"
    preload: list[str] = field(default_factory=list)  # voices loaded at start, not on first use

    def validate(self) -> None:
        for lang, voice in self.by_lang.items():
            if not lang.strip() or not voice:
                raise ConfigError(
                    f"voices.by_lang: {lang!r} = {voice!r} needs a language and a voice"
                )


@dataclass(frozen=True)
class LexiconConfig:
    """Pronunciation lexicons, one TOML file per language (docs/ssml.md, "Lexicons")."""

    files: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class AudioConfig:
    sink: str = "sounddevice"  # "sounddevice" | "wav" | "null"
    device: str = ""  # sounddevice device name or index; empty = system default
    wav_dir: str = ""  # where sink = "wav" writes <request id>.wav
    volume: float = 1.0  # default gain; a request's volume multiplies it
    block_ms: int = 50  # playback granularity: a pause lands between blocks (a stop does not wait)
    realtime: bool = False  # pace the wav/null sinks like a device (soak tests, emulation)
    tail_ms: int = 200  # silence played after the last sample, before the device drains
    sentence_silence_ms: int = 0  # silence between sentences (voices with sentence_silence)
    loudness_lufs: float = DEFAULT_LUFS  # every voice's integrated loudness; 0 = as made

    @property
    def loudness(self) -> float | None:
        """The loudness target, None when off."""
        return self.loudness_lufs or None

    def validate(self) -> None:
        choice("audio.sink", self.sink, ("sounddevice", "wav", "null"))
        if self.sink == "wav" and not self.wav_dir:
            raise ConfigError("audio.wav_dir: sink 'wav' needs a directory")
        in_range("audio.volume", self.volume, 0.0, 4.0)
        in_range("audio.block_ms", self.block_ms, 5, 1000)
        in_range("audio.tail_ms", self.tail_ms, 0, 5000)
        in_range("audio.sentence_silence_ms", self.sentence_silence_ms, 0, 10000)
        in_range("audio.loudness_lufs", self.loudness_lufs, -70.0, 0.0)


@dataclass(frozen=True)
class LimitsConfig:
    max_text_chars: int = 5000
    max_queue: int = 32
    max_line_bytes: int = 65536  # one JSON line / SSIP line on the sockets
    # Callers that take the audio back (socket synth, Wyoming, HTTP) streaming at once; one more
    # waits its turn (playback on the board has its own queue, max_queue)...
    max_streams: int = 4
    # ...for up to this many seconds, then is refused with "busy" (0: refused at once).
    stream_wait_s: float = 30.0
    # Exit (for systemd to restart speakd) when resident memory passes this many MiB; 0 = off.
    # For kernels where MemoryMax= does nothing (Raspberry Pi kernels disable the memory cgroup).
    max_rss_mb: int = 0
    # A prompt pack rolled out over MQTT (mqtt/packs.py) larger than this is refused
    # before a byte of it is fetched; it is written to disk beside the cache, then imported.
    max_pack_bytes: int = 67_108_864
    # Voices loaded at once (0 = no limit) and their resident bytes (0 = no limit): past either,
    # the least recently used idle voice is unloaded (a voice mid-synthesis never is).
    max_loaded_voices: int = 0
    max_voice_bytes: int = 0

    def validate(self) -> None:
        in_range("limits.max_text_chars", self.max_text_chars, 1, 1_000_000)
        in_range("limits.max_queue", self.max_queue, 1, 100_000)
        in_range("limits.max_line_bytes", self.max_line_bytes, 1024, 16 * 1024 * 1024)
        in_range("limits.max_streams", self.max_streams, 1, 1024)
        in_range("limits.stream_wait_s", self.stream_wait_s, 0, 3600)
        in_range("limits.max_rss_mb", self.max_rss_mb, 0, 1 << 20)
        in_range("limits.max_pack_bytes", self.max_pack_bytes, 0, 1 << 40)
        in_range("limits.max_loaded_voices", self.max_loaded_voices, 0, 1000)
        in_range("limits.max_voice_bytes", self.max_voice_bytes, 0, 1 << 40)


@dataclass(frozen=True)
class CacheConfig:
    enabled: bool = True
    path: str = field(default_factory=lambda: str(cache_dir() / "cache.db"))
    max_bytes: int = 268_435_456
    ttl_s: int = 604_800
    ttl_jitter: float = 0.1  # fraction of ttl_s, random per entry
    prewarm_bytes: int = 67_108_864  # pinned clips held in RAM
    stale_while_revalidate: bool = False  # play an expired clip at once, re-synthesise behind
    shipped_pack: str = SHIPPED_PACK  # read-only clips consulted after the cache; "" = none

    def validate(self) -> None:
        in_range("cache.max_bytes", self.max_bytes, 0, 1 << 40)
        in_range("cache.ttl_s", self.ttl_s, 0, 10 * 365 * 86400)
        in_range("cache.ttl_jitter", self.ttl_jitter, 0.0, 1.0)
        in_range("cache.prewarm_bytes", self.prewarm_bytes, 0, 1 << 40)


@dataclass(frozen=True)
class StateConfig:
    """What must survive a cache wipe (docs/configuration.md, "[state]")."""

    dir: str = field(default_factory=lambda: str(state_dir()))
