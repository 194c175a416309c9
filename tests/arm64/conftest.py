"""The ``arm64`` marker: tests that run speakd on an emulated aarch64 CPU (tests/arm64/)."""

from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "arm64: speakd under qemu-aarch64 (arm64 Debian root, aarch64 wheels) compared with x86; "
        "run alone with `pytest -m arm64`",
    )
