"""Write the family table (exporter/metrics/family_table.py: each family's profile and
labels) and the generated parts of docs/metrics.md (the tables of the declared sections,
the profile lists) from the family declarations (`DECLARED` in each producing module;
exporter/families.py), so neither can drift from the code.

    .venv/bin/python scripts/build_metrics_docs.py          # rewrite both
    .venv/bin/python scripts/build_metrics_docs.py --check  # exit 1 if one is out of date

In docs/metrics.md a declared section's table sits between `<!-- families: KEY -->` and
`<!-- end families -->` (KEY from SECTIONS), each profile list between
`<!-- profile list: PROFILE -->` and `<!-- end profile list -->`; the prose around them is
written by hand.
"""

from __future__ import annotations

import importlib
import re
import sys
from collections.abc import Iterable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from exporter.families import FULL, MINIMAL, Family, by_name  # noqa: E402

DOCS = REPO / "docs" / "metrics.md"
TABLE = REPO / "exporter" / "metrics" / "family_table.py"

# (marker key, the heading it is under, the declaring modules in the table's order):
# doc layout, not family metadata. A new declaring module joins its heading's entry here.
SECTIONS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("gpu", "GPU (NVML)", ("exporter.metrics.gpu",)),
    ("gpu_hardware", "GPU hardware", ("exporter.metrics.gpu_hardware",)),
    ("health", "Health verdict", ("exporter.metrics.health",)),
    ("history", "History (state directory)", ("exporter.history.families",)),
    ("profiling", "Profiling (GPM): compute or wait",
     ("exporter.collectors.profiling.families",)),
    ("power", "Power and swings", ("exporter.metrics.power",)),
    ("stragglers", "Stragglers and stalls", ("exporter.metrics.stragglers",)),
    ("goodput", "Goodput: where GPU time goes", ("exporter.metrics.goodput",)),
    ("self", "Exporter self-metrics", ("exporter.metrics.self_metrics",)),
    ("serving", "Serving: HTTP connections, config reloads, TLS", ("exporter.web.families",)),
    ("infiniband", "InfiniBand / RoCE", ("exporter.collectors.infiniband.families",)),
    ("host", "Host", ("exporter.collectors.host.families",)),
    ("jobs", "Jobs", ("exporter.collectors.jobs.families",)),
    ("mig", "MIG", ("exporter.collectors.mig.families",
                    "exporter.collectors.profiling.mig_families")),
    ("processes", "Processes", ("exporter.collectors.processes.families",)),
    ("kubernetes", "Kubernetes", ("exporter.collectors.kubernetes.families",)),
)

TABLE_HEAD = ("| Metric | Type | Unit | Labels | Source | Description |\n"
              "|---|---|---|---|---|---|\n")
_BLOCK = re.compile(r"(<!-- families: (?P<key>[a-z_]+) -->\n).*?(<!-- end families -->)",
                    re.S)
_LIST = re.compile(r"(<!-- profile list: (?P<key>[a-z]+) -->\n).*?(<!-- end profile list -->)",
                   re.S)
_ROW = re.compile(r"`([a-z0-9_]+)`")


def declared() -> dict[str, Family]:
    """Every declared family by name; one declared twice is refused."""
    return by_name(tuple(f for _, _, modules in SECTIONS for module in modules
                         for f in importlib.import_module(module).DECLARED))


def section(key: str) -> tuple[Family, ...]:
    for name, _, modules in SECTIONS:
        if name == key:
            return tuple(f for module in modules
                         for f in importlib.import_module(module).DECLARED)
    raise ValueError(f"docs/metrics.md: no section {key!r} in SECTIONS")


def row(family: Family) -> str:
    labels = ", ".join([f"`{label}`" for label in family.labels]
                       + ([family.more_labels] if family.more_labels else [])) or "-"
    return (f"| `{family.name}` | {family.type} | {family.unit} | {labels} | "
            f"{family.source} | {family.doc} |")


def table(families: Iterable[Family]) -> str:
    return TABLE_HEAD + "".join(row(f) + "\n" for f in families)


def family_table() -> tuple[dict[str, str], dict[str, tuple[str, ...]]]:
    """(profile, labels) of every family, by name."""
    families = declared()
    return ({n: families[n].profile for n in sorted(families)},
            {n: families[n].labels for n in sorted(families)})


def _wrap(words: list[str], width: int = 88) -> str:
    lines, line = [], ""
    for word in words:
        if line and len(line) + len(word) + 1 > width:
            lines.append(line)
            line = ""
        line += (" " if line else "") + word
    return "\n".join([*lines, line]) + "\n"


def profile_list(profiles: dict[str, str], profile: str) -> str:
    names = [f"`{n}`" for n, p in profiles.items() if p == profile]
    return _wrap([f"{n}," for n in names[:-1]] + names[-1:])


def render_docs(docs: str) -> str:
    profiles, _ = family_table()
    lists = {MINIMAL: profile_list(profiles, MINIMAL), FULL: profile_list(profiles, FULL)}
    seen: set[str] = set()

    def block(m: re.Match[str]) -> str:
        seen.add(m["key"])
        return m.group(1) + "\n" + table(section(m["key"])) + "\n" + m.group(3)

    def listing(m: re.Match[str]) -> str:
        return m.group(1) + lists[m["key"]] + m.group(3)

    out = _LIST.sub(listing, _BLOCK.sub(block, docs))
    missing = [key for key, _, _ in SECTIONS if key not in seen]
    if missing:
        raise ValueError(f"docs/metrics.md has no `<!-- families: KEY -->` for {missing}")
    return out


def _entry(name: str, value: str) -> str:
    return f'    "{name}": {value},\n'


def _labels(name: str, labels: tuple[str, ...]) -> str:
    quoted = [f'"{label}"' for label in labels]
    one = f'({", ".join(quoted)}{"," if len(quoted) == 1 else ""})'
    if len(_entry(name, one)) <= 101:  # ruff's line length, and the newline
        return one
    lines, line = [], "       "
    for q in quoted:  # wrapped the way ruff's line length wants it
        if len(line) + len(q) + 2 > 96:
            lines.append(line.rstrip())
            line = "       "
        line += f" {q},"
    lines.append(line.rstrip(","))
    return "(\n" + "\n".join(lines) + ")"


def render_table() -> str:
    profiles, labels = family_table()
    return ('''"""Every metric family by its exposed name: its profile, and its label names as the
`full` profile serves them (what a selection file's aggregation may sum away).

Generated by scripts/build_metrics_docs.py from the family declarations (`DECLARED` in
each producing module): do not edit; run the script after changing a declaration.
"""

from __future__ import annotations

PROFILE: dict[str, str] = {
''' + "".join(_entry(n, f'"{p}"') for n, p in profiles.items()) + "}\n\n"
            "LABELS: dict[str, tuple[str, ...]] = {\n"
            + "".join(_entry(n, _labels(n, v)) for n, v in labels.items()) + "}\n")


def main() -> int:
    docs = DOCS.read_text()
    outputs = {DOCS: render_docs(docs), TABLE: render_table()}
    stale = [path for path, text in outputs.items()
             if not path.exists() or path.read_text() != text]
    if "--check" in sys.argv:
        for path in stale:
            print(f"{path.relative_to(REPO)} is out of date: run "
                  ".venv/bin/python scripts/build_metrics_docs.py")
        return 1 if stale else 0
    for path in stale:
        path.write_text(outputs[path])
    return 0


if __name__ == "__main__":
    sys.exit(main())
