"""Recall and precision of the step swing inside compute plateaus on the synthetic family.

Draws the family of exporter/sim/step_family.py (paused jobs whose step swing is 3-30 % of
their power, 0.3 Hz up to the band's edge, instant and 1 s-averaged power, plus
healthy, idle and independent-GPU nodes that must stay silent), runs
analysis.step_segments.find_step_swing on each 120 s window, and prints the table
of docs/power.md.  A hit: the reported frequency within 5 % and the amplitude within
20 % of the truth (the swing as the sensor shows it).  Not a pass/fail test
(tests/test_step_segments.py asserts the thresholds on a smaller sample).
It reads the family from tests/, so it lives with the scripts, not the benchmarks.

    python scripts/eval_step_swing.py [--swing-cases 400] [--silent-cases 100]
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from exporter.analysis.step_segments import find_step_swing  # noqa: E402
from exporter.sim.step_family import KINDS_SILENT, family, readings, true_amplitude  # noqa: E402


def _group(case) -> str:
    sensor = "1 s average" if case.averaged else f"instant, {1 / case.interval_s:.0f} Hz"
    if case.amplitude < 0.10:
        size = "3-10 %"
    elif case.amplitude < 0.20:
        size = "10-20 %"
    else:
        size = "20-30 %"
    return f"{sensor}, amplitude {size}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--swing-cases", type=int, default=400)
    ap.add_argument("--silent-cases", type=int, default=100, help="of each silent kind")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--show", action="store_true", help="print each miss and false report")
    args = ap.parse_args()
    cases = family(args.swing_cases, args.silent_cases, seed=args.seed)
    hits: dict[str, list[bool]] = defaultdict(list)
    reported = true_reports = 0
    silent: dict[str, list[bool]] = defaultdict(list)
    for case in cases:
        res = find_step_swing(*readings(case), observable_hz=case.observable_hz)
        swing = res.swing
        reported += swing is not None
        if case.kind != "swing":
            silent[case.kind].append(swing is not None)
            if args.show and swing is not None:
                print(f"false report: {case}: {swing}", file=sys.stderr)
            continue
        ok = False
        if swing is not None:
            truth = true_amplitude(case)
            ok = (abs(swing.frequency_hz - case.swing_hz) <= 0.05 * case.swing_hz
                  and abs(swing.amplitude_watts - truth) <= 0.20 * truth)
        true_reports += ok
        if args.show and not ok:
            print(f"miss: {case}: {swing or res.reason}; true amplitude "
                  f"{true_amplitude(case):.1f} W", file=sys.stderr)
        hits[_group(case)].append(ok)
        hits["all swing cases"].append(ok)
    print("| cases | n | recall |")
    print("|---|---:|---:|")
    for name in sorted(k for k in hits if k != "all swing cases") + ["all swing cases"]:
        v = hits[name]
        print(f"| {name} | {len(v)} | {sum(v) / len(v):.3f} |")
    print()
    print("| silent cases | n | a swing reported |")
    print("|---|---:|---:|")
    for kind in KINDS_SILENT:
        v = silent[kind]
        print(f"| {kind} | {len(v)} | {sum(v)} |")
    false_silent = sum(sum(v) for v in silent.values())
    n_silent = sum(len(v) for v in silent.values())
    print()
    print(f"silent cases without a report: {1 - false_silent / n_silent:.3f}; precision "
          f"(right reports / all reports): {true_reports / max(1, reported):.3f}")


if __name__ == "__main__":
    main()
