"""The docs cover the code: every config key, JSON op, CLI command and HTTP endpoint is written
down, and every relative link in README.md and docs/*.md leads somewhere.

In the manner of sqlite-utils' ``tests/test_docs.py``: the lists come from the code itself (the
config dataclasses, ``jsonlines.OPS``, the argparse parsers, the HTTP app's routes), so a new key,
op, command or endpoint fails here until a page says what it is. Each failure names the item and
the page it belongs in.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from speakd.config import Config

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
README = ROOT / "README.md"

FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)


def _pages() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md"))]


def _read(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def _all_docs() -> str:
    return "\n".join(_read(p) for p in _pages())


def _section(text: str, heading: str) -> str:
    """The text under a ``## heading`` up to the next heading of the same level."""
    match = re.search(rf"^## {re.escape(heading)}\n(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert match, f"heading '## {heading}' is missing"
    return match.group(1)


# ---- configuration ---------------------------------------------------------------------------


def _config_sections() -> Iterator[tuple[str, type]]:
    """Every ``[section]``: the fields of Config whose default is a section dataclass."""
    for f in dataclasses.fields(Config):
        factory = f.default_factory
        if isinstance(factory, type) and dataclasses.is_dataclass(factory):
            yield f.name, factory


def _config_keys() -> list[tuple[str, str]]:
    return [
        (section, f.name) for section, cls in _config_sections() for f in dataclasses.fields(cls)
    ]


def _documented_config() -> tuple[set[tuple[str, str]], dict[str, dict]]:
    """(section, key) pairs written as ``key =`` under ``[section]`` in a TOML block of
    docs/configuration.md, and each section's values as TOML reads them."""
    text = _read(DOCS / "configuration.md")
    keys: set[tuple[str, str]] = set()
    values: dict[str, dict] = {}
    for lang, block in FENCE.findall(text):
        if lang != "toml":
            continue
        section = None
        for line in block.splitlines():
            if m := re.match(r"\s*\[(\w+)\]\s*(#.*)?$", line):
                section = m.group(1)
            elif (m := re.match(r"\s*(\w+)\s*=", line)) and section:
                keys.add((section, m.group(1)))
        for name, table in tomllib.loads(block).items():
            if isinstance(table, dict):
                values.setdefault(name, {}).update(table)
    return keys, values


def test_the_config_sections_are_found() -> None:
    sections = [name for name, _ in _config_sections()]
    assert {"engine", "audio", "socket", "limits", "cache", "mqtt"} <= set(sections)


@pytest.mark.parametrize(("section", "key"), _config_keys(), ids=lambda v: v)
def test_every_config_key_is_documented(section: str, key: str) -> None:
    in_blocks, _ = _documented_config()
    text = _read(DOCS / "configuration.md")
    if (section, key) not in in_blocks and f"`{section}.{key}`" not in text:
        pytest.fail(
            f"config key {section}.{key} is not documented: add `{key} = <default>  # what it "
            f"does` to the [{section}] TOML block of docs/configuration.md",
            pytrace=False,
        )


def test_documented_defaults_are_the_real_ones() -> None:
    """The TOML blocks show the defaults; a changed default must change the page too. Defaults
    made at run time (socket and cache paths) are left out, except empty lists."""
    _, values = _documented_config()
    wrong = []
    for section, cls in _config_sections():
        for f in dataclasses.fields(cls):
            if f.default is not dataclasses.MISSING:
                default = f.default
            elif f.default_factory is list:
                default = []
            else:
                continue
            documented = values.get(section, {}).get(f.name, default)
            if documented != default or type(documented) is not type(default):
                wrong.append(f"{section}.{f.name} = {documented!r} (the code says {default!r})")
    if wrong:
        pytest.fail("docs/configuration.md shows wrong defaults:\n" + "\n".join(wrong), False)


# ---- the JSON socket ---------------------------------------------------------------------------


def _ops() -> tuple[str, ...]:
    from speakd.frontends.jsonlines import OPS

    return OPS


@pytest.mark.parametrize("op", _ops())
def test_every_json_op_is_documented(op: str) -> None:
    section = _section(_read(DOCS / "protocols.md"), "The JSON socket")
    if f"`{op}`" not in section:
        pytest.fail(
            f"JSON socket op {op!r} (speakd.frontends.jsonlines.OPS) is not documented: add it "
            "to the ops table of docs/protocols.md, section 'The JSON socket'",
            pytrace=False,
        )


# ---- the command lines -------------------------------------------------------------------------

# Where a command's description belongs, by its longest matching prefix (for the message only:
# the test accepts a command anywhere in README.md or docs/*.md).
COMMAND_PAGES = {
    "speakd": "docs/protocols.md (the command table)",
    "speakd cache": "docs/cache.md",
    "speakd-tools": "docs/models.md",
    "speakd-tools precompute": "docs/cache.md",
    "speakd-tools calibrate": "docs/calibration.md",
    "speakd-tools bench": "docs/benchmarks.md",
}


def _walk(parser: argparse.ArgumentParser, path: tuple[str, ...]) -> Iterator[tuple[str, ...]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield (*path, name)
                yield from _walk(sub, (*path, name))


def _commands() -> list[str]:
    from speakd.cli import build_parser as speakd_parser
    from speakd_tools.cli import build_parser as tools_parser

    return [
        " ".join(path)
        for prog, parser in (("speakd", speakd_parser()), ("speakd-tools", tools_parser()))
        for path in _walk(parser, (prog,))
    ]


def test_the_command_walk_finds_nested_commands() -> None:
    commands = _commands()
    for expected in ("speakd say", "speakd cache prune", "speakd-tools bench chattts"):
        assert expected in commands


@pytest.mark.parametrize("command", _commands())
def test_every_cli_command_is_documented(command: str) -> None:
    # "speakd cache" must not be satisfied by "speakd cache-foo" or "speakd-tools cache"
    pattern = re.compile(rf"(?<![\w-]){re.escape(command)}(?![\w-])")
    page = COMMAND_PAGES[max((p for p in COMMAND_PAGES if command.startswith(p)), key=len)]
    if not pattern.search(_all_docs()):
        pytest.fail(
            f"command `{command}` is in the CLI but in no page of README.md or docs/*.md: "
            f"document it in {page}",
            pytrace=False,
        )


# ---- HTTP ----------------------------------------------------------------------------------------


def _http_modules() -> list[Path]:
    return sorted((ROOT / "daemon" / "frontends" / "http").glob("*.py"))


def _http_routes() -> list[str]:
    """Every path the HTTP front-end serves: its aiohttp app built as the daemon builds it
    (``HttpFrontend.app()``; the app only keeps the Control, so none is needed), then
    ``app.router.routes()`` walked."""
    from speakd.config import HttpConfig
    from speakd.frontends.http.frontend import HttpFrontend

    app = HttpFrontend(None, HttpConfig(listen="127.0.0.1:5500")).app()  # type: ignore[arg-type]
    return sorted({route.resource.canonical for route in app.router.routes() if route.resource})


@pytest.mark.skipif(not _http_modules(), reason="no HTTP front-end (daemon/frontends/http/)")
def test_the_http_route_walk_finds_the_routes() -> None:
    routes = _http_routes()
    assert "/healthz" in routes and "/v1/audio/speech" in routes, routes


@pytest.mark.skipif(not _http_modules(), reason="no HTTP front-end (daemon/frontends/http/)")
@pytest.mark.parametrize("route", _http_routes() if _http_modules() else [])
def test_every_http_endpoint_is_documented(route: str) -> None:
    http_md = DOCS / "http.md"
    if not http_md.is_file():
        pytest.fail("daemon/frontends/http/ exists but docs/http.md does not", False)
    # "/v1/models" is not documented by "/v1/models/{model}" alone
    if not re.search(rf"(?<![\w/]){re.escape(route)}(?![\w/{{.-])", _read(http_md)):
        pytest.fail(
            f"HTTP endpoint {route} (daemon/frontends/http/) is not documented: add it to "
            "the endpoints table of docs/http.md",
            pytrace=False,
        )


# ---- SSML ----------------------------------------------------------------------------------------


def _table(section: str) -> list[list[str]]:
    """The cells of each body row of the Markdown tables in ``section``."""
    rows = [ln.strip().strip("|").split("|") for ln in section.splitlines() if ln.startswith("|")]
    return [[c.strip() for c in row] for row in rows if not re.fullmatch(r"[\s:-]*", row[0])]


def test_ssml_md_lists_exactly_the_parsers_elements_and_attributes() -> None:
    from speakd.markup.ssml import ELEMENTS

    documented = {
        m.group(1): set(re.findall(r"`([\w:-]+)`", row[1]))
        for row in _table(_section(_read(DOCS / "ssml.md"), "Elements"))
        if (m := re.fullmatch(r"`<([\w-]+)>`", row[0]))
    }
    parser = {name: set(attributes) for name, attributes in ELEMENTS.items()}
    if documented != parser:
        pytest.fail(
            "the elements table of docs/ssml.md (section 'Elements') differs from "
            f"speakd.markup.ssml.ELEMENTS:\n  page:   {documented}\n  parser: {parser}",
            pytrace=False,
        )


def test_ssml_md_lists_exactly_the_say_as_kinds() -> None:
    from speakd.markup.ssml import SAY_AS

    rows = _table(_section(_read(DOCS / "ssml.md"), "say-as"))
    documented = {m.group(1) for row in rows if (m := re.fullmatch(r"`([\w-]+)`", row[0]))}
    assert documented == set(SAY_AS), "docs/ssml.md, section 'say-as', vs ssml.SAY_AS"


# ---- links and the README ----------------------------------------------------------------------

LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    text = FENCE.sub("", _read(path))
    seen: dict[str, int] = {}
    out = set()
    for heading in re.findall(r"^#{1,6} (.+)$", text, re.M):
        slug = _slug(heading)
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def _links() -> list[tuple[Path, str]]:
    """(page, target) for every relative link, each once per page."""
    return [
        (page, target)
        for page in _pages()
        for target in sorted(set(LINK.findall(FENCE.sub("", _read(page)))))
        if not re.match(r"[a-z][a-z+.-]*:", target)  # http:, https:, mailto:
    ]


@pytest.mark.parametrize(
    ("page", "target"), _links(), ids=lambda v: v.name if isinstance(v, Path) else v
)
def test_every_relative_link_resolves(page: Path, target: str) -> None:
    where = page.relative_to(ROOT)
    file, _, anchor = target.partition("#")
    dest = (page.parent / file).resolve() if file else page
    if not dest.exists():
        pytest.fail(f"{where} links to {target}, but {file} does not exist", False)
    if anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
        pytest.fail(
            f"{where} links to {target}, but {dest.relative_to(ROOT)} has no heading "
            f"with the anchor #{anchor}",
            pytrace=False,
        )


def test_every_page_in_docs_is_two_clicks_from_the_readme() -> None:
    """A newcomer finds every page from the README: linked from it, or from a page it links."""
    reached, frontier = {README.resolve()}, {README.resolve()}
    for _ in range(2):
        frontier = {
            (page.parent / target.partition("#")[0]).resolve()
            for page in frontier
            for target in LINK.findall(FENCE.sub("", _read(page)))
            if target.partition("#")[0].endswith(".md") and "://" not in target
        } - reached
        frontier = {p for p in frontier if p.is_file()}
        reached |= frontier
    unreached = [p.name for p in sorted(DOCS.glob("*.md")) if p.resolve() not in reached]
    if unreached:
        pytest.fail(
            f"not reachable in two clicks from README.md: {', '.join(unreached)}; "
            "link them from the README's list of pages",
            pytrace=False,
        )


# ---- the README's figures -----------------------------------------------------------------------

# A measured figure: a number (or a range) with its unit, or "RTF" and a number. Longer units first,
# and a unit must end there ("16 s" is a figure, "16 steps" is not).
FIGURE = re.compile(
    r"RTF \d+(?:\.\d+)?"
    r"|(?<![\w.])\d+(?:[.,]\d+)?(?:[–-]\d+(?:\.\d+)?)? ?(?:ms|MB|GB/s|GB|dB|s|×|%)(?![\w/])"
)


def _figures(text: str) -> list[str]:
    return FIGURE.findall(re.sub(r"\s+", " ", text))


def test_the_figure_pattern_finds_measurements_only() -> None:
    text = "2-core x86-64, 30.1 GB/s: 6.31 ms, RTF 0.375\n(11.3×), 16 steps, 1.17 s, 0.1–0.5 s"
    assert _figures(text) == ["30.1 GB/s", "6.31 ms", "RTF 0.375", "11.3×", "1.17 s", "0.1–0.5 s"]


def test_the_readme_quotes_figures_that_are_in_benchmarks_md() -> None:
    """The README's performance sentences quote docs/benchmarks.md's current tables; a figure
    found nowhere there is an old run's or a made-up one."""
    figures = _figures(_section(_read(README), "Performance"))
    assert len(figures) >= 5, f"the README's Performance section quotes too few figures: {figures}"
    bench = re.sub(r"\s+", " ", _read(DOCS / "benchmarks.md"))
    missing = [f for f in figures if not re.search(rf"(?<![\d.]){re.escape(f)}(?![\d])", bench)]
    if missing:
        pytest.fail(
            f"README.md, Performance, quotes {', '.join(missing)}, which docs/benchmarks.md does "
            "not contain: quote its current tables, or write the figure there with its run",
            pytrace=False,
        )


def test_benchmarks_md_holds_current_tables_only() -> None:
    """One current table per benchmark; older runs go to benchmarks-archive.md, so the page a
    newcomer reads stays short enough to read."""
    lines = len(_read(DOCS / "benchmarks.md").splitlines())
    assert lines < 400, (
        f"docs/benchmarks.md has {lines} lines: move older runs to docs/benchmarks-archive.md"
    )


def test_the_readme_is_short_and_keeps_the_two_commands() -> None:
    readme = _read(README)
    lines = readme.count("\n")
    assert lines <= 200, f"README.md has {lines} lines; move the detail into a page of docs/"
    quick_start = _section(readme, "Quick start")
    for target in ("run", "test"):
        assert re.search(rf"^make {target}\b", quick_start, re.M), f"`make {target}` left README"
        assert re.search(rf"^{target}:", _read(ROOT / "Makefile"), re.M), f"no `{target}` target"
    assert re.search(r"^make test$", _read(ROOT / ".ci" / "run"), re.M), ".ci/run must run it"
