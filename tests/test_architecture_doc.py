"""docs/architecture.md stays one page, and its module table names every module: a module
added without a word on what it is for fails here."""

from __future__ import annotations

import ast
import re

from tests.tools import REPO

DOC = REPO / "docs" / "architecture.md"
PACKAGE = REPO / "exporter"
MAX_LINES = 250


def rows() -> dict[str, str]:
    """The module table: its first cell's paths -> the row's text."""
    text = DOC.read_text()
    table = text[text.index("## Modules"):]
    out = {}
    for line in table.splitlines():
        cells = line.split(" | ")
        if line.startswith("| `exporter/"):
            out[cells[0]] = line
    return out


def row_for(module: str, table: dict[str, str]) -> str | None:
    """The row of a module's top package (`exporter/gpu/`), or the row that names a
    top-level module (`exporter/app.py`, or `app.py` beside it)."""
    parts = module.split("/")
    if len(parts) > 2:
        package = f"`exporter/{parts[1]}/`"
        return next((row for head, row in table.items() if package in head), None)
    name = parts[1]
    return next((row for head, row in table.items()
                 if f"`exporter/{name}`" in head or re.search(rf"`{re.escape(name)}`", head)),
                None)


def test_the_architecture_is_one_page():
    assert len(DOC.read_text().splitlines()) <= MAX_LINES


def test_every_module_is_in_the_table():
    table = rows()
    missing = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = str(path.relative_to(REPO))
        if path.name == "__init__.py" or "/static/" in module:
            continue
        row = row_for(module, table)
        if row is None or f"`{path.name}`" not in row and f"`{module}`" not in row:
            missing.append(module)
    assert not missing, f"not in docs/architecture.md's module table: {missing}"


def test_every_package_the_table_names_exists():
    for head in rows():
        for path in re.findall(r"`(exporter/[^`]+)`", head):
            assert (REPO / path).exists(), path


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
