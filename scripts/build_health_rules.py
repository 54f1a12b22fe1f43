#!/usr/bin/env python3
"""Write the thresholds of the alert rules that the health verdict also judges (retired
pages, NVLink, PCIe, InfiniBand) from the health_* settings: the defaults into alerts/
(`--check` fails where a file differs), or, with `--config`, an operator's own into
`--out-dir`, so a threshold changed on the nodes moves the alert too.

    python3 scripts/build_health_rules.py --config /etc/cluster-telemetry-exporter/config.yaml \\
        --out-dir /etc/prometheus/rules
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from exporter.config import load_config_file  # noqa: E402
from exporter.health.alert_rules import FILES, apply  # noqa: E402
from exporter.health.settings import HealthSettings  # noqa: E402
from exporter.yamlfile import ConfigError  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", help="the nodes' config file (its health_* settings); "
                        "default: the settings' defaults")
    parser.add_argument("--out-dir", type=Path, default=REPO / "alerts",
                        help="where to write the rule files (default: alerts/)")
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 if a file is not what this would write")
    args = parser.parse_args(argv)
    try:
        settings = load_config_file(args.config).health if args.config else HealthSettings()
    except ConfigError as exc:
        print(f"build_health_rules: {exc}", file=sys.stderr)
        return 2
    stale = []
    for name in FILES:
        source = (REPO / "alerts" / name).read_text()
        written = apply(name, source, settings)
        target = args.out_dir / name
        if args.check:
            if not target.exists() or target.read_text() != written:
                stale.append(name)
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(written)
        print(f"wrote {target}")
    if stale:
        print(f"not what build_health_rules.py writes: {', '.join(stale)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
