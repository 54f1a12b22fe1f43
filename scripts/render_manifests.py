"""Writes deploy/kubernetes/*.yaml, the plain manifests, from the Helm chart (one source).

    python scripts/render_manifests.py           # write them
    python scripts/render_manifests.py --check   # exit 1 if a file differs from the chart

Rendered offline with Helm's own Go SDK (the `helm-python-sdk` package, a test
dependency): release `cluster-telemetry-exporter` in namespace `monitoring`, the chart's
defaults, without the dashboards (import those from dashboards/).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CHART = REPO / "deploy" / "helm" / "cluster-telemetry-exporter"
OUT = REPO / "deploy" / "kubernetes"
RELEASE, NAMESPACE = "cluster-telemetry-exporter", "monitoring"
VALUES = {"dashboards": {"enabled": False}}
HEADER = ("# Generated from deploy/helm/cluster-telemetry-exporter by "
          "scripts/render_manifests.py\n# (release {release}, namespace {namespace}, the "
          "chart's defaults): edit the chart, then run it.\n")


def render() -> dict[str, str]:
    """File name -> text, for every template that renders to something."""
    import helm_python as helm

    helm.disable_logging()  # the symlinked files/ are reported at INFO on every load
    with helm.Chart.load(CHART) as chart:
        manifests = chart.render(VALUES, name=RELEASE, namespace=NAMESPACE, is_install=True)
    header = HEADER.format(release=RELEASE, namespace=NAMESPACE)
    return {Path(template).name: header + text.strip() + "\n"
            for template, text in sorted(manifests.items())
            if "/templates/" in template and text.strip()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare, do not write")
    args = parser.parse_args(argv)
    wanted = render()
    present = {p.name for p in OUT.glob("*.yaml")}
    stale = sorted(name for name, text in wanted.items()
                   if not (OUT / name).exists() or (OUT / name).read_text() != text)
    extra = sorted(present - wanted.keys())
    if args.check:
        for name in stale + extra:
            print(f"deploy/kubernetes/{name} differs from the chart", file=sys.stderr)
        return 1 if stale or extra else 0
    for name in extra:
        (OUT / name).unlink()
    for name in stale:
        (OUT / name).write_text(wanted[name])
    return 0


if __name__ == "__main__":
    sys.exit(main())
