"""systemd integration against the real tools and a real ``speakd serve`` with the embedded voice.

* the units pass ``systemd-analyze verify`` with no output at all (it exits 0 on warnings) and
  keep the recorded ``systemd-analyze security`` exposure; they agree with the example config;
* a NOTIFY_SOCKET harness sees EXTEND_TIMEOUT_USEC/STATUS while loading, then READY=1, then
  WATCHDOG=1 from the event loop; STATUS follows the speech; a wedged loop (SIGUSR2 with
  $SPEAKD_DEBUG_WEDGE) stops the pings; SIGHUP reloads (RELOADING=1 … READY=1) without
  reloading the model; SIGTERM while speaking exits 0 within 2 s after STOPPING=1;
* under ``systemd-socket-activate`` the inherited json/ssip sockets serve ``speakd say`` and the
  stock ``spd-say``;
* ``install.sh`` with DESTDIR builds the venv and lays out units, sysusers and config.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import tomllib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest

from speakd.config import Config, load_config
from tests.daemon_proc import DaemonProc, start_daemon, write_config
from tests.waits import wait_until

ROOT = Path(__file__).resolve().parent.parent
UNITS_DIR = ROOT / "systemd"
UNITS = ("speakd.service", "speakd.socket", "speakd-ssip.socket")
EXAMPLE_CONFIG = UNITS_DIR / "speakd.toml"
DOC = ROOT / "docs" / "systemd.md"
UNIT_SPEAKD = "/opt/speakd/venv/bin/speakd"
SPEAKD_BIN = Path(sys.executable).with_name("speakd")  # the venv's console script
WATCHDOG_USEC = 200_000  # pings every 0.1 s
WEDGE_S = 1.5
T = TypeVar("T")
LONG_TEXT = (
    "This sentence is long enough to keep the speaker busy for a few seconds. "
    "And here is a second one, so that stopping it in the middle is easy to see."
)

pytestmark = pytest.mark.skipif(
    shutil.which("systemd-analyze") is None, reason="systemd tools missing (Debian: systemd)"
)


# ---- helpers --------------------------------------------------------------------------------


class NotifySocket:
    """The service manager's end of NOTIFY_SOCKET: every datagram, split into lines, timed."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._sock.bind(self.path)
        self._sock.settimeout(0.2)
        self.lines: list[tuple[float, str]] = []
        self._cond = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._receive, daemon=True)
        self._thread.start()

    def _receive(self) -> None:
        while not self._closed:
            try:
                data = self._sock.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                return
            now = time.monotonic()
            with self._cond:
                self.lines.extend((now, line) for line in data.decode().split("\n"))
                self._cond.notify_all()

    def wait_for(self, match: Callable[[str], bool], start: int = 0, timeout: float = 90) -> int:
        """Index of the first line from ``start`` on that matches; fails after ``timeout``."""

        def found() -> int | None:
            return next((i for i in range(start, len(self.lines)) if match(self.lines[i][1])), None)

        return self.wait_until(found, "a matching notify line", start, timeout)

    def wait_until(self, done: Callable[[], T | None], what: str, start: int, timeout: float) -> T:
        """``done()``'s first value that is not None, tried as each datagram arrives."""
        deadline = time.monotonic() + timeout
        with self._cond:  # (re-entrant: ``done`` may read texts() and pings())
            while (value := done()) is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    shown = [line for _, line in self.lines[start:]][-20:]
                    raise AssertionError(f"waited {timeout:g} s for {what}; last lines: {shown}")
                self._cond.wait(left)
            return value

    def texts(self, start: int = 0, end: int | None = None) -> list[str]:
        with self._cond:
            return [line for _, line in self.lines[start:end]]

    def pings(self, start: int = 0) -> list[float]:
        with self._cond:
            return [t for t, line in self.lines[start:] if line == "WATCHDOG=1"]

    def close(self) -> None:
        self._closed = True
        self._thread.join(2)
        self._sock.close()


def service_env(notify: NotifySocket) -> dict[str, str]:
    return {
        "NOTIFY_SOCKET": notify.path,
        "WATCHDOG_USEC": str(WATCHDOG_USEC),
        "SPEAKD_DEBUG_WEDGE": str(WEDGE_S),
    }


def templated_units(dest: Path, exec_path: Path, source: Path = UNITS_DIR) -> list[Path]:
    """Copies of the units whose ExecStart points at an existing speakd (verify checks it)."""
    dest.mkdir(parents=True, exist_ok=True)
    out = []
    for name in UNITS:
        text = (source / name).read_text()
        (dest / name).write_text(text.replace(UNIT_SPEAKD, str(exec_path)))
        out.append(dest / name)
    return out


def verify(units: list[Path]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["systemd-analyze", "verify", "--man=no", *map(str, units)],
        capture_output=True,
        text=True,
        timeout=60,
    )


def unit_settings(path: Path) -> dict[tuple[str, str], list[str]]:
    """(section, key) → values in order (systemd keys may repeat, e.g. SystemCallFilter=)."""
    settings: dict[tuple[str, str], list[str]] = {}
    section = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        key, _, value = line.partition("=")
        settings.setdefault((section, key.strip()), []).append(value.strip())
    return settings


def one(settings: dict[tuple[str, str], list[str]], section: str, key: str) -> str:
    values = settings.get((section, key))
    assert values and len(values) == 1, f"[{section}] {key}= should be set once: {values}"
    return values[0]


def engine_loads(d: DaemonProc) -> int:
    return len(re.findall(r"engine vits loaded in", d.log_text()))


# ---- the unit files -------------------------------------------------------------------------


def test_units_verify_with_no_output(tmp_path: Path) -> None:
    assert SPEAKD_BIN.exists()
    r = verify(templated_units(tmp_path, SPEAKD_BIN))
    assert r.returncode == 0
    assert r.stdout + r.stderr == "", "systemd-analyze verify must print nothing"


def test_verify_output_check_catches_a_bad_setting(tmp_path: Path) -> None:
    """The check above can fail: a bad value is only a warning (exit 0) but it prints."""
    units = templated_units(tmp_path, SPEAKD_BIN)
    service = units[0]
    service.write_text(service.read_text().replace("WatchdogSec=30", "WatchdogSec=banana"))
    r = verify(units)
    assert r.returncode == 0
    assert "banana" in r.stderr


def test_security_exposure_is_the_recorded_one(tmp_path: Path) -> None:
    (service,) = templated_units(tmp_path, SPEAKD_BIN)[:1]
    r = subprocess.run(
        ["systemd-analyze", "security", "--offline=true", "--no-pager", str(service)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    m = re.search(r"Overall exposure level for speakd\.service: (\d+\.\d) (\w+)", r.stdout)
    assert m, r.stdout[-500:]
    score, verdict = float(m[1]), m[2]
    assert score <= 2.5, f"hardening regressed: exposure {score} {verdict}"
    assert f"{m[1]} {verdict}" in DOC.read_text(), "update the score recorded in docs/systemd.md"


def test_units_agree_with_each_other_and_the_example_config(monkeypatch) -> None:
    service = unit_settings(UNITS_DIR / "speakd.service")
    json_sock = unit_settings(UNITS_DIR / "speakd.socket")
    ssip_sock = unit_settings(UNITS_DIR / "speakd-ssip.socket")
    cache_dir = Path("/var/cache") / one(service, "Service", "CacheDirectory")
    state_dir = Path("/var/lib") / one(service, "Service", "StateDirectory")
    # What systemd hands the service; the example config pins no cache or state path, so a
    # desktop user's daemon reading the same file gets its own (test_user_socket.py).
    monkeypatch.setenv("CACHE_DIRECTORY", str(cache_dir))
    monkeypatch.setenv("STATE_DIRECTORY", str(state_dir))
    config = load_config(EXAMPLE_CONFIG, env={})
    pinned = tomllib.loads(EXAMPLE_CONFIG.read_text())
    assert pinned["cache"] == {} and pinned["state"] == {}

    assert one(service, "Service", "Type") == "notify"  # no notify-reload on systemd 252
    assert one(service, "Service", "ExecReload") == "/bin/kill -HUP $MAINPID"
    assert one(service, "Service", "ExecStart") == (
        f"{UNIT_SPEAKD} serve --config /etc/speakd/speakd.toml"
    )
    assert one(service, "Service", "Sockets").split() == ["speakd.socket", "speakd-ssip.socket"]
    for sock, name, path in (
        (json_sock, "json", config.socket.path),
        (ssip_sock, "ssip", config.socket.ssip_path),
    ):
        assert one(sock, "Socket", "FileDescriptorName") == name  # what service.py looks up
        assert one(sock, "Socket", "ListenStream") == path  # clients read the same config
        assert one(sock, "Socket", "Service") == "speakd.service"
        assert one(sock, "Socket", "SocketUser") == one(service, "Service", "User")
        # The socket files live in the RuntimeDirectory, so it must outlive a stop.
        assert Path(path).parent == Path("/run") / one(service, "Service", "RuntimeDirectory")
    assert one(service, "Service", "RuntimeDirectoryPreserve") == "yes"
    assert Path(config.cache.path).parent == cache_dir
    assert Path(config.state.dir) == state_dir
    sysusers = (UNITS_DIR / "speakd.sysusers").read_text()
    assert re.search(rf"^u {one(service, 'Service', 'User')} ", sysusers, re.M)
    assert "audio" in one(service, "Service", "SupplementaryGroups").split()


def test_tmpfiles_match_the_units_directories() -> None:
    """The Debian package creates the directories with tmpfiles.d before the service runs: same
    paths, modes and owner as StateDirectory=/CacheDirectory=, and the example's voices.dir."""
    service = unit_settings(UNITS_DIR / "speakd.service")
    user = one(service, "Service", "User")
    entries = {
        fields[1]: (fields[0], fields[2], fields[3], fields[4])
        for line in (UNITS_DIR / "speakd.tmpfiles").read_text().splitlines()
        if line and not line.startswith("#") and (fields := line.split())
    }
    state = "/var/lib/" + one(service, "Service", "StateDirectory")
    cache = "/var/cache/" + one(service, "Service", "CacheDirectory")
    assert entries == {
        state: ("d", one(service, "Service", "StateDirectoryMode"), user, user),
        cache: ("d", one(service, "Service", "CacheDirectoryMode"), user, user),
        f"{state}/voices": ("d", one(service, "Service", "StateDirectoryMode"), user, user),
    }
    assert re.search(rf'^# dir = "{state}/voices"', EXAMPLE_CONFIG.read_text(), re.M)


def test_example_config_lists_every_key() -> None:
    """Each key appears in its section, active or as a commented default."""
    text = EXAMPLE_CONFIG.read_text()
    sections = dict(re.findall(r"^\[(\w+)\]\n(.*?)(?=^\[|\Z)", text, re.M | re.S))
    missing = [
        f"{section}.{key}"
        for section, keys in Config().to_dict().items()
        for key in keys
        if not re.search(rf"^#? ?{key} = ", sections.get(section, ""), re.M)
    ]
    assert not missing, f"document these keys in systemd/speakd.toml: {missing}"


# ---- install.sh -----------------------------------------------------------------------------


def test_install_into_destdir(tmp_path: Path) -> None:
    dest = tmp_path / "root"
    env = {**os.environ, "DESTDIR": str(dest), "PIP_INSTALL_ARGS": "--no-deps"}
    run = [str(UNITS_DIR / "install.sh"), "--prefix", "/opt/speakd-test", str(ROOT)]
    r = subprocess.run(run, capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "not creating the user or touching systemd" in r.stdout

    venv_speakd = dest / "opt/speakd-test/venv/bin/speakd"
    assert venv_speakd.is_file() and os.access(venv_speakd, os.X_OK)
    units = dest / "usr/local/lib/systemd/system"  # /etc stays free for drop-ins and masks
    assert sorted(p.name for p in units.iterdir()) == sorted(UNITS)
    exec_start = one(unit_settings(units / "speakd.service"), "Service", "ExecStart")
    assert exec_start.startswith("/opt/speakd-test/venv/bin/speakd serve ")  # final path
    assert str(dest) not in (units / "speakd.service").read_text()
    assert (dest / "usr/local/lib/sysusers.d/speakd.conf").read_text() == (
        (UNITS_DIR / "speakd.sysusers").read_text()
    )
    assert (dest / "etc/speakd/speakd.toml").read_text() == EXAMPLE_CONFIG.read_text()
    # The installed units verify once ExecStart points at the staged venv.
    staged = [
        p.read_text().replace("/opt/speakd-test", str(dest / "opt/speakd-test"))
        for p in (units / n for n in UNITS)
    ]
    check = tmp_path / "check"
    check.mkdir()
    for name, text in zip(UNITS, staged, strict=True):
        (check / name).write_text(text)
    v = verify([check / n for n in UNITS])
    assert v.stdout + v.stderr == ""

    assert not (dest / "usr/local/lib/systemd/user").exists()  # only with --user-units

    # A second run keeps the admin's config and leaves the new example beside it; --user-units
    # adds the desktop's user units, rewritten to the prefix, enabled by no one.
    (dest / "etc/speakd/speakd.toml").write_text("[audio]\nvolume = 0.5\n")
    r = subprocess.run(
        [*run[:1], "--no-venv", "--user-units", *run[1:]],
        capture_output=True, text=True, timeout=60, env=env,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    assert (dest / "etc/speakd/speakd.toml").read_text() == "[audio]\nvolume = 0.5\n"
    assert (dest / "etc/speakd/speakd.toml.example").read_text() == EXAMPLE_CONFIG.read_text()
    user_units = dest / "usr/local/lib/systemd/user"
    assert sorted(p.name for p in user_units.iterdir()) == sorted(
        p.name for p in (UNITS_DIR / "user").iterdir()
    )
    user_service = (user_units / "speakd.service").read_text()
    assert user_service == (UNITS_DIR / "user/speakd.service").read_text().replace(
        UNIT_SPEAKD, "/opt/speakd-test/venv/bin/speakd"
    )
    assert "systemctl --user enable --now speakd.socket speakd-ssip.socket" in r.stdout


def test_install_refuses_a_non_checkout(tmp_path: Path) -> None:
    r = subprocess.run(
        [str(UNITS_DIR / "install.sh"), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "DESTDIR": str(tmp_path / "root")},
    )
    assert r.returncode == 2
    assert "not a speakd checkout" in r.stderr
    assert not (tmp_path / "root").exists()


# ---- the daemon under a notify socket -------------------------------------------------------


@pytest.fixture(scope="module")
def notified(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[DaemonProc, NotifySocket]]:
    """One paced (realtime null sink) daemon for the notify tests; the last test stops it."""
    tmp = tmp_path_factory.mktemp("notified")
    notify = NotifySocket(tmp / "notify.sock")
    os.environ.pop("WATCHDOG_PID", None)  # the daemon checks it against its own pid
    d = start_daemon(write_config(tmp, sink="null", realtime=True), env=service_env(notify))
    try:
        yield d, notify
    finally:
        d.stop(signal.SIGKILL)
        notify.close()


def test_ready_status_and_watchdog_in_order(notified: tuple[DaemonProc, NotifySocket]) -> None:
    d, notify = notified
    ready = notify.wait_for(lambda line: line == "READY=1")
    before = notify.texts(0, ready)
    assert any(line.startswith("EXTEND_TIMEOUT_USEC=") for line in before)
    assert any(line.startswith("STATUS=loading vits model") for line in before)
    assert "WATCHDOG=1" not in before  # nothing pings before READY
    status = notify.texts(ready + 1, ready + 2)[0]  # the same datagram as READY=1
    assert status.startswith("STATUS=idle; 1 voices (1 loaded), default en_US-joe-medium")
    assert status.endswith(f"on {d.socket}")
    pings = notify.wait_until(
        lambda: p if len(p := notify.pings(ready)) >= 6 else None, "6 pings", ready, 30
    )
    interval = statistics.median(b - a for a, b in itertools.pairwise(pings))
    assert 0.05 < interval < 0.3  # half of WATCHDOG_USEC


def test_status_follows_the_speech(notified: tuple[DaemonProc, NotifySocket]) -> None:
    d, notify = notified
    start = len(notify.texts())
    r = d.cli("say", "Status lines say what speakd is doing.", "--id", "status1")
    assert r.returncode == 0, r.stderr
    speaking = notify.wait_for(lambda line: line.startswith("STATUS=speaking status1"), start)
    notify.wait_for(lambda line: line.startswith("STATUS=idle;"), speaking)


def test_wedged_loop_stops_the_watchdog(notified: tuple[DaemonProc, NotifySocket]) -> None:
    d, notify = notified
    start = len(notify.texts())
    notify.wait_for(lambda line: line == "WATCHDOG=1", start)
    d.proc.send_signal(signal.SIGUSR2)  # $SPEAKD_DEBUG_WEDGE: the loop sleeps WEDGE_S

    def resumed() -> list[float] | None:
        """The pings after a silence of the wedge's length, once there are four of them."""
        pings = notify.pings(start)
        gaps = [b - a for a, b in itertools.pairwise(pings)]
        silence = next((i for i, gap in enumerate(gaps) if gap > WEDGE_S - 0.2), None)
        after = pings[silence + 1 :] if silence is not None else []
        return after if len(after) >= 4 else None

    # times out if pings kept coming while the loop was blocked, or did not come back after it
    notify.wait_until(resumed, "a silence of the wedge's length, then 4 pings", start, 30)
    assert d.proc.poll() is None
    assert d.cli("status").returncode == 0


def test_sighup_reload_applies_config_and_keeps_the_model(
    notified: tuple[DaemonProc, NotifySocket],
) -> None:
    d, notify = notified
    reloads = json.loads(d.cli("status").stdout)["reloads"]
    original = d.config.read_text()
    text = "A sentence of well over twenty characters."
    d.config.write_text(original + "\n[limits]\nmax_text_chars = 20\n")
    start = len(notify.texts())
    d.proc.send_signal(signal.SIGHUP)
    reloading = notify.wait_for(lambda line: line == "RELOADING=1", start, timeout=30)
    notify.wait_for(lambda line: line == "READY=1", reloading, timeout=30)
    assert json.loads(d.cli("status").stdout)["reloads"] == reloads + 1
    r = d.cli("say", text)
    assert r.returncode == 1 and "text_too_long" in r.stderr, r.stderr
    assert d.cli("say", "Short one.").returncode == 0
    assert engine_loads(d) == 1, "reload must not load the unchanged model again"

    # A broken file is refused: READY=1 again, the running configuration stays.
    d.config.write_text(original + "\n[limits]\nmax_text_chars = -3\n")
    start = len(notify.texts())
    d.proc.send_signal(signal.SIGHUP)
    failed = notify.wait_for(lambda line: line.startswith("STATUS=reload failed"), start)
    assert "limits.max_text_chars" in notify.texts(failed, failed + 1)[0]
    assert "READY=1" in notify.texts(start, failed + 1)
    assert json.loads(d.cli("status").stdout)["reloads"] == reloads + 1
    assert d.cli("say", text).returncode == 1  # still the reloaded limit of 20

    d.config.write_text(original)  # back to the defaults for the next test
    start = len(notify.texts())
    d.proc.send_signal(signal.SIGHUP)
    notify.wait_for(lambda line: line == "READY=1", start, timeout=30)
    assert d.cli("say", text).returncode == 0


def test_sigterm_while_speaking_exits_0_promptly(
    notified: tuple[DaemonProc, NotifySocket],
) -> None:
    """Runs last in this module: it stops the shared daemon."""
    d, notify = notified
    start = len(notify.texts())
    speaker = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "speakd",
            "say",
            LONG_TEXT,
            "--id",
            "long1",
            "--wait",
            "--socket",
            d.socket,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=d.env,
    )
    notify.wait_for(lambda line: line.startswith("STATUS=speaking long1"), start, timeout=60)
    stopping_from = len(notify.texts())
    t0 = time.monotonic()
    d.proc.send_signal(signal.SIGTERM)
    rc = d.proc.wait(10)
    elapsed = time.monotonic() - t0
    assert rc == 0, d.log_text()[-2000:]
    assert elapsed < 2.0, f"SIGTERM took {elapsed:.2f} s"
    assert "STOPPING=1" in notify.texts(stopping_from)
    speaker.wait(10)  # the waiting client is released, not left hanging
    assert speaker.returncode != 0, "the long text cannot have finished: speech was stopped"


def test_memory_guard_exits_1_for_a_restart(tmp_path: Path) -> None:
    """limits.max_rss_mb stands in for MemoryMax= where the kernel has no memory cgroup: over the
    limit speakd stops cleanly with exit 1, which Restart=on-failure turns into a restart."""
    notify = NotifySocket(tmp_path / "notify.sock")
    config = write_config(tmp_path, "[limits]\nmax_rss_mb = 64\n", sink="null")
    d = start_daemon(config, env={"NOTIFY_SOCKET": notify.path})
    try:
        rc = d.proc.wait(30)
    finally:
        d.stop(signal.SIGKILL)
        notify.close()
    assert rc == 1, d.log_text()[-2000:]
    assert "over limits.max_rss_mb = 64" in d.log_text()
    texts = notify.texts()
    exiting = next(i for i, t in enumerate(texts) if t.startswith("STATUS=exiting:"))
    assert "STOPPING=1" in texts[exiting:]


# ---- socket activation ----------------------------------------------------------------------


def _socket_activate() -> str:
    path = shutil.which("systemd-socket-activate") or "/lib/systemd/systemd-socket-activate"
    if not Path(path).exists():
        pytest.skip("systemd-socket-activate missing (Debian package systemd)")
    return path


def test_socket_activation_json_and_ssip(tmp_path: Path) -> None:
    if not (ROOT / "daemon/frontends/ssip/frontend.py").exists():
        pytest.skip("SSIP front-end not there yet")
    if shutil.which("spd-say") is None:
        pytest.skip("spd-say missing (Debian package speech-dispatcher)")
    from tests.test_ssip import spd_env

    config = write_config(tmp_path, sink="null", realtime=True)
    own = load_config(config, env={}).socket  # where speakd would bind by itself
    act = tmp_path / "activated"
    act.mkdir()
    json_sock, ssip_sock = act / "speakd.sock", act / "ssip.sock"
    notify = NotifySocket(tmp_path / "notify.sock")
    log = tmp_path / "daemon.log"
    proc = subprocess.Popen(
        [
            _socket_activate(),
            "-l",
            str(json_sock),
            "-l",
            str(ssip_sock),
            "--fdname=json:ssip",
            "-E",
            f"NOTIFY_SOCKET={notify.path}",
            "-E",
            "WATCHDOG_USEC=30000000",  # the unit's WatchdogSec=30
            sys.executable,
            "-m",
            "speakd",
            "--log-level",
            "DEBUG",
            "serve",
            "--config",
            str(config),
        ],
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
    )
    try:
        wait_until(ssip_sock.exists, "the activation sockets", timeout=15)
        assert notify.texts() == [], "speakd must not start before the first connection"
        # The first connection starts speakd; the client waits on the socket meanwhile.
        r = subprocess.run(
            [
                str(SPEAKD_BIN),
                "say",
                "Hello through an activated socket.",
                "--wait",
                "--socket",
                str(json_sock),
            ],
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert r.returncode == 0, r.stderr + log.read_text()[-2000:]
        ready = notify.wait_for(lambda line: line == "READY=1", timeout=10)
        # STATUS follows the speech even though pings are only needed every 15 s.
        assert any(t.startswith("STATUS=speaking") for t in notify.texts(ready)), notify.texts()
        r = subprocess.run(
            ["spd-say", "-w", "Hello from spd-say."],
            capture_output=True,
            text=True,
            timeout=60,
            env=spd_env(ssip_sock),
        )
        assert r.returncode == 0, r.stderr + log.read_text()[-2000:]
        status = subprocess.run(
            [str(SPEAKD_BIN), "status", "--socket", str(json_sock)],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert '"finished": 2' in status.stdout, status.stdout
        assert not Path(own.path).exists() and not Path(own.ssip_path).exists()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0, log.read_text()[-2000:]
        # The daemon never unlinks sockets it inherited: the manager owns them.
        assert json_sock.exists() and ssip_sock.exists()
    finally:
        proc.kill()
        proc.wait()
        notify.close()


def test_install_help_and_bad_option() -> None:
    script = str(UNITS_DIR / "install.sh")
    r = subprocess.run([script, "--help"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0
    assert "--prefix DIR" in r.stdout and "DESTDIR" in r.stdout and "PIP_INSTALL_ARGS" in r.stdout
    r = subprocess.run([script, "--bogus"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and r.stdout == ""
    assert "unknown option --bogus" in r.stderr
