"""The house rules of docs/architecture.md, checked against the code.

- the packages table ("The packages, in the order a request meets them") names every folder and
  top-level module of ``daemon/``, each once, and nothing that is not there;
- an import runs down that table, except the arrows the page lists after it (at most two);
- no module of ``speakd`` or ``speakd_tools`` is over 500 lines: a longer one holds two jobs;
- no folder of theirs holds more than 15 modules besides ``__init__.py``: a longer one is a list,
  not a room, and its modules want grouping by what they do.

No import cycles and front-ends only through ``Control`` are tests/test_import_cycles.py's.
"""

from __future__ import annotations

import re
from pathlib import Path

from tests.test_import_cycles import imports, modules

ROOT = Path(__file__).resolve().parent.parent
DAEMON = ROOT / "daemon"
PAGE = ROOT / "docs" / "architecture.md"
MAX_LINES = 500
MAX_MODULES_PER_FOLDER = 15
MAX_ARROWS_UP = 2


def _section(text: str, title: str) -> str:
    start = text.index(f"## {title}")
    end = text.find("\n## ", start + 1)
    return text[start : end if end >= 0 else None]


def floors(page: str) -> list[list[str]]:
    """The packages table's rows in order: each row's daemon/ entries (``request/``, ``cli.py``)."""
    section = _section(page, "The packages, in the order a request meets them")
    rows = [line.split("|") for line in section.splitlines() if re.match(r"\|\s*\d+\s*\|", line)]
    return [re.findall(r"`([\w.]+/?)`", row[2]) for row in rows]


def listed_arrows(page: str) -> set[tuple[str, str]]:
    """The arrows up the page explains: ``- `audio/` → `mqtt/`: why``."""
    section = _section(page, "The packages, in the order a request meets them")
    return set(re.findall(r"^- `([\w.]+/?)` → `([\w.]+/?)`:", section, re.M))


def entries() -> set[str]:
    """daemon/'s folders (``request/``) and top-level modules (``cli.py``)."""
    return {
        p.name + "/" if p.is_dir() else p.name
        for p in DAEMON.iterdir()
        if p.name != "__pycache__" and (p.is_dir() or p.suffix == ".py")
    }


def entry_of(module: str) -> str | None:
    """The daemon/ entry a speakd module lives in: speakd.request.stream → ``request/``."""
    parts = module.split(".")
    if parts[0] != "speakd":
        return None
    if len(parts) == 1:
        return "__init__.py"
    return f"{parts[1]}/" if (DAEMON / parts[1]).is_dir() else f"{parts[1]}.py"


def arrows_up(rows: list[list[str]], known: dict[str, Path]) -> dict[tuple[str, str], list[str]]:
    """Imports from an entry to one above it in the table: (from, to) → the module imports."""
    row = {entry: i for i, names in enumerate(rows) for entry in names}
    up: dict[tuple[str, str], list[str]] = {}
    for name, path in known.items():
        src = entry_of(name)
        if src is None:
            continue
        for target in imports(name, path, known):
            dst = entry_of(target)
            if dst is not None and src in row and dst in row and row[dst] < row[src]:
                up.setdefault((src, dst), []).append(f"{name} → {target}")
    return up


def test_the_packages_table_names_every_entry_of_daemon_once() -> None:
    listed = [name for row in floors(PAGE.read_text()) for name in row]
    assert len(listed) == len(set(listed)), "an entry is listed twice"
    assert set(listed) == entries()


def test_imports_run_down_the_table_but_for_the_arrows_it_explains() -> None:
    page = PAGE.read_text()
    up = arrows_up(floors(page), modules())
    assert len(up) <= MAX_ARROWS_UP, up
    assert set(up) == listed_arrows(page), up


def test_the_arrow_check_sees_an_import_back_up(tmp_path: Path) -> None:
    """An engine module that imports the scheduler is an arrow up the table, counted."""
    probe = tmp_path / "probe.py"
    probe.write_text("def f():\n    from speakd.request.scheduler import Scheduler\n")
    known = {**modules(), "speakd.engines.probe": probe}
    up = arrows_up(floors(PAGE.read_text()), known)
    assert up[("engines/", "request/")] == ["speakd.engines.probe → speakd.request.scheduler"]


def test_no_module_is_over_500_lines() -> None:
    long = {
        str(path.relative_to(ROOT)): n
        for path in modules().values()
        if (n := len(path.read_text().splitlines())) > MAX_LINES
    }
    assert long == {}


BENCH = ROOT / "tools" / "bench"


def listed_benches(page: str) -> list[str]:
    """The modules the page's bench table names, one per row: ``tools/bench/engine/vits.py``."""
    section = _section(page, "The host tools and their benches")
    return re.findall(r"^\| `(tools/bench/[\w/]+\.py)` \|", section, re.M)


def test_the_bench_table_names_every_module_of_tools_bench_once() -> None:
    """A bench, or a harness module, that docs/architecture.md does not list is one a reader
    cannot find; a row naming a module that is gone points nowhere."""
    listed = listed_benches(PAGE.read_text())
    assert len(listed) == len(set(listed)), "a module is listed twice"
    there = {
        str(p.relative_to(ROOT))
        for p in BENCH.rglob("*.py")
        if p.name != "__init__.py" and "__pycache__" not in p.parts
    }
    assert set(listed) == there, {"unlisted": there - set(listed), "gone": set(listed) - there}


def test_no_folder_holds_more_than_15_modules() -> None:
    folders: dict[str, int] = {}
    for path in modules().values():
        if path.name != "__init__.py":
            key = str(path.parent.relative_to(ROOT))
            folders[key] = folders.get(key, 0) + 1
    assert {f: n for f, n in folders.items() if n > MAX_MODULES_PER_FOLDER} == {}
