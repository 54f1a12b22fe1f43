"""What sleeping between ticks costs: the same simulated second of work, back to back and
after a pause.

    python bench/bench_bursts.py [--seconds 60] [--rounds 2] [--pauses 0.1,1]

`run --fake --no-fake.costs` on a manual clock with its threads off (sampler.advance), after
the 660 s power window has filled. Each round times `--seconds` simulated seconds one at a
time: back to back (the reference, measured in the same round), then with a wall-clock pause
before each second. The exporter runs once a second after sleeping, so what the pause adds
(caches and branch predictors cold again) is part of its CPU in threads; the work is the
same, so the ratio is what the machine charges for bursts. Per loop, the loops' own CPU
(`Loop.cpu_seconds`) over the back-to-back seconds. Last, what a wake-up costs by itself
(the same pauses slept with no work): in threads each loop's thread pays it once a tick,
on top of its cold work. Not a pass/fail test.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from targets import manual_fake_exporter

WARMUP_SECONDS = 700.0  # the power window (660 s) full, as at steady state


def cpu_per_second(sampler: Any, seconds: int, pause: float) -> float:
    """ms of process CPU per simulated second, each second advanced after `pause` s."""
    spent = 0.0
    for _ in range(seconds):
        if pause:
            time.sleep(pause)
        cpu0 = time.process_time()
        sampler.advance(1.0)
        spent += time.process_time() - cpu0
    return 1000 * spent / seconds


def wake_alone(seconds: int, pause: float) -> float:
    """ms of process CPU a wake-up costs with no work: `seconds` sleeps of `pause`, the CPU
    taken over the whole loop (the figures above start after each sleep has returned)."""
    cpu0 = time.process_time()
    for _ in range(seconds):
        time.sleep(pause)
    return 1000 * (time.process_time() - cpu0) / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=int, default=60)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--pauses", default="0.1,1",
                        help="wall-clock pauses before each second, comma-separated")
    args = parser.parse_args()
    if args.rounds < 1 or args.seconds < 1:
        parser.error("--rounds and --seconds must be at least 1")
    pauses = [float(p) for p in args.pauses.split(",") if p]
    exporter = manual_fake_exporter()
    sampler = exporter.sampler
    try:
        sampler.advance(WARMUP_SECONDS)
        print(f"run --fake --no-fake.costs on a manual clock, {args.seconds} simulated s a "
              "figure, ms of CPU per simulated second")
        print(f"{'round':>5} {'back to back':>13} " + " ".join(
            f"{f'after {p:g} s':>16}" for p in pauses))
        for number in range(1, args.rounds + 1):
            before = {loop.name: loop.cpu_seconds for loop in sampler.loops}
            hot = cpu_per_second(sampler, args.seconds, 0.0)
            loops = {loop.name: 1000 * (loop.cpu_seconds - before[loop.name]) / args.seconds
                     for loop in sampler.loops}
            cold = [cpu_per_second(sampler, args.seconds, p) for p in pauses]
            print(f"{number:>5} {hot:>13.2f} " + " ".join(
                f"{c:>7.2f} ({c / hot:4.2f}x)" for c in cold))
        print("by loop, back to back (last round): " + ", ".join(
            f"{name} {ms:.2f}" for name, ms in sorted(loops.items(), key=lambda kv: -kv[1])
            if ms >= 0.005))
        print("a wake-up alone (the pause slept, no work): " + ", ".join(
            f"after {p:g} s {wake_alone(args.seconds, p):.3f} ms" for p in pauses))
    finally:
        exporter.stop()


if __name__ == "__main__":
    main()
