"""The device install resolves from aarch64 wheels for CPython 3.11, 3.12 and 3.13
(tests/arm64/wheels.py); a dependency without one fails the check and names itself."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.arm64 import wheels

PYTHONS = ("3.11", "3.12", "3.13")

pytestmark = [pytest.mark.arm64, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def check_output(tmp_path_factory: pytest.TempPathFactory) -> str:
    """One `wheels.py check` for all three versions (speakd's wheel is built once)."""
    args = [sys.executable, str(Path(wheels.__file__)), "check"]
    for python in PYTHONS:
        args += ["--python", python]
    args += ["--wheels", str(tmp_path_factory.mktemp("wheels"))]
    r = subprocess.run(args, capture_output=True, text=True, timeout=900)
    print(r.stdout)
    assert r.returncode in (0, 1), r.stderr
    return r.stdout


@pytest.mark.parametrize("python", PYTHONS)
def test_device_install_resolves_from_aarch64_wheels(python: str, check_output: str) -> None:
    block = re.search(
        rf"^CPython {re.escape(python)} aarch64: (.*?)(?=^CPython |\Z)", check_output, re.M | re.S
    )
    assert block, check_output
    assert not block.group(1).startswith("FAIL"), block.group(0)
    lines = block.group(0).splitlines()[1:]
    names = {line.split("==")[0].strip().lower() for line in lines}
    assert {"speakd", "onnxruntime", "numpy", "tokenizers", "piper-tts"} <= names
    for line in lines:  # every wheel is for aarch64 or for any platform
        wheel = line.split()[-1]
        assert wheel.endswith((".whl",)), line
        assert "aarch64" in wheel or wheel.endswith("-none-any.whl"), line
        assert "x86_64" not in wheel, line


def test_the_npu_extra_resolves_where_rockchip_publishes_wheels(tmp_path: Path) -> None:
    """``speakd[rknn]`` (rknn-toolkit-lite2, speakd.machine.npu's runtime) on CPython 3.11 and 3.12:
    the only aarch64 wheels Rockchip publishes (3.13 has none; the extra's marker skips it there, a
    marker pip evaluates for this host, so 3.13 is not resolved here)."""
    args = [sys.executable, str(Path(wheels.__file__)), "check", "--extra", "rknn"]
    args += ["--python", "3.11", "--python", "3.12", "--wheels", str(tmp_path)]
    r = subprocess.run(args, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr[-2000:]
    for python in ("311", "312"):
        assert f"rknn_toolkit_lite2-2.5.0-cp{python}-cp{python}-manylinux" in r.stdout, r.stdout


def test_pip_errors_name_the_dependency() -> None:
    old = (
        "ERROR: Could not find a version that satisfies the requirement docopt>=0.6.2 "
        "(from num2words) (from versions: none)\n"
        "ERROR: No matching distribution found for docopt>=0.6.2\n"
    )
    assert wheels.candidates(old) == [("docopt>=0.6.2", "num2words")]
    pinned_by_an_extra = (  # pip 26's words when wyoming[zeroconf] pinned zeroconf==0.88.0
        "The conflict is caused by:\n"
        "    speakd 0.1.0 depends on wyoming<2,>=1.8\n"
        '    wyoming[zeroconf] 1.10.2 depends on zeroconf==0.88.0; extra == "zeroconf"\n'
        '    wyoming[zeroconf] 1.10.1 depends on zeroconf==0.88.0; extra == "zeroconf"\n\n'
        "Additionally, some packages in these conflicts have no matching distributions "
        "available for your environment:\n    zeroconf\n"
    )
    assert wheels.candidates(pinned_by_an_extra) == [
        ("wyoming<2,>=1.8", "speakd 0.1.0"),
        ("zeroconf==0.88.0", "wyoming[zeroconf] 1.10.2"),
    ]
    assert wheels.candidates("ERROR: something else") == []


def test_the_dependency_without_an_aarch64_wheel_is_told_apart(tmp_path: Path) -> None:
    """zeroconf 0.88.0 ships x86_64 wheels only; wyoming is pure Python (PyPI metadata)."""
    assert wheels.has_wheel("wyoming==1.10.2", "3.11", tmp_path)
    assert not wheels.has_wheel("zeroconf==0.88.0", "3.11", tmp_path)


def _project(root: Path, name: str, binary: bool) -> Path:
    """A local sdist-like project; ``binary`` makes setuptools tag it for this platform (as a
    C extension would) without compiling anything."""
    d = root / name
    (d / name).mkdir(parents=True)
    (d / name / "__init__.py").write_text("")
    extra = (
        "from setuptools.dist import Distribution\n"
        "class D(Distribution):\n    def has_ext_modules(self):\n        return True\n"
        if binary
        else "D = None\n"
    )
    (d / "setup.py").write_text(
        "from setuptools import setup\n" + extra
        + f"setup(name={name!r}, version='1.0', packages=[{name!r}]"
        + (", distclass=D)\n" if binary else ")\n")
    )  # fmt: skip
    return d


def test_a_dependency_that_is_not_pure_python_fails_naming_itself(tmp_path: Path) -> None:
    project = _project(tmp_path, "needs_a_compiler", binary=True)
    with pytest.raises(wheels.NoArmWheel) as e:
        wheels.build_pure(str(project), "speakd", "3.11", tmp_path / "local", [])
    message = str(e.value)
    assert message.startswith(f"{project} (required by speakd): no aarch64 wheel for CPython 3.11")
    assert "not pure Python" in message and "needs_a_compiler-1.0-cp" in message


def test_a_pure_python_sdist_is_built_as_a_wheel_for_arm(tmp_path: Path) -> None:
    project = _project(tmp_path, "pure_thing", binary=False)
    wheel = wheels.build_pure(str(project), "speakd", "3.11", tmp_path / "local", [])
    assert wheel.name == "pure_thing-1.0-py3-none-any.whl" and wheel.is_file()


def test_platform_tags_cover_bookworm_glibc() -> None:
    args = wheels.platform_args("3.12")
    platforms = {args[i + 1] for i, a in enumerate(args) if a == "--platform"}
    assert {"manylinux2014_aarch64", "manylinux_2_17_aarch64", "manylinux_2_28_aarch64",
            "manylinux_2_36_aarch64"} <= platforms  # fmt: skip
    assert "manylinux_2_37_aarch64" not in platforms  # newer than bookworm's glibc 2.36
    assert args[args.index("--abi") + 1] == "cp312"
