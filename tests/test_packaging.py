"""The install layout: every package is listed, every CLI command is documented."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_every_folder_that_ships_is_a_listed_package() -> None:
    """A folder of a package, with or without ``__init__.py`` (``daemon/data`` holds only the HTTP
    page), is importable to Python; setuptools warns at every ``pip install`` when it is absent
    from ``packages``. A folder without ``__init__.py`` exists only to ship its files, so they
    must be declared package data or the wheel leaves them out."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(config["packages"])
    for import_name, folder in config["package-dir"].items():
        for path in (ROOT / folder).rglob("*"):
            if not path.is_file() or "__pycache__" in path.parts:
                continue
            rel = path.parent.relative_to(ROOT / folder)
            name = ".".join([import_name, *rel.parts])
            assert name in listed, f"{path.parent} ships files but {name} is not in packages"
            if not (path.parent / "__init__.py").exists():
                patterns = config.get("package-data", {}).get(name, [])
                assert any(path.match(p) for p in patterns), f"{path}: not in package-data"


def test_device_runtime_never_imports_the_host_stack() -> None:
    pattern = re.compile(
        r"^\s*(import|from)\s+(torch|torchaudio|transformers|ChatTTS|vocos)\b", re.M
    )
    offenders = [
        str(p.relative_to(ROOT))
        for p in (ROOT / "daemon").rglob("*.py")
        if pattern.search(p.read_text())
    ]
    assert offenders == []


def _commands(parser: argparse.ArgumentParser) -> list[str]:
    [sub] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return list(sub.choices)


def test_every_speakd_command_has_help_and_is_in_the_readme() -> None:
    from speakd.cli import build_parser

    readme = (ROOT / "README.md").read_text()
    for command in _commands(build_parser()):
        r = subprocess.run(
            [sys.executable, "-m", "speakd", command, "--help"], capture_output=True, text=True
        )
        assert r.returncode == 0 and "usage:" in r.stdout, command
        assert f"speakd {command}" in readme, f"`speakd {command}` is not documented in README.md"
