"""The shape the code keeps: small modules and functions, one way for data to
flow (no import cycles; rendering never touches NVML), and generated docs kept current."""

from __future__ import annotations

import ast
import subprocess
import sys

from tests.tools import REPO

PACKAGE = REPO / "exporter"
MAX_MODULE_LINES, MAX_FUNCTION_LINES = 600, 80


def _modules():
    for path in sorted(PACKAGE.rglob("*.py")):
        yield path, ast.parse(path.read_text(), str(path))


def test_no_module_over_600_lines():
    long = {str(p.relative_to(REPO)): n for p in PACKAGE.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES}
    assert long == {}


def test_no_function_over_80_lines():
    long = []
    for path, tree in _modules():
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name} {lines}")
    assert long == []


def _imports(path, tree) -> set[str]:
    """exporter modules this module imports at load time (not under TYPE_CHECKING)."""
    module = ".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")
    out = set()
    for node in tree.body:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            continue
        for sub in ast.walk(node):
            if isinstance(sub, ast.Import):
                out |= {a.name for a in sub.names if a.name.startswith("exporter")}
            elif isinstance(sub, ast.ImportFrom) and sub.level == 0 and sub.module and (
                    sub.module.startswith("exporter")) and sub.col_offset == 0:
                out.add(sub.module)
    out.discard(module)
    return out


def test_no_import_cycles():
    graph = {}
    for path, tree in _modules():
        name = ".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")
        graph[name] = _imports(path, tree)
    state: dict[str, int] = {}
    cycles = []

    def visit(node: str, trail: list[str]) -> None:
        state[node] = 1
        for dep in sorted(graph.get(node, ())):
            if dep not in graph:
                continue
            if state.get(dep) == 1:
                cycles.append(" -> ".join([*trail[trail.index(dep):], dep]))
            elif dep not in state:
                visit(dep, [*trail, dep])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    assert cycles == []


def test_rendering_and_the_snapshot_never_load_nvml():
    code = ("import sys, exporter.metrics.render, exporter.sampling.snapshot; "
            "print('pynvml' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            cwd=REPO, timeout=60)
    assert result.stdout.strip() == "False", result.stderr


def test_generated_configuration_docs_are_current():
    result = subprocess.run([sys.executable, str(REPO / "scripts" / "build_config_docs.py"),
                             "--check"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
