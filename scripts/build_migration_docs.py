"""Write the field table of docs/migrating-from-dcgm-exporter.md from the table the
compatibility mode serves (exporter/metrics/compat/dcgm_fields.csv), so the page can never
drift from what `--metrics.compat dcgm-exporter` serves (tests/test_dcgm_compat.py
checks that it serves the table).

    .venv/bin/python scripts/build_migration_docs.py        # rewrite the table
    .venv/bin/python scripts/build_migration_docs.py --check  # exit 1 if it is out of date
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from exporter.metrics.compat.dcgm import FIELDS, DcgmField  # noqa: E402

OUT = Path(__file__).resolve().parent.parent / "docs" / "migrating-from-dcgm-exporter.md"
BEGIN, END = "<!-- begin fields -->", "<!-- end fields -->"

# our base unit -> DCGM's, by the table's factor
CONVERSIONS = {1e-6: "Hz to MHz (/ 10^6)", 1000.0: "J to mJ (x 1,000)",
               100.0: "ratio to % (x 100)", 2.0 ** -20: "bytes to MiB (/ 2^20)",
               1 / 1024: "bytes to KiB (/ 1,024)", 1e9: "s to ns (x 10^9)"}


def _conversion(field: DcgmField) -> str:
    if not field.served:
        return "not served"
    if field.type == "label":
        return "label"
    if field.source.startswith("pcie_rate:"):
        return "per second (`rate()` of ours)"
    return CONVERSIONS.get(field.scale, "same" if field.scale == 1 else f"x {field.scale:g}")


def _ours(field: DcgmField) -> str:
    return f"`{field.family}`" if field.family else "-"


def _notes(field: DcgmField) -> str:
    notes = [field.note.replace("|", "/")] if field.note else []
    if field.mig:
        notes.append("per MIG instance too (`GPU_I_ID`)")
    return "; ".join(notes) or "-"


def table() -> str:
    rows = ["| dcgm-exporter field | TYPE | Unit | In its default list | Ours | Conversion "
            "| Notes |", "|---|---|---|---|---|---|---|"]
    for f in FIELDS:
        rows.append(f"| `{f.name}` | {f.type} | {f.unit} | "
                    f"{'yes' if f.list == 'default' else '-'} | {_ours(f)} | "
                    f"{_conversion(f)} | {_notes(f)} |")
    return "\n".join(rows)


def render(text: str) -> str:
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n{table()}\n{END}{tail}"


def main() -> int:
    current = OUT.read_text()
    wanted = render(current)
    if "--check" in sys.argv[1:]:
        if current != wanted:
            print(f"{OUT} is out of date: run scripts/build_migration_docs.py")
            return 1
        return 0
    OUT.write_text(wanted)
    return 0


if __name__ == "__main__":
    sys.exit(main())
