"""The Home Assistant add-on (homeassistant/) and the container's config, in the suite.

* ``config.yaml`` and ``build.yaml`` pass the Supervisor's rules (tests/ha_schema.py), and the
  check refuses a broken copy; the translations name every option; icon and logo are PNGs;
* the run script, given an options.json, writes a speakd.toml speakd accepts, starts speakd
  (the venv's, on free ports) and sends the Wyoming discovery to a stand-in Supervisor, with
  the token, once Wyoming answers; the speaker option reaches the audio;
* bad options end it with one error line naming the option and status 78, nothing started;
* the images' one config (the add-on's rootfs/usr/local/share/speakd/speakd.toml, the container's
  /etc/speakd/speakd.toml) puts everything under /data, SPEAKD_* variables override it, and the
  add-on's speakd.toml is that file plus the options;
* both images make the `speakd` user (uid 10200) with one script and check /healthz with one
  script; the run script gives the files in /data's folders, not only the folders, to speakd.

The image itself is tests/test_image.py (`make image-test`).
"""

from __future__ import annotations

import asyncio
import importlib.machinery
import importlib.util
import json
import os
import pwd
import re
import signal
import subprocess
import sys
import tomllib
from pathlib import Path, PurePosixPath
from types import ModuleType
from typing import Any

import numpy as np
import pytest
import yaml
from aiohttp import web
from wyoming.audio import AudioChunk, AudioStop
from wyoming.client import AsyncTcpClient
from wyoming.tts import Synthesize

from speakd.config import load_config
from tests import setups
from tests.ha_schema import check_build, check_config, supervisor_answers
from tests.http_daemon import free_port
from tests.tiny_voices import tiny_multispeaker_voice

ROOT = Path(__file__).resolve().parent.parent
ADDON = ROOT / "homeassistant" / "speakd"
SHARED = ADDON / "rootfs" / "usr" / "local"  # the files both images take from the add-on
RUN = SHARED / "bin" / "speakd-addon"
HEALTHCHECK = SHARED / "bin" / "speakd-healthcheck"
MAKE_USER = SHARED / "sbin" / "speakd-user"
IMAGES_CONFIG = SHARED / "share" / "speakd" / "speakd.toml"
DOCKERFILES = (ROOT / "container" / "Containerfile", ADDON / "Dockerfile")
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
    setups.started(RUN, run_script().BASE_CONFIG)  # the config it builds on (docs/setups.md)
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
        health = await asyncio.create_subprocess_exec(
            sys.executable, str(HEALTHCHECK), env=env, stdout=asyncio.subprocess.PIPE
        )
        said, _ = await health.communicate()
        assert health.returncode == 0 and json.loads(said) == {"status": "ok"}
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
        await asyncio.wait_for(proc.wait(), 60)
        await runner.cleanup()
    log = log_file.read_text()
    assert proc.returncode == 0, log
    assert "Wyoming discovery sent" in log and "Traceback" not in log


def test_the_containers_config_keeps_everything_under_data() -> None:
    path = IMAGES_CONFIG
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


def run_script() -> ModuleType:
    """speakd-addon imported as a module (it has no .py suffix)."""
    loader = importlib.machinery.SourceFileLoader("speakd_addon", str(RUN))
    spec = importlib.util.spec_from_loader("speakd_addon", loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    loader.exec_module(module)
    return module


def test_the_add_ons_config_is_the_images_config_plus_the_options(tmp_path: Path) -> None:
    """One source: every key of the container's config is in the add-on's, with the same value
    (paths under the add-on's data folder); what the add-on adds is its options and ingress."""
    addon = run_script()
    options = addon.Options(voice="v", speaker="s", cache_size_mb=64, mqtt_host="broker",
                            mqtt_username="u", mqtt_password="p")  # fmt: skip
    data, voices = tmp_path / "data", tmp_path / "share"
    written = tomllib.loads(addon.speakd_toml(options, data, voices))
    base = tomllib.loads(IMAGES_CONFIG.read_text())
    added = {("voices", "dir"): str(voices), ("voices", "default"): "v",
             ("voices", "default_speaker"): "s", ("cache", "max_bytes"): 64 * 1024 * 1024,
             ("http", "no_token_from"): ["172.30.32.2"], ("mqtt", "enabled"): True,
             ("mqtt", "host"): "broker", ("mqtt", "port"): 1883, ("mqtt", "username"): "u",
             ("mqtt", "password_file"): str(data / "mqtt-password")}  # fmt: skip
    for table, keys in base.items():
        for key, value in keys.items():
            if (table, key) in added:
                continue
            if isinstance(value, str) and value.startswith("/data/"):
                value = str(data / value.removeprefix("/data/"))
            assert written[table][key] == value, (table, key)
    got = {(t, k) for t, keys in written.items() for k in keys}
    assert got == {(t, k) for t, keys in base.items() for k in keys} | set(added)
    assert {(t, k): written[t][k] for (t, k) in added} == added
    # the container has no copy of its own: build.sh puts this file where the Containerfile
    # copies it from
    assert not (ROOT / "container" / "speakd.toml").exists()
    build = (ROOT / "container" / "build.sh").read_text()
    assert "share/speakd/speakd.toml" in build
    assert "COPY speakd.toml /etc/speakd/speakd.toml" in DOCKERFILES[0].read_text()


def test_both_images_make_the_speakd_user_with_one_script(tmp_path: Path) -> None:
    """The script, run on a root of its own: the user and group 10200, home /data; both
    Dockerfiles run it before apt installs the .deb (whose postinst keeps an existing user)."""
    etc = tmp_path / "etc"
    etc.mkdir()
    (etc / "passwd").write_text("root:x:0:0:root:/root:/bin/sh\n")
    (etc / "group").write_text("root:x:0:\n")
    (etc / "shadow").write_text("root:*:19000:0:99999:7:::\n")
    (etc / "gshadow").write_text("root:*::\n")
    r = subprocess.run(["sh", str(MAKE_USER), str(tmp_path)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    users = {ln.split(":")[0]: ln.split(":") for ln in (etc / "passwd").read_text().splitlines()}
    assert users["speakd"][2:4] == ["10200", "10200"] and users["speakd"][5] == "/data"
    assert "speakd:x:10200:" in (etc / "group").read_text()
    for dockerfile in DOCKERFILES:
        text = dockerfile.read_text()
        assert "useradd" not in text and "groupadd" not in text, dockerfile
        assert -1 < text.index("speakd-user") < text.index("apt-get install"), dockerfile


def test_both_images_check_healthz_with_one_script() -> None:
    """The same HEALTHCHECK in both, a script run by the .deb's Python (no curl in them)."""
    checks = {re.search(r"^HEALTHCHECK .*\n.*$", f.read_text(), re.M)[0] for f in DOCKERFILES}
    (check,) = checks
    assert '"/usr/local/bin/speakd-healthcheck"' in check and "curl" not in check
    assert HEALTHCHECK.read_text().startswith("#!/opt/speakd/venv/bin/python3\n")
    assert os.access(HEALTHCHECK, os.X_OK) and os.access(MAKE_USER, os.X_OK)


def test_the_health_check_fails_when_speakd_does_not_answer() -> None:
    env = {**os.environ, "SPEAKD_HTTP_LISTEN": f"127.0.0.1:{free_port()}"}
    r = subprocess.run([sys.executable, HEALTHCHECK], env=env, capture_output=True, text=True)
    assert r.returncode == 1 and "/healthz" in r.stdout and "Traceback" not in r.stderr
    env["SPEAKD_HTTP_LISTEN"] = ""
    r = subprocess.run([sys.executable, HEALTHCHECK], env=env, capture_output=True, text=True)
    assert r.returncode == 1 and "speakd status" in r.stdout


@pytest.mark.skipif(os.geteuid() != 0, reason="gives files to other uids: needs root")
def test_a_start_gives_the_files_in_data_to_speakd_not_only_the_folders(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rebuild that moved speakd's uid (before it was fixed) left cache.db another uid's."""
    addon = run_script()
    data = tmp_path / "data"
    old = 4321  # the uid an older image gave speakd
    outside = tmp_path / "not-speakds"
    outside.write_text("root's")
    for name in ("cache/cache.db", "cache/cache.db-wal", "state/stats.json", "voices/v.onnx"):
        (data / name).parent.mkdir(parents=True, exist_ok=True)
        (data / name).write_bytes(b"x")
    (data / "state" / "link").symlink_to(outside)  # speakd may write links where it writes
    for path in [data, *data.rglob("*")]:
        os.chown(path, old, old, follow_symlinks=False)
    monkeypatch.setattr(addon, "DATA", data)
    monkeypatch.setattr(addon, "SHARED_VOICES", tmp_path / "no-share")
    owner = pwd.struct_passwd(("speakd", "x", 10200, 10200, "", "/data", "/usr/sbin/nologin"))
    addon.prepare(addon.Options(), owner)
    for path in [*(data / "cache").rglob("*"), *(data / "state").rglob("*"),
                 *(data / "voices").rglob("*"), data / "http-token"]:  # fmt: skip
        st = path.lstat()
        assert (st.st_uid, st.st_gid) == (10200, 10200), path
    assert outside.stat().st_uid == 0  # the link was changed, not followed
