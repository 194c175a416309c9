"""No import cycles among speakd and speakd_tools modules.

Every module of both packages (found through pyproject.toml's ``package-dir``) is parsed with
``ast``; an ``import`` or ``from … import`` naming another of their modules is an edge, and a
strongly connected component of more than one module is a cycle.

Imports inside functions count. A function-local import only postpones a cycle to the first call:
the two modules still need each other, so neither can be read, tested or moved on its own
(``calibrate.pipeline`` once imported ``calibrate.chattts`` inside a function while ``chattts``
imported ``pipeline`` at the top). Imports under ``if TYPE_CHECKING:`` do not count: they never run.
"""

from __future__ import annotations

import ast
import tomllib
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def modules() -> dict[str, Path]:
    """Import name → file, for every module of the packages pyproject.toml maps."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    out = {}
    for import_name, folder in config["package-dir"].items():
        for path in (ROOT / folder).rglob("*.py"):
            parts = [import_name, *path.relative_to(ROOT / folder).with_suffix("").parts]
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _runtime_nodes(tree: ast.AST) -> Iterator[ast.AST]:
    """Every node, except the bodies of ``if TYPE_CHECKING:`` blocks."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            yield from (n for child in node.orelse for n in [child, *_runtime_nodes(child)])
            continue
        yield node
        yield from _runtime_nodes(node)


def _known(name: str, known: dict[str, Path]) -> str | None:
    """``name`` or its nearest enclosing package that is one of ours (``a.b.c`` → ``a.b``)."""
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The modules of ours that module ``name`` (file ``path``) imports."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in _runtime_nodes(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parent, *([node.module] if node.module else [])])
            # ``from pkg import mod`` imports the module pkg.mod; ``from mod import f``, mod
            targets = [
                f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names
            ]
        else:
            continue
        out |= {t for t in map(lambda x: _known(x, known), targets) if t and t != name}
    return out


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def test_no_import_cycles() -> None:
    known = modules()
    graph = {name: imports(name, path, known) for name, path in known.items()}
    assert cycles(graph) == []


def test_the_check_sees_lazy_and_relative_imports_and_skips_type_checking(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from .b import f\n")
    (pkg / "b.py").write_text("def f():\n    from pkg import a\n")
    (pkg / "c.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import pkg.a\n"
    )
    known = {f"pkg.{m}": pkg / f"{m}.py" for m in ("a", "b", "c")} | {"pkg": pkg / "__init__.py"}
    graph = {name: imports(name, path, known) for name, path in known.items()}
    assert graph["pkg.a"] == {"pkg.b"} and graph["pkg.b"] == {"pkg.a"} and graph["pkg.c"] == set()
    assert cycles(graph) == [["pkg.a", "pkg.b"]]


def reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    """Every module ``start`` imports, directly or through others."""
    seen: set[str] = set()
    todo = [start]
    while todo:
        for nxt in graph[todo.pop()] - seen:
            seen.add(nxt)
            todo.append(nxt)
    return seen


def test_the_mqtt_package_knows_nothing_of_front_ends_or_the_queue() -> None:
    """speakd.mqtt (topics, messages, client, packs) is shared by the front-end, the remote
    speaker sink, doctor and the fleet tools: it must not pull in what only the daemon's request
    path needs."""
    known = modules()
    graph = {name: imports(name, path, known) for name, path in known.items()}
    forbidden = (
        "speakd.frontends",
        "speakd.request.scheduler",
        "speakd.request.playback",
        "speakd.control",
        "speakd.audio.sinks",
    )
    package = [name for name in known if name == "speakd.mqtt" or name.startswith("speakd.mqtt.")]
    assert len(package) > 1
    for name in package:
        bad = sorted(m for m in reachable(graph, name) if m.startswith(forbidden))
        assert bad == [], f"{name} imports {bad}"


# The rooms a front-end must not enter: it speaks only to Control (docs/architecture.md).
BEHIND_CONTROL = (
    "speakd.request.scheduler",
    "speakd.request.playback",
    "speakd.request.resolver",
    "speakd.engines",
    "speakd.cache",
    "speakd.request.voices",
)
BEHIND_CONTROL_ATTRIBUTES = {"scheduler", "resolver", "engine", "library", "store"}


def boundary_breaches(name: str, path: Path, known: dict[str, Path]) -> list[str]:
    """What a front-end module imports from behind Control, and which of Control's insides it
    reaches for (``control.scheduler``, ``control.library``…)."""
    found = sorted(imports(name, path, known))
    bad = [f"imports {m}" for m in found if m.startswith(BEHIND_CONTROL)]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Attribute) and node.attr in BEHIND_CONTROL_ATTRIBUTES:
            owner = ast.unparse(node.value)
            if owner.split(".")[-1] == "control":
                bad.append(f"line {node.lineno}: {owner}.{node.attr}")
    return sorted(bad)


def test_front_ends_talk_only_to_control() -> None:
    known = modules()
    front_ends = [n for n in known if n.startswith("speakd.frontends.")]
    assert len(front_ends) > 5
    # the protocols' packages are walked too: each one's frontend.py is checked
    packaged = [f"speakd.frontends.{p}.frontend" for p in ("ssip", "http", "wyoming", "mqtt")]
    assert set(packaged) <= set(front_ends)
    breaches = {n: boundary_breaches(n, known[n], known) for n in front_ends}
    assert {n: b for n, b in breaches.items() if b} == {}


def test_the_boundary_check_sees_imports_and_reaching_through_control(tmp_path: Path) -> None:
    known = modules()
    module = tmp_path / "probe.py"
    module.write_text(
        "from speakd.request.resolver import Resolver\n"
        "def f(self):\n    return self.control.scheduler.listeners, self.control.library\n"
    )
    known = {**known, "speakd.frontends.ssip.probe": module}
    assert boundary_breaches("speakd.frontends.ssip.probe", module, known) == [
        "imports speakd.request.resolver",
        "line 3: self.control.library",
        "line 3: self.control.scheduler",
    ]
