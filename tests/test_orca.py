"""Debian's Orca screen reader against a real speakd, headless: Xvfb, a private D-Bus session and
AT- SPI bus, a small GTK 3 window typed into with ``xdotool``. Orca (system python3, not the
venv) finds speakd where every libspeechd client looks, with no ``SPEECHD_ADDRESS``: a logging
proxy (``ssip_proxy.py``) listens at Speech Dispatcher's per-user socket,
``$XDG_RUNTIME_DIR/speech- dispatcher/speechd.sock`` (where ``systemd/user/speakd-ssip.socket``
puts speakd), and passes every line to speakd on its realtime WAV sink. The test reads the
proxy's log: speech happens, speakd refuses nothing Orca sends, marks come after ``701 BEGIN``
in text order and before the end, and Orca's longest marked sentence lasts as long as the same
text without marks (the two WAV files, within 2 %).

Every process the test starts is ended by PID; the ones the buses start (at-spi2-registryd,
dconf- service, the accessibility bus) are found by the private ``XDG_RUNTIME_DIR`` they carry.
Skipped only when Orca is not installed (``make test`` installs it).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import statistics
import subprocess
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from speakd.audio import read_wav
from speakd_tools.bench.screenreader.ssip_session import SsipSession
from tests.daemon_proc import DaemonProc, start_daemon, write_config
from tests.ssip_proxy import SsipProxy
from tests.waits import wait_until

pytestmark = pytest.mark.skipif(shutil.which("orca") is None, reason="Orca is not installed")

SYSTEM_PYTHON = "/usr/bin/python3"  # Debian's, with python3-gi: GTK is not in the venv
WINDOW = """
import gi
gi.require_version("Gtk", "3.0")
from gi.repository import Gtk
win = Gtk.Window(title="speakd orca test")
box = Gtk.Box(orientation=Gtk.Orientation.VERTICAL)
bar = Gtk.MenuBar()
top = Gtk.MenuItem.new_with_mnemonic("_File")
menu = Gtk.Menu()
for label in ("New window", "Open recent"):
    menu.append(Gtk.MenuItem(label=label))
menu.append(Gtk.CheckMenuItem(label="Word wrap"))
top.set_submenu(menu)
bar.append(top)
box.add(bar)
label = Gtk.Label.new_with_mnemonic("_Name:")
entry = Gtk.Entry()
label.set_mnemonic_widget(entry)
box.add(label)
box.add(entry)
box.add(Gtk.CheckButton(label="Remember me"))
box.add(Gtk.Button(label="Send the quick brown fox"))
view = Gtk.TextView()
view.get_buffer().set_text(
    "The first line of the notes.\\nA second line follows it.\\nThe last line ends here."
)
box.add(view)
win.add(box)
win.connect("destroy", Gtk.main_quit)
win.show_all()
Gtk.main()
"""


class Desktop:
    """The processes of one headless session, ended by PID in reverse order."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.procs: list[subprocess.Popen[bytes]] = []
        run = root / "run"
        for d in ("home", "config", "data", "cache"):
            (root / d).mkdir(parents=True)
        run.mkdir(mode=0o700)
        self.env = {
            "PATH": "/usr/bin:/bin",
            "LANG": "C.UTF-8",
            "HOME": str(root / "home"),
            "XDG_RUNTIME_DIR": str(run),
            "XDG_CONFIG_HOME": str(root / "config"),
            "XDG_DATA_HOME": str(root / "data"),
            "XDG_CACHE_HOME": str(root / "cache"),
        }

    def start(self, name: str, argv: list[str], **env: str) -> subprocess.Popen[bytes]:
        log = (self.root / f"{name}.log").open("wb")
        p = subprocess.Popen(argv, env={**self.env, **env}, stdout=log, stderr=subprocess.STDOUT)
        self.procs.append(p)
        return p

    def run(self, *argv: str) -> str:
        r = subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, f"{argv}: {r.stderr}"
        return r.stdout

    def close(self) -> None:
        for p in reversed(self.procs):
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(5)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(5)
        for pid in self.bus_children():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)

    def bus_children(self) -> list[int]:
        """PIDs of processes carrying this session's XDG_RUNTIME_DIR (started by the buses)."""
        mark = f"XDG_RUNTIME_DIR={self.env['XDG_RUNTIME_DIR']}".encode()
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            try:
                if mark in (entry / "environ").read_bytes().split(b"\0"):
                    found.append(int(entry.name))
            except OSError:
                continue
        return found


def start_session(d: Desktop) -> None:
    """Xvfb, one D-Bus session (its address read from a child of ``dbus-run-session``), the
    accessibility settings and the AT-SPI bus."""
    r, w = os.pipe()
    xvfb = subprocess.Popen(
        ["Xvfb", "-displayfd", str(w), "-screen", "0", "1024x768x24", "-nolisten", "tcp"],
        env=d.env,
        pass_fds=(w,),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    d.procs.append(xvfb)
    os.close(w)
    with os.fdopen(r) as f:
        display = f.readline().strip()
    assert display, "Xvfb gave no display number"
    d.env["DISPLAY"] = f":{display}"
    address = d.root / "bus-address"
    d.start(
        "dbus",
        [
            "dbus-run-session",
            "--",
            "sh",
            "-c",
            f'echo "$DBUS_SESSION_BUS_ADDRESS" > {address}; exec sleep 600',
        ],
    )
    wait_until(lambda: address.exists() and address.read_text().strip(), "the session bus")
    d.env["DBUS_SESSION_BUS_ADDRESS"] = address.read_text().strip()
    d.run("gsettings", "set", "org.gnome.desktop.interface", "toolkit-accessibility", "true")
    d.run(
        "gsettings", "set", "org.gnome.desktop.a11y.applications", "screen-reader-enabled", "true"
    )
    d.start("at-spi", ["/usr/libexec/at-spi-bus-launcher", "--launch-immediately"])


@pytest.fixture
def orca_run(tmp_path: Path) -> Iterator[tuple[SsipProxy, DaemonProc, Desktop]]:
    desktop = Desktop(tmp_path / "desktop")
    daemon = start_daemon(write_config(tmp_path, sink="wav", realtime=True))
    try:
        # Speech Dispatcher's per-user socket, as the user units put speakd's SSIP socket there.
        default = Path(desktop.env["XDG_RUNTIME_DIR"]) / "speech-dispatcher" / "speechd.sock"
        default.parent.mkdir()
        proxy = SsipProxy(default, str(tmp_path / "ssip.sock"))
        try:
            start_session(desktop)
            yield proxy, daemon, desktop
        finally:
            desktop.close()
            proxy.close()
            (tmp_path / "ssip.log").write_text(
                "".join(
                    f"{ln.at:.4f} {ln.conn} {'>' if ln.to_server else '<'} {ln.text}\n"
                    for ln in proxy.snapshot()
                )
            )
            wait_until(lambda: not desktop.bus_children(), "the session's processes to end")
    finally:
        daemon.stop()


NAVIGATION = ("space", "space", "Tab", "Tab", "Up", "Up", "F10", "Down", "Down", "Down", "Escape")


def press(d: Desktop, proxy: SsipProxy, window: str, key: str) -> None:
    """One key, and Orca's speech for it begun."""
    n = len(spoken(proxy))
    d.run("xdotool", "key", "--window", window, key)
    wait_until(lambda: len(spoken(proxy)) > n, f"Orca's speech for {key}", 20)


def spoken(proxy: SsipProxy) -> list[str]:
    return [" ".join(m.body) for m in proxy.messages() if any(e[0] == "701" for e in m.events)]


def test_orca_speaks_through_speakd_and_nothing_is_refused(
    orca_run: tuple[SsipProxy, DaemonProc, Desktop],
) -> None:
    proxy, daemon, d = orca_run
    (d.root / "window.py").write_text(WINDOW)
    d.start("window", [SYSTEM_PYTHON, str(d.root / "window.py")], GTK_MODULES="gail:atk-bridge")
    window = wait_until(
        lambda: subprocess.run(
            ["xdotool", "search", "--name", "speakd orca test"],
            env=d.env,
            capture_output=True,
            text=True,
        ).stdout.split(),
        "the GTK window",
        timeout=30,
    )[0]
    d.start(
        "orca",
        ["orca", "--replace"],
        SPEECHD_CMD="/bin/false",  # no address: libspeechd's default path; never autospawn
    )
    wait_until(lambda: spoken(proxy), "Orca's first speech", timeout=60)
    d.run("xdotool", "windowfocus", "--sync", window)
    wait_until(
        lambda: any("Name" in s for s in spoken(proxy)), "Orca to read the entry", timeout=30
    )
    before = len(spoken(proxy))
    for key in ("h", "e", "y", "Left", "Tab"):
        press(d, proxy, window, key)
    assert len(spoken(proxy)) > before

    # Navigation: new text, none of it cached: a check box toggled, lines arrowed onto, a menu.
    navigated = len(proxy.messages())
    for key in NAVIGATION:
        press(d, proxy, window, key)
    # Each line and menu item starts with its sound, not the voice's leading silence (40–95 ms
    # before issue 45): speakd's first audio is its 701 BEGIN plus this. Most are stopped by the
    # next key; a stopped one's WAV file holds what played.
    wait_until(
        lambda: all(
            any(e[0] in ("702", "703") for e in m.events) for m in proxy.messages()[navigated:]
        ),
        "the navigation's speech to end",
        30,
    )
    began = [m for m in proxy.messages()[navigated:] if any(e[0] == "701" for e in m.events)]
    lines = [m for m in began if len(MARK.findall(" ".join(m.body))) >= 2]
    leads = [ms for ms in (lead_ms(daemon, m.msg_id) for m in lines) if ms < float("inf")]
    assert len(leads) >= 4, [m.body for m in began]  # the rest stopped before a sound
    assert statistics.median(leads) < 25, leads  # 28–49 ms (median 34) before

    refused = [ln.text for ln in proxy.replies() if ln.text[:1] in "45"]
    assert not refused, refused
    sent = [ln.text.split()[:3] for ln in proxy.snapshot() if ln.to_server]
    assert ["SET", "self", "CLIENT_NAME"] in sent

    # Marks arrive as Speech Dispatcher sends them: 701 BEGIN, the 700s in text order, then
    # 702 END or 703 CANCELED last. A message that ended was heard to its end: every mark came;
    # only a cancelled one may stop after some of them.
    marked = [m for m in proxy.messages() if any(e[0] == "700" for e in m.events)]
    assert marked, "Orca sent no marked speech"
    for m in marked:
        codes = [e[0] for e in m.events]
        assert codes[0] == "701", (m.body, codes)
        assert codes[-1] in ("702", "703"), (m.body, codes)
        assert set(codes[1:-1]) == {"700"}, (m.body, codes)
        names = [e[2] for e in m.events if e[0] == "700"]
        every = MARK.findall(" ".join(m.body))
        assert names == (every if codes[-1] == "702" else every[: len(names)]), (m.body, names)

    # Orca's longest marked sentence lasts as long as the same text without marks (within 2 %).
    body = max((" ".join(m.body) for m in marked), key=lambda b: len(MARK.findall(b)))
    assert len(MARK.findall(body)) >= 3, body  # a sentence, not a word: the title or the button
    plain = MARK_TAG.sub("", body)
    marked_s, plain_s = (spoken_seconds(daemon, text) for text in (body, plain))
    assert abs(marked_s / plain_s - 1) <= 0.02, (body, marked_s, plain_s)


MARK = re.compile(r'<mark name="([^"]*)"/>')
MARK_TAG = re.compile(r"<mark [^>]*/>")


def lead_ms(daemon: DaemonProc, msg_id: str) -> float:
    """ms from a message's first sample to its first above −50 dBFS, in speakd's WAV file."""
    wav = daemon.config.parent / "wav" / f"ssip-{msg_id}.wav"
    audio = wait_until(lambda: wav.exists() and read_wav(wav), f"{wav} in place")
    loud = np.flatnonzero(np.abs(audio.samples().astype(np.int32)) >= 104)
    return 1000 * loud[0] / audio.sample_rate if loud.size else float("inf")


def spoken_seconds(daemon: DaemonProc, ssml: str) -> float:
    """Say ``ssml`` on speakd's SSIP socket to its end; the length of its WAV file in seconds."""
    s = SsipSession(str(daemon.config.parent / "ssip.sock"))
    try:
        for line in ("NOTIFICATION end on", "NOTIFICATION cancel on", "SSML_MODE on"):
            s.command(f"SET self {line}")
        msg_id = s.speak(ssml)
        assert s.wait(msg_id, "702", "703", timeout=60)[0] == "702"
    finally:
        s.close()
    wav = daemon.config.parent / "wav" / f"ssip-{msg_id}.wav"
    return wait_until(lambda: wav.exists() and read_wav(wav).duration, f"{wav} in place")
