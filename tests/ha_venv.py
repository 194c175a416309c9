"""A real Home Assistant Core from PyPI in its own venv, built by the tests with ``uv`` on
pyenv's CPython 3.13.0 and cached under ``~/.cache/speakd-tests`` (a fresh machine builds it in
the test run). Every requirement of the integrations the tests load is installed up front, read
from the installed release's own manifests, so HA never pip-installs at runtime (it starts with
``--skip-pip`` and would fail loudly if something were missing)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

# release -> the Python version uv resolves for. 2026.2.3 wants 3.13.2; 3.13.0 has the same ABI,
# so the venv copy's start-up gate is lowered to 3.13.0 (only in that copy).
RELEASES = {"2025.4.4": "3.13.0", "2026.2.3": "3.13.2"}
CACHE = Path(os.environ.get("SPEAKD_TEST_CACHE", Path.home() / ".cache" / "speakd-tests"))
# Integrations the tests load beyond HA's always-loaded defaults (bootstrap DEFAULT_INTEGRATIONS).
DOMAINS = ("wyoming", "mqtt", "onboarding", "tts", "assist_pipeline", "conversation", "api")


class HaUnavailable(RuntimeError):
    """No interpreter or no install: a skip locally, a failure with CI=true."""


@dataclass(frozen=True)
class HaVenv:
    release: str
    root: Path

    @property
    def python(self) -> Path:
        return self.root / "bin" / "python"


def interpreter() -> Path:
    """pyenv's CPython 3.13.0 (``SPEAKD_TEST_PY313`` overrides)."""
    env = os.environ.get("SPEAKD_TEST_PY313")
    pyenv_root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv"))
    path = Path(env) if env else pyenv_root / "versions" / "3.13.0" / "bin" / "python3.13"
    if not path.exists():
        raise HaUnavailable(f"no CPython 3.13 at {path} (pyenv install 3.13.0)")
    return path


def _uv() -> str:
    found = shutil.which("uv") or str(Path(sys.executable).parent / "uv")
    if not Path(found).exists():
        raise HaUnavailable("uv is not installed (pip install -e '.[dev]')")
    return found


def _run(*cmd: str | Path) -> str:
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=900)
    if r.returncode != 0:
        raise HaUnavailable(f"{' '.join(map(str, cmd[:4]))} failed:\n{r.stderr[-3000:]}")
    return r.stdout


# Run in the HA venv: every requirement of DOMAINS and of HA's default integrations, following
# manifest dependencies (HA's own files, read where they are installed, never copied).
_REQUIREMENTS_SCRIPT = """
import json, sys
from pathlib import Path
import homeassistant, homeassistant.bootstrap as b
comp = Path(homeassistant.__file__).parent / "components"
todo = list(sys.argv[1:]) + sorted(b.DEFAULT_INTEGRATIONS) + sorted(b.CORE_INTEGRATIONS)
todo += [d for _, group, _ in b.STAGE_0_INTEGRATIONS for d in group]
seen, reqs = set(), set()
while todo:
    d = todo.pop()
    if d in seen or not (comp / d / "manifest.json").exists():
        continue
    seen.add(d)
    m = json.loads((comp / d / "manifest.json").read_text())
    reqs.update(m.get("requirements", []))
    todo += m.get("dependencies", []) + m.get("after_dependencies", [])
print("\\n".join(sorted(reqs)))
"""


def _lower_python_gate(venv: Path) -> None:
    """2026.2.3 refuses to start below 3.13.2: same ABI as 3.13.0, so the copy's gate drops."""
    (const,) = venv.glob("lib/python3.13/site-packages/homeassistant/const.py")
    text = const.read_text()
    gate = "REQUIRED_PYTHON_VER: Final[tuple[int, int, int]] = (3, 13, 2)"
    if gate in text:
        const.write_text(text.replace(gate, gate.replace("(3, 13, 2)", "(3, 13, 0)")))


def build(release: str) -> HaVenv:
    """The cached venv for ``release``, built (uv venv, HA, its integrations' requirements) if
    the cache has no complete one; a marker file is written last, so a half build is redone."""
    root = CACHE / f"homeassistant-{release}"
    marker = root / ".speakd-complete"
    if marker.exists():
        return HaVenv(release, root)
    python, uv = interpreter(), _uv()
    shutil.rmtree(root, ignore_errors=True)
    root.parent.mkdir(parents=True, exist_ok=True)
    _run(uv, "venv", "--quiet", "--python", python, root)
    pin = ("--python", root / "bin" / "python", "--python-version", RELEASES[release])
    _run(uv, "pip", "install", "--quiet", *pin, f"homeassistant=={release}")
    _lower_python_gate(root)
    reqs = _run(root / "bin" / "python", "-c", _REQUIREMENTS_SCRIPT, *DOMAINS).split()
    _run(uv, "pip", "install", "--quiet", *pin, f"homeassistant=={release}", *reqs)
    marker.write_text(release)
    return HaVenv(release, root)


def build_all() -> dict[str, HaVenv | HaUnavailable]:
    """Every release at once (the two installs overlap their downloads): each one's venv, or
    why it cannot be had."""

    def one(release: str) -> HaVenv | HaUnavailable:
        try:
            return build(release)
        except HaUnavailable as e:
            return e

    with ThreadPoolExecutor(len(RELEASES)) as pool:
        return dict(zip(RELEASES, pool.map(one, RELEASES), strict=True))


if __name__ == "__main__":  # build ahead of a test run: python -m tests.ha_venv 2025.4.4 ...
    for name in sys.argv[1:] or RELEASES:
        print(build(name).root)
