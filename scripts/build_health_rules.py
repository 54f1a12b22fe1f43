#!/usr/bin/env python3
"""Write alerts/gpu-hardware.yml, alerts/fabric.yml, their promtool tests
(alerts/tests/gpu-hardware.test.yml, alerts/tests/fabric.test.yml) and docs/health.md's
fault table from the fault table (exporter/health/faults.py). `--check` writes nothing
and exits 1 where a committed file differs.

The rules read each check's state from the exporter's verdict, so they hold no thresholds:
a threshold is changed in the nodes' config (the health_* settings), and the alerts follow.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from exporter.health.rules import rule_files, test_files, with_docs_table  # noqa: E402


def written() -> dict[Path, str]:
    """Each file this writes, under the repository, with its text."""
    out = {REPO / "alerts" / name: text for name, text in rule_files().items()}
    out.update({REPO / "alerts" / "tests" / name: text
                for name, text in test_files().items()})
    docs = REPO / "docs" / "health.md"
    out[docs] = with_docs_table(docs.read_text())
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 if a file is not what this would write")
    args = parser.parse_args(argv)
    stale = []
    for path, text in written().items():
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(str(path.relative_to(REPO)))
            continue
        path.write_text(text)
        print(f"wrote {path.relative_to(REPO)}")
    if stale:
        print(f"not what build_health_rules.py writes: {', '.join(stale)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
