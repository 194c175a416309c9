"""What each documented set-up's test starts, recorded by the test as it starts it.

docs/setups.md's table names, for each way the docs tell a user to run speakd, the shipped files
it starts and the test that starts them. The tests call :func:`started` at the moment they start
a set-up, with the repository files that set-up runs, found from what they start (the unit file
and the config its command reads, the image's entry point and config compared byte for byte with
the repository's, the ``--config`` of ``make run``'s command), never from the test's text.
``tests/conftest.py`` holds each table test to its row once it has passed: every file the row
names must have been started (:func:`unstarted`). tests/test_setups.py checks that every shipped
file has a row.
"""

from __future__ import annotations

import os
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SETUPS = ROOT / "docs" / "setups.md"
# What a set-up starts: configs, units, entry points, as the repository ships them
SHIPPED = (
    "systemd/*.toml",
    "systemd/*.service",
    "systemd/user/*.service",
    "examples/*.toml",
    "container/entrypoint",
    "homeassistant/speakd/rootfs/usr/local/bin/speakd-addon",
    "homeassistant/speakd/rootfs/usr/local/share/speakd/*.toml",
)
# Where the .deb installs what systemd/ ships (systemd/debian/build.sh)
INSTALLED = {
    "/usr/lib/systemd/system/": "systemd/",
    "/usr/lib/systemd/user/": "systemd/user/",
    "/etc/speakd/": "systemd/",
}
PACKAGE_CONFIG = "/etc/speakd/speakd.toml"  # what `speakd serve` reads with no --config
_PATH = re.compile(r"`((?:systemd|examples|container|homeassistant)/[^`]+)`")
_started: dict[str, set[str]] = {}  # test id -> the repository files it started


@dataclass(frozen=True)
class Setup:
    name: str
    files: frozenset[str]  # the repository files docs/setups.md says it starts
    test: str  # its test's id: tests/test_x.py::test_name


def documented() -> dict[str, Setup]:
    """docs/setups.md's table, by test id."""
    rows = {}
    for line in SETUPS.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 4 or not cells[3].startswith("`tests/"):
            continue
        test = cells[3].strip("`")
        rows[test] = Setup(cells[0], frozenset(_PATH.findall(cells[2])), test)
    return rows


def shipped() -> set[str]:
    return {str(p.relative_to(ROOT)) for pattern in SHIPPED for p in ROOT.glob(pattern)}


def current_test() -> str:
    """The running test's id, as pytest sets it for the test's own process."""
    return os.environ["PYTEST_CURRENT_TEST"].rsplit(" ", 1)[0]


def started(*files: str | Path) -> None:
    """The running test has started a set-up that runs these files: the repository's (a
    relative path is the checkout's, where ``make run`` runs), or the package's installed
    copies of systemd/'s files; others are not the repository's and are left out."""
    names = set()
    for file in map(str, files):
        prefix = next((p for p in INSTALLED if file.startswith(p)), None)
        path = ROOT / INSTALLED[prefix] / file.removeprefix(prefix) if prefix else ROOT / file
        if path.resolve().is_relative_to(ROOT):
            names.add(str(path.resolve().relative_to(ROOT)))
    _started.setdefault(current_test(), set()).update(names)


def config_of(command: list[str] | str) -> str | None:
    """The config file ``speakd … serve`` reads: its --config, else the package's if there."""
    argv = shlex.split(command) if isinstance(command, str) else command
    if "--config" in argv:
        return argv[argv.index("--config") + 1]
    return PACKAGE_CONFIG if Path(PACKAGE_CONFIG).is_file() else None


def started_in_image(root: Path, *paths: str) -> None:
    """The running test has started an image whose files ``paths`` (its entry point, the config
    that reads) are the repository's, byte for byte."""
    candidates = shipped()
    for path in paths:
        content = (root / path.lstrip("/")).read_bytes()
        same = [name for name in candidates if (ROOT / name).read_bytes() == content]
        assert same, f"{path} in the image is none of the repository's shipped files"
        started(*same)


def unstarted(test: str) -> set[str]:
    """The files ``test``'s row names that the test did not start."""
    setup = documented().get(test)
    return set() if setup is None else set(setup.files) - _started.get(test, set())
