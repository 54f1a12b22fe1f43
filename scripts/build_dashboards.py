"""Build the Grafana dashboards in dashboards/*.json with grafana-foundation-sdk.

The JSON files are committed (Grafana imports them as they are); this script is how
they are written, from the dashboard modules in scripts/grafana_dashboards/, so the
five dashboards share one datasource variable, one set of template variables and one
layout. `tests/test_dashboards.py` checks that the files match its output.

The SDK is a build-time dependency only:

    pip install -e '.[dashboards]'      # or '.[test]', which includes it
    python scripts/build_dashboards.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

try:
    from grafana_foundation_sdk.cog.encoder import JSONEncoder
    from grafana_foundation_sdk.models.dashboard import Dashboard
except ImportError as e:  # pragma: no cover - only without the extra
    raise ImportError(f"{e}; scripts/build_dashboards.py needs grafana-foundation-sdk: "
                      "pip install -e '.[dashboards]'") from e

from grafana_dashboards import BOARDS  # noqa: E402

OUT = Path(__file__).resolve().parent.parent / "dashboards"


def build() -> dict[str, Dashboard]:
    """File name -> dashboard, in the order the modules are listed."""
    return {module.FILE: module.board() for module in BOARDS}


def render(board: Dashboard) -> str:
    return json.dumps(board, cls=JSONEncoder, indent=2, ensure_ascii=False) + "\n"


def main() -> int:
    OUT.mkdir(exist_ok=True)
    for name, board in build().items():
        (OUT / name).write_text(render(board))
        print(f"wrote dashboards/{name}: {len(board.panels or [])} panels")
    return 0


if __name__ == "__main__":
    sys.exit(main())
