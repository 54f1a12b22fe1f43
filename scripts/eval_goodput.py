"""The goodput account against synthetic jobs with known truth (exporter/sim/job_story.py).

Writes each story as a trace, runs `analyze` on it (the same path as the command) and
prints, per state, the largest relative error over the stories and how many stories kept
every state within 5 % of the truth (and the misses by checkpoint and stall kind), for the
stories the rules were tuned on (seeds 0-79) and, apart, for held-out ones (seeds 100 on,
or from --held-out-from) that are run once, after the tuning; then the goodput ratio of
one job checkpointing every 1, 10, 50, 100, 500 and 1000 steps, saved by rank 0 and
sharded, with its rank correlation against the number of steps. The tables of
docs/goodput.md. Not a pass/fail test (tests/test_goodput.py asserts the thresholds on a
few tuning stories).

    python scripts/eval_goodput.py [--held-out 20] [--held-out-from 100] [--tuning-only]

Held-out stories are for a judgement made once: never tune on them.
"""

from __future__ import annotations

import argparse
import collections
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402

from exporter.analysis.goodput import STATES  # noqa: E402
from exporter.commands.analyze import analyse_trace  # noqa: E402
from exporter.offline.request import AnalyzeRequest  # noqa: E402
from exporter.sim.job_story import Story, checkpoint_every, draw_story, truth, write_trace  # noqa: E402
from exporter.traces.load import load_trace  # noqa: E402

TUNING = range(80)
HELD_OUT_FROM = 100
TOLERANCE = 0.05
ABSOLUTE = 0.5  # seconds: a state absent from the truth may show this much


def accounting(story: Story, directory: Path) -> dict:
    path = write_trace(story, directory / f"story-{story.seed}.cte")
    return analyse_trace(load_trace(str(path)), AnalyzeRequest(str(path)))["time_accounting"]


def evaluate(seeds: range, directory: Path) -> None:
    worst = dict.fromkeys(STATES, 0.0)
    within = 0
    lost_errors = []
    misses: collections.Counter[str] = collections.Counter()
    for seed in seeds:
        story = draw_story(seed)
        acc, want = accounting(story, directory), truth(story)
        ok = True
        for state in STATES:
            got, true = acc["seconds"][state], want["seconds"][state]
            error = abs(got - true)
            if error > max(TOLERANCE * true, ABSOLUTE):
                ok = False
            if true > 0:
                worst[state] = max(worst[state], error / true)
        within += ok
        if not ok:
            misses[f"{story.checkpoint_kind} checkpoints, {story.stall_kind} stall"] += 1
        lost = want["lost_progress_gpu_seconds"]
        if lost:
            lost_errors.append(abs(acc["lost_progress_estimate"]["gpu_seconds"] - lost) / lost)
    print(f"  stories with every state within 5 %: {within} of {len(seeds)}")
    print("  largest error by state: " + ", ".join(
        f"{state} {100 * worst[state]:.1f} %" for state in STATES if state not in (
            "unallocated",)))
    if lost_errors:
        print(f"  lost progress estimate: largest error {100 * max(lost_errors):.1f} %")
    if misses:
        print("  misses: " + ", ".join(f"{k} {v}" for k, v in sorted(misses.items())))


def spearman(x: list[float], y: list[float]) -> float:
    """Rank correlation (no ties expected)."""
    rx, ry = np.argsort(np.argsort(x)), np.argsort(np.argsort(y))
    return float(np.corrcoef(rx, ry)[0, 1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--held-out", type=int, default=20, help="held-out stories to run")
    ap.add_argument("--held-out-from", type=int, default=HELD_OUT_FROM, metavar="N",
                    help=f"the first held-out seed (default {HELD_OUT_FROM}; at least "
                         f"{TUNING.stop}, past the tuning stories)")
    ap.add_argument("--tuning-only", action="store_true",
                    help="run the tuning stories and the checkpoint tables, no held-out ones")
    args = ap.parse_args()
    if args.held_out < 0:
        ap.error("--held-out must be 0 or more")
    if args.held_out_from < TUNING.stop:
        ap.error(f"--held-out-from must be at least {TUNING.stop}: seeds below are the "
                 "tuning stories")
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        print(f"tuning stories (seeds {TUNING.start}-{TUNING.stop - 1}):")
        evaluate(TUNING, directory)
        if not args.tuning_only and args.held_out:
            held = range(args.held_out_from, args.held_out_from + args.held_out)
            print(f"held-out stories (seeds {held.start}-{held.stop - 1}):")
            evaluate(held, directory)
        steps = (1, 10, 50, 100, 500, 1000)
        for kind in ("rank0", "sharded"):
            print(f"checkpoint ({kind}) every N 1 s steps (10 s pauses): goodput ratio "
                  "measured (true), checkpoint share")
            ratios = []
            for n in steps:
                story = checkpoint_every(n, kind=kind)
                acc, want = accounting(story, directory), truth(story)
                seconds = want["seconds"]
                true = seconds["productive"] / sum(
                    v for k, v in seconds.items() if k not in ("unallocated", "unknown"))
                share = acc["seconds"]["checkpoint"] / sum(acc["seconds"].values())
                ratios.append(acc["goodput_ratio"])
                print(f"  every {n:>4}: {acc['goodput_ratio']:.3f} ({true:.3f}), "
                      f"checkpoint {100 * share:.0f} %")
            print(f"  rank correlation of goodput with N: {spearman(list(steps), ratios):.2f}")


if __name__ == "__main__":
    main()
