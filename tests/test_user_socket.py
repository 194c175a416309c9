"""speakd found where Speech Dispatcher clients look: the user units put the SSIP socket at
libspeechd's default per-user path, and the stock ``spd-say``, with no SPEECHD_ADDRESS, reaches a
speakd listening there."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.daemon_proc import start_daemon, write_config
from tests.waits import wait_until

ROOT = Path(__file__).resolve().parent.parent
USER_UNITS = ROOT / "systemd" / "user"
SPEAKD_BIN = Path(sys.executable).with_name("speakd")
LIBSPEECHD = Path("/usr/lib/python3/dist-packages/speechd/client.py")


def _runtime_dir(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    return run


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd tools missing")
def test_user_units_verify_with_no_output(tmp_path: Path) -> None:
    units = []
    for unit in sorted(USER_UNITS.iterdir()):
        text = unit.read_text().replace("/opt/speakd/venv/bin/speakd", str(SPEAKD_BIN))
        (tmp_path / unit.name).write_text(text)
        units.append(str(tmp_path / unit.name))
    env = {**os.environ, "XDG_RUNTIME_DIR": str(_runtime_dir(tmp_path))}
    r = subprocess.run(
        ["systemd-analyze", "--user", "verify", "--man=no", *units],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert r.returncode == 0 and r.stdout + r.stderr == "", r.stdout + r.stderr


@pytest.mark.skipif(not LIBSPEECHD.exists(), reason="python3-speechd missing")
def test_the_ssip_socket_unit_listens_where_libspeechd_looks() -> None:
    """libspeechd's default is $XDG_RUNTIME_DIR + its DEFAULT_SOCKET_PATH; %t is that dir."""
    default = next(
        line.split("=", 1)[1].strip().strip("\"'")
        for line in LIBSPEECHD.read_text().splitlines()
        if line.strip().startswith("DEFAULT_SOCKET_PATH")
    )
    assert f"ListenStream=%t/{default}\n" in (USER_UNITS / "speakd-ssip.socket").read_text()


@pytest.mark.skipif(shutil.which("spd-say") is None, reason="spd-say missing (speech-dispatcher)")
def test_spd_say_with_no_address_reaches_speakd(tmp_path: Path) -> None:
    run = _runtime_dir(tmp_path)
    ssip = run / "speech-dispatcher" / "speechd.sock"
    config = write_config(tmp_path)
    config.write_text(
        config.read_text().replace(
            f'ssip_path = "{tmp_path / "ssip.sock"}"', f'ssip_path = "{ssip}"'
        )
    )
    daemon = start_daemon(config)
    try:
        wait_until(ssip.exists, "speakd's SSIP socket at the standard path")
        env = {k: v for k, v in os.environ.items() if not k.startswith(("LC_", "SPEECHD_"))}
        # SPEECHD_CMD: were speakd not there, fail rather than autospawn speech-dispatcher.
        env |= {"LANG": "C.UTF-8", "XDG_RUNTIME_DIR": str(run), "SPEECHD_CMD": "/bin/false"}
        r = subprocess.run(
            ["spd-say", "-w", "Found without an address."],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
        )
        assert r.returncode == 0, r.stderr
        assert list((tmp_path / "wav").glob("ssip-*.wav")), "spd-say did not reach speakd"
    finally:
        daemon.stop()


def test_the_user_service_names_its_own_sockets_and_pins_no_system_path() -> None:
    """The user unit reads the system's /etc/speakd/speakd.toml, which pins /run/speakd's
    sockets: its environment names the user sockets instead, the very paths its socket units
    listen on; it sets no StateDirectory= (systemd 252 would put it in $XDG_CONFIG_HOME)."""
    from tests.test_systemd import one, unit_settings

    service = unit_settings(USER_UNITS / "speakd.service")
    env = dict(v.split("=", 1) for v in service[("Service", "Environment")])
    for unit, key in (("speakd.socket", "SPEAKD_SOCKET_PATH"),
                      ("speakd-ssip.socket", "SPEAKD_SOCKET_SSIP_PATH")):  # fmt: skip
        assert env[key] == one(unit_settings(USER_UNITS / unit), "Socket", "ListenStream")
    assert one(service, "Service", "ExecStart") == "/opt/speakd/venv/bin/speakd serve"
    assert not {k for _, k in service} & {"StateDirectory", "CacheDirectory", "RuntimeDirectory"}
    assert "RemoveOnStop=yes" in (USER_UNITS / "speakd.socket").read_text()  # find.py's rule
