"""mypy checks exporter/ (its configuration: pyproject.toml's [tool.mypy]), and the
settings and the snapshot, the two contracts every layer reads, say their types: no Any."""

from __future__ import annotations

import ast
import subprocess
import sys

from tests.tools import REPO

TYPED = ("exporter/options.py", "exporter/config.py", "exporter/sampling/settings.py",
         "exporter/web/settings.py", "exporter/sampling/snapshot.py",
         "exporter/sampling/buffers.py")


def test_mypy_passes_on_the_package():
    result = subprocess.run([sys.executable, "-m", "mypy", "--no-error-summary"],
                            capture_output=True, text=True, cwd=REPO, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr


def _annotations(path: str) -> list[str]:
    tree = ast.parse((REPO / path).read_text())
    return [ast.unparse(node.annotation) for node in ast.walk(tree)
            if isinstance(node, ast.AnnAssign)]


def test_no_any_in_the_settings_or_the_snapshot():
    found = {path: [a for a in _annotations(path) if "Any" in a] for path in TYPED}
    assert {path: anys for path, anys in found.items() if anys} == {}


def test_the_settings_sections_are_typed_dataclasses():
    from exporter.collectors import registry
    from exporter.config import Config
    from exporter.options import options_of

    for spec in registry.specs():
        for option in options_of(spec.settings):
            assert option.kind in (bool, int, float, str), (spec.name, option.key)
    assert {o.kind for o in options_of(Config)} <= {bool, int, float, str, tuple}
