"""CPU of the two NVML reading loops (the sweep and the power drain), ours and the fake's.

    python bench/bench_sweep_path.py [--seconds 300] [--runs 5] [--scenario training]
                                     [--profile sweep|power]

`run --fake` on a manual clock with its threads off, ticked by hand (sampler.advance), so
nothing else runs in between and the figures are CPU per simulated second: for the sweep
loop and the power loop, the thread CPU of their ticks, the part of it inside the fake
NVML (its own Python: no call costs are charged, so this is what the fake costs, not the
H200), and the rest (ours: pynvml's wrappers, the backend, the readings, the buffers).
The best of `--runs` runs is printed (the least disturbed by other work on the machine),
and the NVML calls per simulated second by symbol. `--profile` prints cProfile's top
functions of one loop instead. Not a pass/fail test.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time
from typing import Any

from targets import manual_fake_exporter

LOOPS = ("sweep", "power")


def run(seconds: float, scenario: str, warmup: float = 40.0,
        profile: str | None = None) -> dict[str, Any]:
    """One run: the loops' CPU over `seconds` of simulated time after `warmup`."""
    exporter = manual_fake_exporter(scenario)
    lib, sampler = exporter.fake_lib, exporter.sampler
    spent = {name: [0.0, 0.0] for name in LOOPS}  # loop -> [thread CPU, inside the fake]
    profiler = cProfile.Profile() if profile else None
    counting = [False]
    try:
        for loop in sampler.loops:
            if loop.name not in LOOPS:
                continue

            def timed(fn=loop.fn, into=spent[loop.name], name=loop.name) -> None:
                if not counting[0]:
                    fn()
                    return
                inside0, cpu0 = lib.busy_seconds, time.thread_time()
                if profiler is not None and name == profile:
                    profiler.runcall(fn)
                else:
                    fn()
                into[0] += time.thread_time() - cpu0
                into[1] += lib.busy_seconds - inside0

            loop.fn = timed
        sampler.advance(warmup)
        calls0 = dict(lib.calls)
        samples0 = sum(s.samples_total for s in sampler.power.stats().values())
        counting[0] = True
        for _ in range(int(seconds)):
            sampler.advance(1.0)
        counting[0] = False
        samples = sum(s.samples_total for s in sampler.power.stats().values()) - samples0
        calls = {k: (v - calls0.get(k, 0)) / seconds for k, v in lib.calls.items()
                 if v - calls0.get(k, 0)}
        lost = sum(s.lost_total for s in sampler.power.stats().values())
    finally:
        exporter.stop()
    out: dict[str, Any] = {"calls": calls, "samples_per_second": samples / seconds,
                           "lost": lost}
    for name, (cpu, inside) in spent.items():
        out[name] = (cpu / seconds * 1000, inside / seconds * 1000)  # ms per second
    if profiler is not None:
        stats = pstats.Stats(profiler)
        stats.sort_stats("tottime").print_stats(30)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=300.0)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--scenario", default="training")
    parser.add_argument("--profile", choices=LOOPS)
    opts = parser.parse_args()
    if opts.profile:
        run(opts.seconds, opts.scenario, profile=opts.profile)
        return
    results = [run(opts.seconds, opts.scenario) for _ in range(opts.runs)]
    print(f"run --fake --scenario {opts.scenario}, manual clock, {opts.seconds:g} simulated "
          f"s, best of {opts.runs}: ms of CPU per simulated second")
    print(f"  {'loop':<8}{'total':>8}{'ours':>8}{'in fake':>9}")
    for name in LOOPS:
        best = min(results, key=lambda r: r[name][0])
        total, inside = best[name]
        print(f"  {name:<8}{total:8.3f}{total - inside:8.3f}{inside:9.3f}")
    last = results[-1]
    print(f"power samples per second: {last['samples_per_second']:.2f}, lost: {last['lost']}")
    print(f"NVML calls per second ({sum(last['calls'].values()):.1f} in all):")
    for name, rate in sorted(last["calls"].items(), key=lambda kv: (-kv[1], kv[0])):
        print(f"  {name:<45}{rate:7.2f}")


if __name__ == "__main__":
    main()
