"""The shape the code keeps: small modules and functions, one way for data to flow (no
import cycles at any depth, no import from a higher layer; rendering never touches NVML),
and generated docs kept current."""

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


def _name(path) -> str:
    return ".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")


def _imports(path, tree, modules: set[str]) -> set[str]:
    """exporter modules this module imports, at any depth: at the top, inside a function
    (an import deferred to break a cycle is still a cycle) or under TYPE_CHECKING (a
    type-only import is still an arrow the reader has to follow). `from P import M`
    names module M where P.M is one."""

    def known(name: str) -> str:
        while name not in modules and "." in name:
            name = name.rpartition(".")[0]
        return name

    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {known(a.name) for a in node.names if a.name.startswith("exporter.")}
        elif isinstance(node, ast.ImportFrom) and node.module and (
                node.level == 0 and node.module.startswith("exporter")):
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                out.add(full if full in modules else known(node.module))
    out -= {_name(path), "exporter"}
    return out


def _graph() -> dict[str, set[str]]:
    trees = dict(_modules())
    modules = {_name(path) for path in trees}
    return {_name(path): _imports(path, tree, modules) for path, tree in trees.items()}


def test_no_import_cycles():
    graph = _graph()
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


def test_the_cycle_finder_sees_imports_inside_functions(tmp_path):
    a = tmp_path / "exporter" / "a.py"
    a.parent.mkdir()
    a.write_text("def f():\n    from exporter.b import g\n")
    tree = ast.parse(a.read_text())
    modules = {"exporter.a", "exporter.b"}
    rel = a.relative_to(tmp_path)
    assert _imports(REPO / rel, tree, modules) == {"exporter.b"}


# Layers, lowest first: a module imports only from its own layer or the ones below
# (docs/architecture.md draws them). Within a layer the cycle test keeps order.
LAYERS = (
    ("exporter.yamlfile", "exporter.sdnotify", "exporter.errors", "exporter.regularfile",
     "exporter.events", "exporter.families", "exporter.jsontext", "exporter.lazy"),
    ("exporter.options",),
    ("exporter.gpu",),
    ("exporter.analysis",),
    ("exporter.traces",),
    ("exporter.sampling",),
    ("exporter.collectors",),
    ("exporter.health",),  # per-GPU checks and verdicts, from what the sampler read
    ("exporter.history",),  # the state directory: episodes that survive restarts
    ("exporter.metrics",),
    ("exporter.web",),
    ("exporter.config",),
    ("exporter.sim",),
    ("exporter.offline",),  # what a recorded trace says: its band, gaps, swings, goodput
    ("exporter.commands",),  # one module or package per command; simulate is higher
    ("exporter.app",),
    ("exporter.service", "exporter.commands.simulate"),  # whole exporters, many at once
    ("exporter.cli", "exporter.entry", "exporter.__main__"),
)


def _layer(module: str) -> int:
    """The layer of the longest prefix that names the module (exporter.commands.simulate
    sits above exporter.commands)."""
    matches = [(len(p), rank) for rank, prefixes in enumerate(LAYERS) for p in prefixes
               if module == p or module.startswith(p + ".")]
    if not matches:
        raise AssertionError(f"{module} is in no layer: add it to LAYERS")
    return max(matches)[1]


def test_the_longest_prefix_names_the_layer():
    assert _layer("exporter.commands.simulate.runner") > _layer("exporter.app")
    assert _layer("exporter.commands.health.command") < _layer("exporter.app")
    assert _layer("exporter.commands") == _layer("exporter.commands.record")


def test_no_upward_imports():
    upward = [f"{module} -> {dep}" for module, deps in sorted(_graph().items())
              for dep in sorted(deps) if module != "exporter" and _layer(dep) > _layer(module)]
    assert upward == []


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


# The numpy layer knows no command line: the command names and the declaring of settings
# (flags, keys) are the settings layer's (each area's settings.py), which hands the
# analyses their thresholds as values.
COMMAND_NAMES = {"RUN", "SIMULATE", "RECORD", "ANALYZE", "HEALTH", "ALL", "setting",
                 "analyze_setting", "section"}


def _command_line_uses(path, tree) -> list[str]:
    """Where a module imports the commands' names or declares settings, or spells out a
    flag in a string."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "exporter.options":
            out += [f"{path.name}:{node.lineno} imports {a.name}" for a in node.names
                    if a.name in COMMAND_NAMES or a.name == "*"]
        elif isinstance(node, ast.Import):
            out += [f"{path.name}:{node.lineno} imports {a.name}" for a in node.names
                    if a.name == "exporter.options"]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and (
                node.value.startswith("--") and node.value[2:3].isalpha()):
            out.append(f"{path.name}:{node.lineno} spells out {node.value}")
    return out


def test_analysis_knows_no_command_names_or_flags():
    found = [use for path in sorted((PACKAGE / "analysis").rglob("*.py"))
             for use in _command_line_uses(path, ast.parse(path.read_text()))]
    assert found == []


def test_the_command_name_check_can_fail(tmp_path):
    planted = tmp_path / "live.py"
    planted.write_text("from exporter.options import ANALYZE, positive\n"
                       "import exporter.options\nFLAG = '--window'\n")
    found = _command_line_uses(planted, ast.parse(planted.read_text()))
    assert found == ["live.py:1 imports ANALYZE", "live.py:2 imports exporter.options",
                     "live.py:3 spells out --window"]


def _test_imports(tree) -> list[int]:
    """The lines where a module imports from tests/ (test helpers are not the tools')."""
    out = []
    for node in ast.walk(tree):
        names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                 [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level
                 else [])
        if any(n == "tests" or n.startswith("tests.") for n in names):
            out.append(node.lineno)
    return out


def test_scripts_import_nothing_from_tests():
    found = {str(p.relative_to(REPO)): lines for p in sorted((REPO / "scripts").rglob("*.py"))
             if (lines := _test_imports(ast.parse(p.read_text())))}
    assert found == {}
    planted = "import os\nfrom tests.step_family import family\nimport tests.tools\n"
    assert _test_imports(ast.parse(planted)) == [2, 3]


def _namespace_reads(tree) -> list[str]:
    """Attributes read off a parameter typed argparse.Namespace: the offline commands take
    their settings and inputs through typed objects (AnalyzeRequest, RecordRequest, ...)."""
    out = []
    for func in ast.walk(tree):
        if not isinstance(func, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        names = {a.arg for a in [*func.args.args, *func.args.kwonlyargs]
                 if a.annotation is not None and "Namespace" in ast.unparse(a.annotation)}
        out += [f"{func.name}:{node.lineno} {node.value.id}.{node.attr}"
                for node in ast.walk(func) if isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name) and node.value.id in names]
    return out


def test_offline_reads_no_argparse_namespace():
    offline = [*(PACKAGE / "offline").rglob("*.py"),
               *(PACKAGE / "commands" / f"{name}.py" for name in ("record", "analyze", "lemons"))]
    found = [f"{path.name}:{read}" for path in sorted(offline)
             for read in _namespace_reads(ast.parse(path.read_text()))]
    assert found == []
    planted = ("def main(args: argparse.Namespace) -> int:\n"
               "    return args.window + inputs_of(Request, args).step\n")
    assert _namespace_reads(ast.parse(planted)) == ["main:2 args.window"]
