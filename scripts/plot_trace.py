"""Plot a trace's node power with what `analyze` finds in it.

    PYTHONPATH=. python scripts/plot_trace.py TRACE OUT.png [--gpus N] [--tdp W]

matplotlib is imported here only: it is not a dependency of the exporter.
"""

from __future__ import annotations

import argparse
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from exporter.commands import analyze  # noqa: E402
from exporter.traces.load import load_trace  # noqa: E402
from exporter.traces.trace import TraceError  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    analyze.add_arguments(parser)
    parser.add_argument("out", metavar="OUT.png")
    args = parser.parse_args()
    try:
        trace = load_trace(args.file, gpus=args.gpus)
        rep = analyze.analyse_trace(trace, args)
    except TraceError as exc:
        print(f"plot_trace: {exc}", file=sys.stderr)
        return 2
    t0 = max(float(trace.series[g].t[0]) for g in rep["gpus"])
    fig, (ax, ax2) = plt.subplots(2, 1, figsize=(12, 7), sharex=True,
                                  gridspec_kw={"height_ratios": [2, 1]})
    node = None
    for g in rep["gpus"]:
        s = trace.series[g]
        p = np.interp(trace.series[rep["gpus"][0]].t, s.t, s.fields["power_watts"])
        node = p if node is None else node + p
        ax2.plot(s.t - t0, s.fields["power_watts"], lw=0.6, label=f"GPU {g}")
    t = trace.series[rep["gpus"][0]].t - t0
    ax.plot(t, node, color="black", lw=0.7, label="node power (sum of GPUs)")
    colours = {"step": "tab:red", "cycle": "tab:orange"}
    for sw in rep["power_swings"]:
        ax.axvspan(sw["start"], sw["end"], color=colours[sw["scale"]], alpha=0.12)
        what = (f"period {sw['period_seconds']:.1f} s" if sw.get("resolved", True)
                else f"above {sw['above_hz']:.2g} Hz, unresolved")
        ax.text(sw["start"] + 5, ax.get_ylim()[1] * 0.02 + 50,
                f"{sw['scale']}: {what}, amplitude {sw['node_amplitude_watts']:.0f} W",
                color=colours[sw["scale"]], fontsize=9)
    for i, d in enumerate(rep["dips"]):
        ax.axvspan(d["start"], d["end"], color="tab:purple", alpha=0.15)
        ax.annotate(f"dip {i + 1}: -{100 * d['depth_ratio']:.0f} % for "
                    f"{d['duration_seconds']:.0f} s", (d["start"], ax.get_ylim()[0]),
                    xytext=(3, 12), textcoords="offset points", color="tab:purple", fontsize=8)
    for r in rep["ramps"]:
        c = "tab:green" if r["direction"] == "rise" else "tab:blue"
        ax.axvline(r["time"], color=c, ls="--", lw=1)
        if r.get("dip") is None:
            ax.annotate(f"{r['direction']} {r['delta_watts']:+.0f} W",
                        (r["time"], ax.get_ylim()[1]), xytext=(3, -12),
                        textcoords="offset points", color=c, fontsize=8)
    ax.set_ylabel("node power [W]")
    pa = rep["power_averaging"]
    ax.set_title(f"{trace.source.rsplit('/', 1)[-1]}: {rep['power_column']} {pa['kind']} "
                 f"(by {pa['decided_by']}), observable band 0-"
                 f"{rep['observable_band_hz'][1]:.2g} Hz")
    ax.legend(loc="lower left", fontsize=8)
    ax2.set_ylabel("GPU power [W]")
    ax2.set_xlabel("seconds from trace start")
    ax2.legend(ncol=8, fontsize=7, loc="lower left")
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
