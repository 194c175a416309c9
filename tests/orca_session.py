"""A headless desktop with the Orca screen reader for end-to-end tests: Xvfb, a private D-Bus
session, AT-SPI, a small GTK 3 window and ``orca --replace`` pointed at an SSIP socket.

Every process is started here and ended here by PID; the ones the buses start on their own
(at-spi2-registryd, dconf-service) are found by the private ``XDG_RUNTIME_DIR`` in their
environment.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from tests.waits import wait_until

TOOLS = ("orca", "Xvfb", "xdotool", "dbus-daemon", "gsettings")
SYSTEM_PYTHON = "/usr/bin/python3"  # python3-gi is the system's, not the venv's
BUS_LAUNCHER = "/usr/libexec/at-spi-bus-launcher"

WINDOW = """
import sys
import gi
gi.require_version("Gtk", "3.0")
from gi.repository import Gtk
win = Gtk.Window(title="speakd test")
box = Gtk.Box(orientation=Gtk.Orientation.VERTICAL)
label = Gtk.Label(label=sys.argv[1])
entry = Gtk.Entry()
entry.get_accessible().set_name(sys.argv[1])
box.add(label)
box.add(entry)
win.add(box)
win.connect("destroy", Gtk.main_quit)
win.show_all()
entry.grab_focus()
Gtk.main()
"""


def missing() -> list[str]:
    """What this machine lacks to run Orca headless."""
    lack = [t for t in TOOLS if shutil.which(t) is None]
    lack += [p for p in (SYSTEM_PYTHON, BUS_LAUNCHER) if not Path(p).exists()]
    if not lack:
        r = subprocess.run(
            [SYSTEM_PYTHON, "-c", "import gi; gi.require_version('Gtk', '3.0')"],
            capture_output=True,
        )
        if r.returncode:
            lack.append("python3-gi with gir1.2-gtk-3.0")
    return lack


@dataclass
class OrcaDesktop:
    root: Path
    ssip_socket: Path
    title: str  # the label and the entry's accessible name: what Orca says on focus
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    window_id: str = ""

    def __enter__(self) -> OrcaDesktop:
        try:
            self._start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _spawn(
        self, *argv: str, env: dict[str, str] | None = None, **kw: object
    ) -> subprocess.Popen[bytes]:
        log = (self.root / f"{Path(argv[0]).name}.log").open("ab")
        p = subprocess.Popen(
            argv,
            env=env or self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            **kw,  # type: ignore[call-overload]
        )
        self.procs.append(p)
        return p

    def _start(self) -> None:
        dirs = {
            k: self.root / k.lower()
            for k in (
                "HOME",
                "XDG_RUNTIME_DIR",
                "XDG_CONFIG_HOME",
                "XDG_DATA_HOME",
                "XDG_CACHE_HOME",
            )
        }
        for d in dirs.values():
            d.mkdir(mode=0o700, parents=True, exist_ok=True)
        keep = {k: os.environ[k] for k in ("PATH", "LANG") if k in os.environ}
        self.env = {**keep, **{k: str(v) for k, v in dirs.items()}, "NO_AT_BRIDGE": "0"}
        read, write = os.pipe()
        self._spawn(
            "Xvfb",
            "-displayfd",
            str(write),
            "-screen",
            "0",
            "800x600x24",
            "-nolisten",
            "tcp",
            pass_fds=(write,),
        )
        os.close(write)
        with os.fdopen(read) as f:
            self.env["DISPLAY"] = ":" + f.readline().strip()
        read, write = os.pipe()
        self._spawn(
            "dbus-daemon", "--session", "--nofork", f"--print-address={write}", pass_fds=(write,)
        )
        os.close(write)
        with os.fdopen(read) as f:
            self.env["DBUS_SESSION_BUS_ADDRESS"] = f.readline().strip()
        for key in (
            "org.gnome.desktop.interface toolkit-accessibility",
            "org.gnome.desktop.a11y.applications screen-reader-enabled",
        ):
            subprocess.run(
                ["gsettings", "set", *key.split(), "true"], env=self.env, check=True, timeout=30
            )
        self._spawn(BUS_LAUNCHER, "--launch-immediately")
        self._spawn(
            SYSTEM_PYTHON,
            "-c",
            WINDOW,
            self.title,
            env={**self.env, "GTK_MODULES": "gail:atk-bridge"},
        )
        self.window_id = wait_until(self._find_window, "the GTK window to map", 30)
        orca_env = {
            **self.env,
            "SPEECHD_ADDRESS": f"unix_socket:{self.ssip_socket}",
            "SPEECHD_CMD": "/bin/false",
        }
        self._spawn(
            "orca", "--replace", f"--debug-file={self.root / 'orca-debug.txt'}", env=orca_env
        )

    def _find_window(self) -> str:
        r = subprocess.run(
            ["xdotool", "search", "--name", "speakd test"],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=10,
        )
        return r.stdout.split()[0] if r.stdout.split() else ""

    def focus(self) -> None:
        """With no window manager, a window needs focusing before Orca reads it."""
        subprocess.run(
            ["xdotool", "windowfocus", "--sync", self.window_id],
            env=self.env,
            check=True,
            timeout=10,
        )

    def key(self, *keys: str) -> None:
        subprocess.run(
            ["xdotool", "key", "--window", self.window_id, *keys],
            env=self.env,
            check=True,
            timeout=10,
        )

    def type(self, text: str) -> None:
        subprocess.run(
            ["xdotool", "type", "--delay", "100", "--window", self.window_id, text],
            env=self.env,
            check=True,
            timeout=30,
        )

    def close(self) -> None:
        """End what was started, newest first, then what the buses started for this session."""
        for p in reversed(self.procs):
            if p.poll() is None:
                p.terminate()
        for p in reversed(self.procs):
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(10)
        for pid in self._session_pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)

    def _session_pids(self) -> list[int]:
        mark = f"XDG_RUNTIME_DIR={self.root / 'xdg_runtime_dir'}".encode()
        pids = []
        for d in Path("/proc").iterdir():
            if d.name.isdigit():
                try:
                    if mark in (d / "environ").read_bytes().split(b"\0"):
                        pids.append(int(d.name))
                except OSError:
                    pass
        return pids
