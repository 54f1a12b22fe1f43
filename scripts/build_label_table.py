"""Writes exporter/metrics/labels.py from docs/metrics.md's label column (which
tests/test_docs_metrics.py holds to what the exporter serves). Run it after adding a
family or a label: `.venv/bin/python scripts/build_label_table.py`."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TABLE = REPO / "exporter" / "metrics" / "labels.py"
HEAD = '''"""The label names of every metric family (by its exposed name), as the `full` profile
serves it: what a selection file's aggregation may sum away (exporter.metrics.selection).

Written by scripts/build_label_table.py from the label column of docs/metrics.md, which
tests/test_docs_metrics.py checks against what the exporter serves; tests/test_selection.py
keeps this table and that column in step, and this table's families and profiles.FAMILIES.
"""

from __future__ import annotations

LABELS: dict[str, tuple[str, ...]] = {
'''


def documented_labels() -> dict[str, tuple[str, ...]]:
    rows: dict[str, tuple[str, ...]] = {}
    for line in (REPO / "docs" / "metrics.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 6 or not (m := re.fullmatch(r"`([a-z0-9_]+)`", cells[0])):
            continue
        found = [] if cells[3] == "-" else re.findall(r"`([a-z_]+)`", cells[3])
        rows[m.group(1)] = tuple(dict.fromkeys(found))
    return dict(sorted(rows.items()))


def _entry(name: str, labels: tuple[str, ...]) -> str:
    quoted = [f'"{label}"' for label in labels]
    one = f'    "{name}": ({", ".join(quoted)}{"," if len(quoted) == 1 else ""}),\n'
    if len(one) <= 100:
        return one
    lines, line = [], "       "
    for q in quoted:  # wrapped the way ruff's line length wants it
        if len(line) + len(q) + 2 > 96:
            lines.append(line.rstrip())
            line = "       "
        line += f" {q},"
    lines.append(line.rstrip(","))
    return f'    "{name}": (\n' + "\n".join(lines) + "),\n"


def main() -> None:
    body = "".join(_entry(name, labels) for name, labels in documented_labels().items())
    TABLE.write_text(HEAD + body + "}\n")


if __name__ == "__main__":
    main()
