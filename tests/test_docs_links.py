"""README.md and docs/*.md point at things that exist and speak to users.

Every relative link (and its #anchor) resolves, every repository path named in
backticks exists, and no words from how the work was organised (numbered issues, a
reference file outside the repository, work sessions) reach the user. A planted bad
link, path and word show the checks can fail.
"""

from __future__ import annotations

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
