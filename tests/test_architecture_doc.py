"""docs/architecture.md stays one printed page; its picture draws every part of exporter/
and exactly the imports between them; its module table names every module, and only
modules: a module added without a row, an import added without an arrow, or an arrow
the code does not have fails here."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.tools import REPO

DOC = REPO / "docs" / "architecture.md"
PACKAGE = REPO / "exporter"
MAX_LINES, MAX_CHARS = 250, 7000

# Import edges the picture may leave out, each with its reason: (importer, imported) ->
# why. None today: every edge is drawn.
OMITTED: dict[tuple[str, str], str] = {}


def import_graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    """The package-level import graph: each top-level part of the package (`gpu/` for a
    package, `app` for a module, `__init__` for the package's own) -> the parts it
    imports, from the code: an import at any depth (inside a function, under
    TYPE_CHECKING) and a module loaded by its dotted name in a string (cli.py's
    commands)."""
    root = package.name

    def dotted(path: Path) -> str:
        return ".".join(path.relative_to(package.parent).with_suffix("").parts)

    modules = {dotted(p).removesuffix(".__init__") for p in package.rglob("*.py")}

    def part(name: str) -> str:
        head = name.split(".")[1]
        return f"{head}/" if (package / head).is_dir() else head

    graph: dict[str, set[str]] = {}
    for path in sorted(package.rglob("*.py")):
        source = part(dotted(path))
        imported = graph.setdefault(source, set())
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                # `from exporter import lazy` imports a module; `import __version__` a name
                names = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules
                         else node.module for a in node.names]
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                names = [node.value] if node.value in modules else []
            else:
                continue
            imported.update(part(name) for name in names if name.startswith(f"{root}."))
        imported.discard(source)
    return graph


def parts(package: Path = PACKAGE) -> set[str]:
    """Every top-level part: its modules, its packages and its folders of data."""
    return {f"{p.name}/" if p.is_dir() else p.stem for p in package.iterdir()
            if p.name != "__pycache__" and (p.is_dir() or p.suffix == ".py")}


def picture(text: str) -> str:
    """The doc's first fenced block."""
    return text.split("```\n", 2)[1]


def drawn(block: str) -> tuple[set[tuple[str, str]], list[str]]:
    """The arrows a picture draws, as (importer, imported), and its parts in the order
    they head a line. `a -> b c`: a imports b and c; `b <- a c`: a and c import b; a
    line that starts with a space goes on with the line above; `#` starts a comment."""
    edges: set[tuple[str, str]] = set()
    order: list[str] = []
    head = arrow = ""
    for line in block.splitlines():
        line = line.split("#", 1)[0].rstrip()
        if not line:
            continue
        words = line.split()
        if not line[0].isspace():
            head, words = words[0], words[1:]
            order.append(head)
            arrow = words.pop(0) if words else ""
            assert arrow in ("", "->", "<-"), f"not an arrow: {line!r}"
        for word in words:
            edges.add((head, word) if arrow == "->" else (word, head))
    return edges, order


def actual_edges() -> set[tuple[str, str]]:
    return {(a, b) for a, bs in import_graph().items() for b in bs}


def test_the_architecture_is_one_page():
    text = DOC.read_text()
    assert len(text) <= MAX_CHARS, f"{len(text)} characters"
    assert len(text.splitlines()) <= MAX_LINES


def test_every_part_is_in_the_picture():
    named = set(re.findall(r"[\w.]+/?", picture(DOC.read_text())))
    assert parts() - named == set()


def test_every_arrow_drawn_is_an_import():
    edges, _ = drawn(picture(DOC.read_text()))
    assert edges - actual_edges() == set()


def test_every_import_is_drawn():
    edges, _ = drawn(picture(DOC.read_text()))
    assert actual_edges() - edges - set(OMITTED) == set()
    assert set(OMITTED) <= actual_edges(), "an omitted edge the code no longer has"


def test_a_part_stands_above_all_it_imports():
    edges, order = drawn(picture(DOC.read_text()))
    assert len(order) == len(set(order)), "a part heads two lines"
    below = [f"{a} -> {b}" for a, b in sorted(edges)
             if a in order and b in order and order.index(a) > order.index(b)]
    assert below == []


def test_the_import_graph_sees_every_kind_of_import(tmp_path):
    package = tmp_path / "exporter"
    for name in ("a", "b", "c", "d", "e", "f"):
        (package / name).mkdir(parents=True)
        (package / name / "__init__.py").write_text("")
    (package / "__init__.py").write_text("__version__ = '1'\n")
    (package / "g.py").write_text("")
    (package / "a" / "m.py").write_text(
        "import exporter.b\n"
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from exporter.c import x\n"
        "def f():\n    from exporter import d, __version__\n"
        "LOADED = 'exporter.e'\nWORD = 'exporter.nothing'\n"
        "from exporter.a import m\n")
    (package / "g.py").write_text("from exporter.f import y\n")
    graph = import_graph(package)
    assert graph["a/"] == {"b/", "c/", "d/", "e/"}
    assert graph["g"] == {"f/"}
    assert graph["__init__"] == set()


def test_the_picture_reader_reads_both_arrows_and_continued_lines():
    block = ("app  -> web/ metrics/   # a comment: gpu/ -> nothing\n"
             "          sampling/\n"
             "# the ground\n"
             "yamlfile <- app web/\n"
             "gpu/\n")
    edges, order = drawn(block)
    assert edges == {("app", "web/"), ("app", "metrics/"), ("app", "sampling/"),
                     ("app", "yamlfile"), ("web/", "yamlfile")}
    assert order == ["app", "yamlfile", "gpu/"]


# -- the module table ----------------------------------------------------------------------

def rows() -> dict[str, tuple[str, list[str]]]:
    """The module table: each row's part (`gpu/`, or `wiring` for top-level modules) ->
    (the row's text, the names in its Modules cell)."""
    text = DOC.read_text()
    out = {}
    for line in text[text.index("## Modules"):].splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if line.startswith("| ") and len(cells) == 3 and "`" in cells[2]:
            out[cells[0].strip("`")] = (line, re.findall(r"`([^`]+)`", cells[2]))
    return out


def table_names(module: Path) -> tuple[str, set[str]]:
    """The row a module belongs in and the names that may stand for it there: its stem,
    or its path within its part (`compat/dcgm`)."""
    rel = module.relative_to(PACKAGE).with_suffix("")
    if len(rel.parts) == 1:
        return "", {rel.stem}
    return f"{rel.parts[0]}/", {rel.stem, "/".join(rel.parts[1:])}


def test_every_module_is_in_the_table():
    table = rows()
    top_level = {name for part, (_, names) in table.items() if not part.endswith("/")
                 for name in names}
    missing = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "__init__.py":
            continue
        part, names = table_names(path)
        listed = set(table[part][1]) if part in table else top_level
        if not names & listed:
            missing.append(str(path.relative_to(REPO)))
    assert not missing, f"not in docs/architecture.md's module table: {missing}"


def test_every_name_in_the_table_is_a_module():
    table = rows()
    assert table, "no module table"
    wrong = []
    for part, (_, names) in table.items():
        base = PACKAGE / part if part.endswith("/") else PACKAGE
        for name in names:
            found = (base / name).is_dir() if name.endswith("/") else (
                (base / f"{name}.py").is_file()
                or part.endswith("/") and any(base.rglob(f"{name}.py")))
            if not found:
                wrong.append(f"{part}: {name}")
    assert wrong == []


def test_every_part_has_a_row():
    packages = {p for p in parts() if p.endswith("/") and any((PACKAGE / p).glob("*.py"))}
    assert packages - set(rows()) == set()


# The fake driver stands in for NVML's C API, one method per symbol it answers: it is as
# wide as the API it fakes.
FAKE_DRIVER = ("exporter/sim/fake.py", "exporter/sim/fake_device.py",
               "exporter/sim/fake_model.py")
MAX_METHODS = 25


def test_no_class_outside_the_fake_driver_has_more_than_25_methods():
    wide = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = str(path.relative_to(REPO))
        if module in FAKE_DRIVER:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                methods = sum(isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef)
                              for item in node.body)
                if methods > MAX_METHODS:
                    wide.append(f"{module}: {node.name} ({methods})")
    assert not wide, f"split by job: {wide}"
