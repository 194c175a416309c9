"""Resolve speakd's device install from aarch64 (or x86_64) wheels only, for a CPython version.

Run on the host (any architecture) with its pip; the stdlib only::

    python tests/arm64/wheels.py check --python 3.11 --python 3.12 --python 3.13
    python tests/arm64/wheels.py resolve --python 3.11 --wheels DIR --pins OUT [--constraints F]
    python tests/arm64/wheels.py install --python 3.11 --wheels DIR --pins F --target SITE

``--arch x86_64`` resolves for amd64 boards instead (the Debian package, systemd/debian/build.sh).

speakd itself is built as a wheel from this checkout (it must be pure Python) and pip resolves its
dependencies with ``--only-binary=:all:`` for every ``manylinux_2_17..2_36_aarch64`` tag (Debian
bookworm's glibc is 2.36; onnxruntime's aarch64 wheels are ``manylinux_2_27/2_28``, not
``manylinux2014``). A dependency that PyPI serves only as an sdist is built here with
``pip wheel``: if that gives a ``none-any`` wheel it is pure Python and is used on ARM as is;
otherwise the dependency has no aarch64 wheel and the check fails naming it.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
GLIBC_MINORS = range(17, 37)  # manylinux_2_17 .. manylinux_2_36 (bookworm: glibc 2.36)
MAX_SDIST_BUILDS = 8
SDIST_BUILD_TIMEOUT_S = 300


class NoArmWheel(Exception):
    """A dependency has no aarch64 wheel for that Python and is not pure Python."""


def platform_args(python: str, arch: str = "aarch64") -> list[str]:
    tag = "cp" + python.replace(".", "")
    args = ["--only-binary=:all:", "--python-version", python, "--implementation", "cp"]
    args += ["--abi", tag, "--abi", "abi3", "--abi", "none"]
    args += ["--platform", f"manylinux2014_{arch}"]
    for minor in GLIBC_MINORS:
        args += ["--platform", f"manylinux_2_{minor}_{arch}"]
    return args


def pip(*args: str, timeout: float | None = None) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "pip", "--disable-pip-version-check", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def build_speakd(out: Path) -> Path:
    r = pip("wheel", "--no-deps", "-q", "-w", str(out), str(REPO))
    if r.returncode:
        raise SystemExit(f"building speakd's wheel failed:\n{r.stderr[-3000:]}")
    (wheel,) = out.glob("speakd-*.whl")
    if not wheel.name.endswith("-py3-none-any.whl"):
        raise NoArmWheel(f"speakd's own wheel is not pure Python: {wheel.name}")
    return wheel


def candidates(said: str) -> list[tuple[str, str]]:
    """(requirement, who required it) pairs that pip's resolution error points at, in order:
    every "X depends on Y" of its conflict explanation and every "No matching distribution found
    for Y" (pip's wording does not always say which one lacks a wheel; ``has_wheel`` decides)."""
    out: dict[str, str] = {}
    for m in re.finditer(r"^\s+(\S+ \S+) depends on ([^;\s]+)", said, re.M):
        out.setdefault(m.group(2), m.group(1))
    for m in re.finditer(r"No matching distribution found for (\S+)", said):
        req = m.group(1)
        who = re.search(r"satisfies the requirement " + re.escape(req) + r" \(from ([^)]+)\)", said)
        out.setdefault(req, who.group(1) if who else "speakd")
    return list(out.items())


def has_wheel(req: str, python: str, local: Path, arch: str = "aarch64") -> bool:
    """Whether ``req`` alone (no dependencies) has an ``arch`` or pure wheel (metadata only)."""
    with tempfile.TemporaryDirectory() as tmp:
        r = pip(
            "install", "--dry-run", "--no-deps", "--ignore-installed", "-q", "--target", tmp,
            "--find-links", str(local), *platform_args(python, arch), req,
        )  # fmt: skip
    return r.returncode == 0


def build_pure(
    req: str, who: str, python: str, local: Path, constraints: list[str], arch: str = "aarch64"
) -> Path:
    """Build an sdist-only requirement on the host; it must come out ``none-any``."""
    with tempfile.TemporaryDirectory() as tmp:
        try:
            r = pip(
                "wheel",
                "--no-deps",
                "--no-binary=:all:",
                "-q",
                "-w",
                tmp,
                *constraints,
                req,
                timeout=SDIST_BUILD_TIMEOUT_S,
            )
        except subprocess.TimeoutExpired as e:
            raise NoArmWheel(
                f"{req} (required by {who}): no {arch} wheel for CPython {python}, and its "
                f"sdist did not build within {SDIST_BUILD_TIMEOUT_S} s (not pure Python)"
            ) from e
        if r.returncode:
            raise NoArmWheel(
                f"{req} (required by {who}): no {arch} wheel for CPython {python}, and its sdist "
                f"does not build:\n{r.stderr[-2000:]}"
            )
        (wheel,) = Path(tmp).glob("*.whl")
        if not wheel.name.endswith("-none-any.whl"):
            raise NoArmWheel(
                f"{req} (required by {who}): no {arch} wheel for CPython {python}, and it is not "
                f"pure Python (its sdist builds {wheel.name})"
            )
        local.mkdir(parents=True, exist_ok=True)
        target = local / wheel.name
        target.write_bytes(wheel.read_bytes())
        print(f"  {req}: sdist only, pure Python -> built {wheel.name}", file=sys.stderr)
        return target


def resolve(
    python: str,
    wheels: Path,
    speakd: Path,
    constraints: list[str],
    extras: tuple[str, ...] = (),
    arch: str = "aarch64",
) -> list[dict]:
    """pip's install report (``install`` items) for speakd, its ``extras`` and their deps on
    ``arch`` ``python``."""
    local = wheels / "local"
    local.mkdir(parents=True, exist_ok=True)
    built: set[str] = set()
    for _ in range(MAX_SDIST_BUILDS + 1):
        with tempfile.TemporaryDirectory() as tmp:
            report = Path(tmp) / "report.json"
            r = pip(
                "install",
                "--dry-run",
                "--ignore-installed",
                "--target",
                f"{tmp}/t",
                "--report",
                str(report),
                "--find-links",
                str(local),
                *platform_args(python, arch),
                *constraints,
                f"{speakd}[{','.join(extras)}]" if extras else str(speakd),
            )
            if r.returncode == 0:
                return json.loads(report.read_text())["install"]
        said = r.stdout + r.stderr
        lacking = [
            (req, who) for req, who in candidates(said) if not has_wheel(req, python, local, arch)
        ]
        if not lacking or lacking[0][0] in built:
            raise NoArmWheel(f"pip cannot resolve speakd for {arch} {python}:\n{said[-3000:]}")
        build_pure(*lacking[0], python, local, constraints, arch)
        built.add(lacking[0][0])
    raise SystemExit(f"more than {MAX_SDIST_BUILDS} sdist-only dependencies; giving up")


def describe(items: list[dict]) -> list[str]:
    out = []
    for it in items:
        url = it.get("download_info", {}).get("url", "")
        meta = it["metadata"]
        out.append(f"{meta['name']}=={meta['version']}  {url.rsplit('/', 1)[-1]}")
    return sorted(out, key=str.lower)


def cmd_check(args: argparse.Namespace) -> int:
    """Resolution only (PyPI's metadata, no wheel downloaded): every Python must resolve."""
    failed = []
    with tempfile.TemporaryDirectory() as tmp:
        speakd = build_speakd(Path(tmp))
        wheels = Path(args.wheels or tmp)
        for python in args.python:
            try:
                items = resolve(python, wheels, speakd, [], tuple(args.extra), args.arch)
            except NoArmWheel as e:
                print(f"CPython {python} {args.arch}: FAIL: {e}")
                failed.append(python)
                continue
            print(f"CPython {python} {args.arch}: {len(items)} wheels")
            for line in describe(items):
                print(f"  {line}")
    return 1 if failed else 0


def cmd_resolve(args: argparse.Namespace) -> int:
    """Resolve for one Python, download the wheels into --wheels, write name==version pins."""
    (python,) = args.python
    wheels = Path(args.wheels)
    wheels.mkdir(parents=True, exist_ok=True)
    constraints = ["-c", args.constraints] if args.constraints else []
    with tempfile.TemporaryDirectory() as tmp:
        speakd = build_speakd(Path(tmp))
        try:
            items = resolve(python, wheels, speakd, constraints, arch=args.arch)
        except NoArmWheel as e:
            print(f"CPython {python} {args.arch}: FAIL: {e}", file=sys.stderr)
            return 1
    pins, need = [], []
    for it in items:
        name, version = it["metadata"]["name"], it["metadata"]["version"]
        if name.lower() == "speakd":
            continue
        pins.append(f"{name}=={version}")
        url = it.get("download_info", {}).get("url", "")
        fname = url.rsplit("/", 1)[-1]
        if not (wheels / fname).exists() and not (wheels / "local" / fname).exists():
            need.append(f"{name}=={version}")
    if need:
        print(f"downloading {len(need)} {args.arch} wheels into {wheels}", file=sys.stderr)
        platform = platform_args(python, args.arch)
        r = pip("download", "-q", "--no-deps", "-d", str(wheels), *platform, *need)
        if r.returncode:
            print(r.stderr, file=sys.stderr)
            return 1
    Path(args.pins).write_text("\n".join(sorted(pins, key=str.lower)) + "\n")
    for line in describe(items):
        print(f"  {line}", file=sys.stderr)
    return 0


def cmd_install(args: argparse.Namespace) -> int:
    """Install the pinned wheels (--no-deps) into --target from --wheels only."""
    (python,) = args.python
    wheels = Path(args.wheels)
    r = pip(
        "install",
        "-q",
        "--no-index",
        "--no-deps",
        "--upgrade",
        "--find-links",
        str(wheels),
        "--find-links",
        str(wheels / "local"),
        "--target",
        args.target,
        *platform_args(python, args.arch),
        "-r",
        args.pins,
    )
    if r.returncode:
        print(r.stderr, file=sys.stderr)
    return r.returncode


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("command", choices=["check", "resolve", "install"])
    p.add_argument("--python", action="append", required=True, help="e.g. 3.11 (repeatable)")
    p.add_argument("--wheels", help="wheel cache (local/ holds the wheels built from sdists)")
    p.add_argument("--extra", action="append", default=[], help="check: with this extra too")
    p.add_argument("--arch", default="aarch64", choices=["aarch64", "x86_64"], help="wheel tags")
    p.add_argument("--constraints", help="pip constraints (the host venv's versions)")
    p.add_argument("--pins", help="resolve: write name==version lines; install: read them")
    p.add_argument("--target", help="install: the site-packages folder")
    args = p.parse_args(argv)
    return {"check": cmd_check, "resolve": cmd_resolve, "install": cmd_install}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
