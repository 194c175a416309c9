"""The Home Assistant add-on (homeassistant/) and the container's config, in the suite.

* ``config.yaml`` and ``build.yaml`` pass the Supervisor's rules (tests/ha_schema.py), and the
  check refuses a broken copy; the translations name every option; icon and logo are PNGs;
* the run script, given an options.json, writes a speakd.toml speakd accepts, starts speakd
  (the venv's, on free ports) and sends the Wyoming discovery to a stand-in Supervisor, with
  the token, once Wyoming answers; the speaker option reaches the audio;
* bad options end it with one error line naming the option and status 78, nothing started;
* container/speakd.toml puts everything under /data, and SPEAKD_* variables override it.

The image itself is tests/test_image.py (`make image-test`).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import sys
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np
import pytest
import yaml
from aiohttp import web
from wyoming.audio import AudioChunk, AudioStop
from wyoming.client import AsyncTcpClient
from wyoming.tts import Synthesize

from speakd.config import load_config
from tests.ha_schema import check_build, check_config, supervisor_answers
from tests.http_daemon import free_port
from tests.tiny_voices import tiny_multispeaker_voice

ROOT = Path(__file__).resolve().parent.parent
ADDON = ROOT / "homeassistant" / "speakd"
RUN = ADDON / "rootfs" / "usr" / "local" / "bin" / "speakd-addon"
VENV_BIN = Path(sys.executable).parent


def addon_config() -> dict[str, Any]:
    return yaml.safe_load((ADDON / "config.yaml").read_text())


def test_config_yaml_passes_the_supervisors_rules() -> None:
    config = addon_config()
    assert check_config(config) == []
    assert config["discovery"] == ["wyoming"] and config["ingress_port"] == 5500
    assert set(config["arch"]) == {"amd64", "aarch64"}
    broken = {
        **config,
        "arch": ["x86"],
        "ports": {"10200": "ten"},
        "schema": {**config["schema"], "voice": "text"},
        "watchdogs": True,
        "watchdog": "http://localhost:5500/healthz",
    }
    errors = " ".join(check_config(broken))
    for key in ("arch", "ports.10200", "schema.voice", "watchdogs", "watchdog:"):
        assert key in errors


def test_the_add_on_publishes_no_port_and_asks_for_no_supervisor_access() -> None:
    """Wyoming has no authentication: the host publishes nothing unless the user maps a port;
    Home Assistant reaches the add-on by the host name the discovery sends. The only Supervisor
    call, POST /discovery, is open to every add-on's token."""
    config = addon_config()
    assert config["ports"] == {"10200/tcp": None, "5500/tcp": None}
    granted = {"hassio_api", "hassio_role", "homeassistant_api", "auth_api", "host_network"}
    assert not granted & set(config), sorted(granted & set(config))
    assert supervisor_answers(config, "/discovery", {"service": "wyoming"}) == 200
    assert supervisor_answers(config, "/discovery", {"service": "mqtt"}) == 403
    assert supervisor_answers(config, "/addons", {}) == 403


def test_backups_leave_the_cache_out_and_keep_the_rest() -> None:
    """The Supervisor matches each file's path in its add-on data folder against
    ``backup_exclude`` with PurePath.match (its apps/app.py ``_is_excluded_by_filter``)."""
    patterns = addon_config()["backup_exclude"]
    folder = PurePosixPath("/data/addons/data/local_speakd")  # the add-on's /data on the host

    def excluded(name: str) -> bool:
        return any((folder / name).match(p) for p in patterns)

    for name in ("cache/cache.db", "cache/cache.db-wal", "cache/cache.db-shm"):
        assert excluded(name), name
    kept = ("options.json", "speakd.toml", "http-token", "mqtt-password", "state/stats.json",
            "voices/en_US-lessac-medium.onnx", "voices/en_US-lessac-medium.onnx.json")  # fmt: skip
    for name in kept:
        assert not excluded(name), name


def test_the_watchdog_polls_healthz_where_speakd_serves_http() -> None:
    config = addon_config()
    port = int(re.search(r"\[PORT:(\d+)\]", config["watchdog"])[1])
    assert config["watchdog"].startswith("http://") and config["watchdog"].endswith("/healthz")
    assert port == config["ingress_port"] and f"{port}/tcp" in config["ports"]


def test_build_yaml_and_the_dockerfile_agree() -> None:
    build = yaml.safe_load((ADDON / "build.yaml").read_text())
    assert check_build(build) == []
    assert set(build["build_from"]) == set(addon_config()["arch"])
    dockerfile = (ADDON / "Dockerfile").read_text()
    for arg in build["args"]:
        assert re.search(rf"^ARG {arg}\b", dockerfile, re.M), arg
    assert "sha256sum -c" in dockerfile
    version = build["args"]["SPEAKD_VERSION"]
    assert version.startswith(addon_config()["version"] + "-")


def test_translations_name_every_option_and_the_pictures_are_pngs() -> None:
    config = addon_config()
    english = yaml.safe_load((ADDON / "translations" / "en.yaml").read_text())
    assert set(english["configuration"]) == set(config["schema"])
    assert set(english["network"]) == set(config["ports"])
    for name, (w, h) in {"icon.png": (128, 128), "logo.png": (250, 100)}.items():
        head = (ADDON / name).read_bytes()[:24]
        assert head[:8] == b"\x89PNG\r\n\x1a\n", name
        assert (int.from_bytes(head[16:20]), int.from_bytes(head[20:24])) == (w, h), name
    assert yaml.safe_load((ROOT / "homeassistant" / "repository.yaml").read_text())["name"]


def run_env(data: Path, **extra: str) -> dict[str, str]:
    return {
        **os.environ,
        "PATH": f"{VENV_BIN}:{os.environ['PATH']}",
        "SPEAKD_ADDON_DATA": str(data),
        "SPEAKD_ADDON_SHARE": str(data.parent / "share"),
        **extra,
    }


BAD_OPTIONS = {
    "missing": (None, "options.json is missing"),
    "not JSON": ("{voice:", "cannot be read as JSON"),
    "a list": ("[]", "must hold a JSON object"),
    "cache too small": ({"cache_size_mb": 5}, "cache_size_mb must be between 16 and 8192"),
    "cache as text": ({"cache_size_mb": "big"}, "cache_size_mb must be a whole number"),
    "broker with a port": ({"mqtt_host": "broker:1883"}, "mqtt_host must be a host name"),
    "log level": ({"log_level": "loud"}, "log_level must be one of"),
    "no such voice": ({"voice": "nobody"}, "voices.default: no voice named 'nobody'"),
    "no such speaker": ({"speaker": "carl"}, "voices.default_speaker"),
}


@pytest.mark.parametrize("case", list(BAD_OPTIONS))
def test_bad_options_stop_the_add_on_with_one_clear_line(tmp_path: Path, case: str) -> None:
    import subprocess

    options, said = BAD_OPTIONS[case]
    data = tmp_path / "data"
    data.mkdir()
    if options is not None:
        text = options if isinstance(options, str) else json.dumps(options)
        (data / "options.json").write_text(text)
    r = subprocess.run(
        [sys.executable, RUN], env=run_env(data), capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 78, r.stderr
    errors = [line for line in r.stderr.splitlines() if " ERROR " in line]
    assert len(errors) == 1 and said in errors[0], r.stderr
    assert "Configuration tab" in errors[0] and "Traceback" not in r.stderr


async def test_the_run_script_configures_starts_and_announces_speakd(tmp_path: Path) -> None:
    voices = tmp_path / "share"
    voices.mkdir()
    tiny_multispeaker_voice(voices, "xx_XX-duo-low")  # a Piper voice copied to /share
    data = tmp_path / "data"
    data.mkdir()
    options = {
        "voice": "xx_XX-duo-low",
        "speaker": "bert",
        "cache_size_mb": 64,
        "mqtt_host": "",
        "mqtt_port": 1883,
        "mqtt_username": "",
        "mqtt_password": "",
        "api_token": "an-api-token-of-the-users",
        "log_level": "info",
    }
    (data / "options.json").write_text(json.dumps(options))
    announced: asyncio.Queue[tuple[str, dict[str, Any]]] = asyncio.Queue()

    async def discovery(request: web.Request) -> web.Response:
        body = await request.json()
        await announced.put((request.headers.get("Authorization", ""), body))
        if supervisor_answers(addon_config(), request.path, body) != 200:  # its access rules
            return web.json_response({"result": "error"}, status=403)
        return web.json_response({"result": "ok", "data": {"uuid": "0" * 32}})

    app = web.Application()
    app.add_routes([web.post("/discovery", discovery)])
    runner = web.AppRunner(app)
    await runner.setup()
    supervisor_port, wyoming_port, http_port = free_port(), free_port(), free_port()
    await web.TCPSite(runner, "127.0.0.1", supervisor_port).start()
    env = run_env(
        data,
        SPEAKD_ADDON_SUPERVISOR=f"http://127.0.0.1:{supervisor_port}",
        SUPERVISOR_TOKEN="supervisor-token",
        # the add-on's ports are its container's own; here they are free ones
        SPEAKD_WYOMING_URI=f"tcp://127.0.0.1:{wyoming_port}",
        SPEAKD_HTTP_LISTEN=f"127.0.0.1:{http_port}",
        SPEAKD_AUDIO_LOUDNESS_LUFS="0",  # the voice's speakers are told apart by their level
    )
    log_file = tmp_path / "addon.log"  # a file, not a pipe nobody reads while it runs
    with log_file.open("wb") as out:
        proc = await asyncio.create_subprocess_exec(sys.executable, str(RUN), env=env, stderr=out)
    try:
        auth, body = await asyncio.wait_for(announced.get(), 120)  # Wyoming answers first
        assert auth == "Bearer supervisor-token"
        assert body["service"] == "wyoming"
        assert body["config"]["uri"].endswith(f":{wyoming_port}")
        toml = load_config(data / "speakd.toml", env={})
        assert toml.voices.dir == str(voices) and toml.voices.default_speaker == "bert"
        assert toml.cache.max_bytes == 64 * 1024 * 1024
        assert toml.http.no_token_from == ["172.30.32.2"] and toml.audio.sink == "null"
        assert (data / "http-token").read_text().strip() == options["api_token"]
        assert (data / "http-token").stat().st_mode & 0o077 == 0
        async with AsyncTcpClient("127.0.0.1", wyoming_port, read_timeout=60) as client:
            await client.write_event(Synthesize("Bert speaks by default.").event())
            pcm = b""
            while (event := await client.read_event()) is not None:
                if AudioChunk.is_type(event.type):
                    pcm += AudioChunk.from_event(event).audio
                elif AudioStop.is_type(event.type):
                    break
        level = float(np.frombuffer(pcm, "<i2").mean()) / 32767
        assert level == pytest.approx(0.2, abs=0.01)  # bert (sid 1), not anna
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
        await asyncio.wait_for(proc.wait(), 60)
        await runner.cleanup()
    log = log_file.read_text()
    assert proc.returncode == 0, log
    assert "Wyoming discovery sent" in log and "Traceback" not in log


def test_the_containers_config_keeps_everything_under_data() -> None:
    path = ROOT / "container" / "speakd.toml"
    config = load_config(path, env={"SPEAKD_HTTP_TOKEN": "t"})  # the entry point makes one
    for where in (config.voices.dir, config.cache.path, config.state.dir, config.http.token_file):
        assert where.startswith("/data/"), where
    assert config.wyoming.uri == "tcp://0.0.0.0:10200" and config.http.address == ("0.0.0.0", 5500)
    assert config.audio.sink == "null" and config.socket.ssip_path == ""
    env = {
        "SPEAKD_HTTP_TOKEN": "t",
        "SPEAKD_CACHE_MAX_BYTES": "1048576",
        "SPEAKD_AUDIO_VOLUME": "0.5",
    }
    changed = load_config(path, env=env)
    assert changed.cache.max_bytes == 1048576 and changed.audio.volume == 0.5
