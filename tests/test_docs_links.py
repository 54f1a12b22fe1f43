"""README.md and docs/*.md point at things that exist and speak to users.

Every relative link (and its #anchor) resolves, every repository path named in
backticks exists, and no words from how the work was organised (numbered issues, a
reference file outside the repository, work sessions) reach the user. A planted bad
link, path and word show the checks can fail. The code's docstrings are held to the
same: every module they name (`exporter/sampling/buffers.py`, `sampling/buffers.py`,
`exporter.analysis.power_swing.analyse_window`) exists.
"""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

LINK = re.compile(r"(?<!!)\[[^\]\n]*\]\(([^)\s]+)\)|!\[[^\]\n]*\]\(([^)\s]+)\)")
REF_LINK = re.compile(r"^\[[^\]\n]+\]:\s*(\S+)", re.MULTILINE)
CODE_SPAN = re.compile(r"`([^`\n]+)`")
FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
# top-level entries whose paths the docs name (a path is checked when it starts with one)
TOP = ("exporter/", "docs/", "tests/", "bench/", "scripts/", "deploy/", "alerts/",
       "dashboards/", ".ci/")
INTERNAL = [
    (re.compile(r"REFERENCE\.md"), "names a file outside the repository"),
    (re.compile(r"\.\./shared"), "names a folder outside the repository"),
    (re.compile(r"\bissues? \d+", re.IGNORECASE), "cites a numbered issue"),
    (re.compile(r"(?<![\w&/=#])#\d+\b"), "cites a numbered issue"),
    (re.compile(r"\bsessions?\b", re.IGNORECASE), "speaks of work sessions"),
    (re.compile(r"\bfindings? \d+ of\b", re.IGNORECASE), "cites an issue's finding"),
]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to dashes."""
    text = re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip()).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(text: str) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for line in FENCE.sub("", text).splitlines():
        m = re.match(r"#{1,6}\s+(.*?)\s*#*$", line)
        if m:
            base = slug(m.group(1))
            n = seen.get(base, 0)
            seen[base] = n + 1
            out.add(base if n == 0 else f"{base}-{n}")
    return out | set(re.findall(r'<a (?:id|name)="([^"]+)"', text))  # explicit anchors


def _link_problems(doc: Path, text: str, root: Path) -> list[str]:
    out = []
    targets = [a or b for a, b in LINK.findall(text)] + REF_LINK.findall(text)
    for target in targets:
        if re.match(r"[a-z]+:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (doc.parent / path).resolve() if path else doc
        if not dest.exists():
            out.append(f"{doc.name}: link to {target}: no such file")
        elif not dest.resolve().is_relative_to(root.resolve()):
            out.append(f"{doc.name}: link to {target}: outside the repository")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest.read_text()):
            out.append(f"{doc.name}: link to {target}: no such heading")
    return out


def _path_problems(doc: Path, text: str, root: Path) -> list[str]:
    out = []
    for span in CODE_SPAN.findall(FENCE.sub("", text)):
        for token in span.split():
            token = token.strip(",;:()'\"").split("#")[0].split("?")[0]
            if not token.startswith(TOP) or re.search(r"[<>{}$|]|[A-Z]{3,}", token):
                continue  # not a repository path, or a placeholder (NAME, <pid>, $X)
            found = list(root.glob(token)) if "*" in token else [root / token]
            if not any(p.exists() for p in found):
                out.append(f"{doc.name}: `{token}`: not in the repository")
    return out


def _word_problems(doc: Path, text: str) -> list[str]:
    out = []
    for pattern, why in INTERNAL:
        for m in pattern.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            out.append(f"{doc.name}:{line}: {m.group(0)!r} {why}")
    return out


def problems(doc: Path, root: Path = ROOT) -> list[str]:
    text = doc.read_text()
    return (_link_problems(doc, text, root) + _path_problems(doc, text, root)
            + _word_problems(doc, text))


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_links_paths_and_words(doc: Path) -> None:
    assert problems(doc) == []


def test_the_checks_catch_a_planted_bad_link_path_and_word(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    (repo / "docs").mkdir(parents=True)
    (repo / "docs" / "real.md").write_text("# Real heading\n")
    (tmp_path / "outside.md").touch()  # exists, but not in the repository
    doc = repo / "README.md"
    doc.write_text(
        "See [gone](docs/gone.md), [ok](docs/real.md#real-heading), "
        "[bad anchor](docs/real.md#nope), [out](../outside.md) and `docs/missing.md`.\n"
        "Fixed in issue 12 (#34); see REFERENCE.md and ../shared/data; last session.\n")
    found = "\n".join(problems(doc, root=repo))
    assert "docs/gone.md: no such file" in found
    assert "docs/real.md#nope: no such heading" in found
    assert "real-heading" not in found
    assert "../outside.md: outside the repository" in found
    assert "`docs/missing.md`: not in the repository" in found
    for word in ("'issue 12'", "'#34'", "'REFERENCE.md'", "'../shared'", "'session'"):
        assert word in found, word
    doc.write_text("See [ok](docs/real.md#real-heading) and `docs/real.md`.\n")
    assert problems(doc, root=repo) == []


def test_the_readme_lists_every_built_in_scenario() -> None:
    readme = (ROOT / "README.md").read_text()
    listed = re.search(r"Try the faults on the simulated node:(.*?)\)\.", readme, re.DOTALL)
    assert listed, "the README's scenario list moved"
    names = {n for n in re.findall(r"`([a-z0-9-]+)`", listed.group(1))}
    names |= set(re.findall(r"--scenario\s+([a-z0-9-]+)", listed.group(1)))
    shipped = {p.stem for p in (ROOT / "exporter" / "scenarios").glob("*.yaml")}
    assert shipped - {"training"} <= names, shipped - names  # training is the default
    assert names <= shipped, names - shipped
    for name in shipped:  # and each is a scenario, not an empty file
        assert isinstance(yaml.safe_load((ROOT / "exporter/scenarios" / f"{name}.yaml")
                                         .read_text()), dict)


def test_the_straggler_demo_uses_one_persistence_everywhere() -> None:
    found = {}
    for doc in [*DOCS, ROOT / "scripts" / "live_page_screenshot.py"]:
        for value in re.findall(r"--straggler\.persistence[ =](\d+(?:\.\d+)?)\b",
                                doc.read_text()):
            found.setdefault(float(value), []).append(doc.name)
    assert len(found) == 1, found


# -- module names in the code's docstrings ---------------------------------------------

PACKAGE = ROOT / "exporter"
AREAS = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
CODE_DIRS = ("exporter", "tests", "scripts", "bench")
PY_PATH = re.compile(r"(?<![\w/.-])((?:[a-z_][a-z0-9_]*/)*[a-z_][a-z0-9_]*\.py)\b")
# exporter.x.y or x.y where x is one of exporter's packages; not a file name (health.md)
# nor a host name (gpu.nvidia.com)
DOTTED = re.compile(r"(?<![\w./-])((?:exporter\.)?[a-z_][a-z0-9_]*(?:\.[A-Za-z_]\w*)+)"
                    r"(?![\w/-]|\.[a-z])")
NOT_NAMES = ("com", "org", "io", "net", "md", "py", "yaml", "json", "csv", "txt", "gz")


def _docstrings(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                yield node.body[0].lineno, doc


def _path_exists(token: str, root: Path) -> bool:
    """exporter/x/y.py from the repository's root, x/y.py from exporter/ when x is one of
    its packages, y.py anywhere in the code; anything else is not a path of ours."""
    first = token.split("/")[0]
    if "/" not in token:
        return any(any((root / d).rglob(token)) for d in CODE_DIRS if (root / d).is_dir())
    if first in CODE_DIRS:
        return (root / token).exists()
    return (root / "exporter" / token).exists() if first in AREAS else True


def _dotted_exists(token: str, root: Path) -> bool:
    """The longest module a dotted name starts with exists, and the rest are its
    attributes."""
    parts = token.split(".")
    if parts[-1] in NOT_NAMES or (parts[0] != "exporter" and parts[0] not in AREAS):
        return True
    parts = parts if parts[0] == "exporter" else ["exporter", *parts]
    for i in range(len(parts), 1, -1):
        rel = Path(*parts[:i])
        if (root / rel.with_suffix(".py")).exists() or (root / rel / "__init__.py").exists():
            if root != ROOT:  # a planted tree is not importable: the module is enough
                return i == len(parts)
            obj: object = importlib.import_module(".".join(parts[:i]))
            for attr in parts[i:]:
                if not hasattr(obj, attr):
                    return False
                obj = getattr(obj, attr)
            return True
    return False


def docstring_problems(path: Path, root: Path = ROOT) -> list[str]:
    out = []
    for line, doc in _docstrings(ast.parse(path.read_text())):
        where = f"{path.relative_to(root)}:{line}"
        out += [f"{where}: {m.group(1)}: no such module" for m in PY_PATH.finditer(doc)
                if not _path_exists(m.group(1), root)]
        out += [f"{where}: {m.group(1)}: no such module or name"
                for m in DOTTED.finditer(doc) if not _dotted_exists(m.group(1), root)]
    return out


def test_docstrings_name_modules_that_exist() -> None:
    found = [p for path in sorted(PACKAGE.rglob("*.py")) for p in docstring_problems(path)]
    assert found == []


def test_the_docstring_check_catches_a_module_that_is_gone(tmp_path: Path) -> None:
    (tmp_path / "exporter" / "sampling").mkdir(parents=True)
    (tmp_path / "exporter" / "__init__.py").touch()
    (tmp_path / "exporter" / "sampling" / "__init__.py").touch()
    (tmp_path / "exporter" / "sampling" / "buffers.py").touch()
    module = tmp_path / "exporter" / "sampling" / "loop.py"
    module.write_text('"""Rings in sampling/power.py and exporter/sampling/buffers.py;\n'
                      'see exporter.sampling.analyses, sampling.buffers, docs/power.md and\n'
                      'gpu.nvidia.com."""\n')
    found = "\n".join(docstring_problems(module, root=tmp_path))
    assert "sampling/power.py: no such module" in found
    assert "exporter.sampling.analyses: no such module or name" in found
    for fine in ("buffers.py", "sampling.buffers", "docs/power.md", "nvidia"):
        assert fine not in found, fine
