"""The install layout: every package is listed, every CLI command is documented."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_every_subpackage_is_listed_in_pyproject() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(config["packages"])
    for import_name, folder in config["package-dir"].items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder)
            name = ".".join([import_name, *rel.parts])
            assert name in listed, f"{init.parent} is not in [tool.setuptools] packages"


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
