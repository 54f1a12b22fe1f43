"""The profile of each family not declared yet: the families of the modules that still
build theirs by hand, whose rows in docs/metrics.md are still written by hand too (their
labels are read from those rows): exporter/metrics/{health,power,stragglers}.py,
exporter/collectors/{infiniband,jobs,kubernetes,mig,processes,profiling}/families.py,
exporter/web/families.py and exporter/history/families.py.

A remainder of the move to declarations (exporter/families.py): it shrinks to nothing as
each producing module declares its families, and goes then. Add nothing here: declare a
new family beside its code instead. scripts/build_metrics_docs.py merges this table with
the declarations into exporter/metrics/family_table.py.

Moving a module to declarations (exporter/metrics/self_metrics.py and
exporter/collectors/host/families.py show how):
1. Declare each of its families as a module-level `Family` beside the code, help and
   labels exactly as served today, unit, source and description copied from its row in
   docs/metrics.md (`doc=` only where the description says more than the help), the
   profile from this table; list them in a module-level `DECLARED`, in the docs' order.
2. Build each family from its declaration (`.gauge()`, `.counter()`, `.info()`,
   `Rows.of()`, `counts_of()` for a collector's error counts), never by name and help.
3. Add the module to `SECTIONS` in scripts/build_metrics_docs.py under its heading, and
   put the heading's table in docs/metrics.md between `<!-- families: KEY -->` and
   `<!-- end families -->` (a table is generated whole: the modules of one heading move
   together).
4. Delete its families here; run `.venv/bin/python scripts/build_metrics_docs.py`; the
   diff of docs/metrics.md should show no row changed.
5. Run tests/test_family_declarations.py, test_golden_metrics.py (unchanged),
   test_docs_metrics.py and test_selection.py.
"""

from __future__ import annotations

from exporter.families import FULL, MINIMAL, STANDARD

UNDECLARED_PROFILES: dict[str, str] = {
}
