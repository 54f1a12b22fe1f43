"""Where the exporter's memory goes. Prints figures; not a pass/fail test.

Default: `run --fake` (8 GPUs) over the time its windows take to fill: RSS at start,
once the 660 s power window is full, steady after it and its peak, scraped like a
Prometheus pair; beside it, a bare interpreter importing the same libraries (measured in
the same run).

    python bench/bench_memory.py [--seconds 780] [--scenario gpu-lost] [--every 5]
                                 [--no-costs]   # run --fake --no-fake.costs

The power window is full after 660 s, so --seconds below ~720 measures no steady state.

--imports: the import floor, each line a fresh interpreter's RSS after importing one
library or one part of ours (with what it imports), as a ratio to the bare interpreter's
and to `import numpy`'s measured in the same run.

--data MINUTES: one exporter as `run --fake` builds it, on a manual clock (simulated
time, no sleeping) and scraped every 15 s: the Python memory it holds (tracemalloc)
after each simulated minute, so growth shows, and at the end each structure's bytes
(rings, windows, rendered exposition) and the allocations by the file of ours that made
them, as shares of the total.
"""

from __future__ import annotations

import argparse
import importlib
import os
import statistics
import subprocess
import sys
import time
import tracemalloc
import urllib.request
from collections import Counter

import psutil
from targets import free_port, manual_fake_exporter, scrape, wait_http

WINDOW_SECONDS = 660  # the power ring's history (exporter/sampling/sampler.py)
SCRAPE_SECONDS = 7.5  # two Prometheus servers, each every 15 s, half an interval apart
MIB = 2**20


def _reference_rss() -> int:
    """ru_maxrss of an interpreter that imports what the exporter imports, and no more."""
    ref = subprocess.run([sys.executable, "-c",
                          "import numpy, prometheus_client, pynvml, psutil, yaml, resource;"
                          "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)"],
                         capture_output=True, text=True, check=True)
    return int(ref.stdout) * 1024


def measure(seconds: float, scenario: str, every: float, costs: bool = True
            ) -> tuple[dict[str, float], dict[int, float]]:
    """The RSS figures (MiB), and the RSS at every 5 minutes before the end (minute -> MiB),
    so a step (a fault) tells itself from a creep."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "exporter", "run", "--fake", "--scenario",
                             scenario, "--web.listen-address", f"127.0.0.1:{port}",
                             *([] if costs else ["--no-fake.costs"])],
                            stderr=subprocess.DEVNULL)
    series: list[tuple[float, int]] = []
    try:
        wait_http(port, proc=proc)
        ps = psutil.Process(proc.pid)
        t0 = time.monotonic()
        next_scrape = t0
        while (now := time.monotonic()) - t0 < seconds:
            if now >= next_scrape:
                scrape(port)
                next_scrape += SCRAPE_SECONDS
            series.append((now - t0, ps.memory_info().rss))
            time.sleep(max(0.0, min(every, next_scrape - time.monotonic())))
    finally:
        proc.terminate()
        proc.wait(10)
    start = series[0][1]
    filled = [rss for t, rss in series if t >= WINDOW_SECONDS]
    steady = statistics.median(filled) if filled else float("nan")
    def at(seconds: float) -> float:
        return next(r for t, r in series if t >= seconds) / MIB if (
            series[-1][0] >= seconds) else float("nan")

    return ({"start": start / MIB, "at 60 s": at(60), "at 300 s": at(300),
             "steady": steady / MIB, "max": max(r for _, r in series) / MIB,
             "end": series[-1][1] / MIB},
            {m: at(60 * m) for m in range(5, int(seconds // 60) + 1, 5) if 60 * m < seconds})


# The import floor: libraries, then the parts of ours from the bottom up (each line
# includes what the module imports).
LIBRARIES = ("numpy", "prometheus_client", "pynvml", "psutil", "yaml", "sqlite3", "http.server",
             "numpy,prometheus_client,pynvml,psutil,yaml,sqlite3,http.server")
OURS = ("exporter.config", "exporter.gpu.backend", "exporter.sampling.sampler",
        "exporter.metrics.render", "exporter.health.monitor", "exporter.history.recorder",
        "exporter.web.server", "exporter.sim.fake", "exporter.app", "exporter.cli",
        "exporter.commands.analyze", "exporter.commands.simulate.command")
_RSS_AFTER = ("import importlib, sys\n"
              "for name in sys.argv[1].split(','):\n"
              "    name and importlib.import_module(name)\n"
              "print(next(int(line.split()[1]) for line in open('/proc/self/status')"
              " if line.startswith('VmRSS:')))")


def import_rss(modules: str) -> float:
    """VmRSS (MiB) of a fresh interpreter once it imported the comma-separated modules."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (os.getcwd(), os.environ.get("PYTHONPATH", "")) if p)}
    out = subprocess.run([sys.executable, "-c", _RSS_AFTER, modules], capture_output=True,
                         text=True, check=True, env=env)
    return int(out.stdout) / 1024


def print_imports(rounds: int) -> None:
    measured: dict[str, float] = {}

    def rss(modules: str) -> float:
        # One measurement per line: the numpy row is the reference itself, so it reads 1.00.
        if modules not in measured:
            measured[modules] = statistics.median(import_rss(modules) for _ in range(rounds))
        return measured[modules]

    bare, numpy = rss(""), rss("numpy")
    print(f"import floor (VmRSS of a fresh interpreter, median of {rounds}): bare "
          f"{bare:.1f} MiB, import numpy {numpy:.1f} MiB")
    print(f"  {'imports':<58} {'MiB':>6} {'/bare':>6} {'/numpy':>7}")
    for modules in (*LIBRARIES, *OURS):
        value = rss(modules)
        print(f"  {modules[:58]:<58} {value:6.1f} {value / bare:6.2f} {value / numpy:7.2f}")


def _owner(trace: tracemalloc.Traceback) -> str:
    """The file of ours nearest the allocation (else the library's file)."""
    for frame in reversed(trace):  # most recent first
        if "/exporter/" in frame.filename:
            return "exporter/" + frame.filename.rsplit("/exporter/", 1)[1]
    return trace[-1].filename.rsplit("/site-packages/", 1)[-1]


def _structures(exporter) -> dict[str, int]:
    """Bytes of the structures that grow with GPUs and history, read off the exporter."""
    sampler = exporter.sampler
    out: dict[str, int] = {}
    power = sampler.power.buffer
    if power is not None:
        out["power ring (times + mW)"] = power.nbytes
        # its pages are resident as samples fill them: the slots written so far
        written = sum(min(n, power.capacity) for n in power.count)
        out["  of it written (resident)"] = power.nbytes * written // (
            power.gpus * power.capacity)
    sweep = getattr(sampler.analyses, "sweep_buffer", None)
    if sweep is not None:
        out["sweep window (stragglers)"] = (sweep.times.nbytes + sweep.row_times.nbytes
                                            + sum(v.nbytes for v in sweep.values.values()))
    current = exporter.current
    if current is not None:
        for name in ("_body", "_gzipped"):
            value = getattr(current, name, None)
            if isinstance(value, bytes | bytearray):
                out[f"rendered exposition ({name.strip('_')})"] = len(value)
    return out


def print_data(minutes: float, scenario: str) -> None:
    importlib.import_module("exporter.app")  # before tracing: the data held, not the code
    tracemalloc.start(12)
    exporter = manual_fake_exporter(scenario)
    url = f"http://127.0.0.1:{exporter.port}/metrics"
    print(f"run --fake --scenario {scenario} on a manual clock, scraped every 15 s: Python "
          f"memory held (tracemalloc)")
    try:
        held = []
        for quarter in range(1, int(minutes * 4) + 1):
            exporter.sampler.advance(15)
            with urllib.request.urlopen(url) as reply:
                reply.read()
            if quarter % 4 == 0:
                held.append(tracemalloc.get_traced_memory()[0])
                print(f"  {quarter // 4:4d} min  {held[-1] / MIB:6.2f} MiB  "
                      f"({held[-1] / held[0]:.2f} x minute 1)")
        snap = tracemalloc.take_snapshot()
        total = sum(stat.size for stat in snap.statistics("filename"))
        print(f"structures after {minutes:g} min (share of the {total / MIB:.2f} MiB held):")
        for name, size in _structures(exporter).items():
            print(f"  {name:<40} {size / MIB:6.2f} MiB {size / total:6.1%}")
        owners: Counter[str] = Counter()
        for stat in snap.statistics("traceback"):
            owners[_owner(stat.traceback)] += stat.size
        print("allocations by the file of ours that made them:")
        for owner, size in owners.most_common(20):
            print(f"  {owner[-60:]:<60} {size / MIB:6.2f} MiB {size / total:6.1%}")
    finally:
        exporter.stop()
        tracemalloc.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=WINDOW_SECONDS + 120)
    parser.add_argument("--scenario", default="training")
    parser.add_argument("--every", type=float, default=5.0, help="RSS sample interval (s)")
    parser.add_argument("--no-costs", action="store_true",
                        help="run --fake --no-fake.costs (the fake charges no NVML call)")
    parser.add_argument("--imports", action="store_true", help="the import floor, by part")
    parser.add_argument("--rounds", type=int, default=3, help="--imports: runs per line")
    parser.add_argument("--data", type=float, metavar="MINUTES",
                        help="Python memory by structure after MINUTES of simulated time")
    args = parser.parse_args()
    if args.imports:
        print_imports(args.rounds)
        return
    if args.data is not None:
        print_data(args.data, args.scenario)
        return
    ours, by_five = measure(args.seconds, args.scenario, args.every, costs=not args.no_costs)
    ref = _reference_rss() / MIB
    costs = " --no-fake.costs" if args.no_costs else ""
    print(f"run --fake{costs} --scenario {args.scenario}, {args.seconds:g} s, scraped every "
          f"{SCRAPE_SECONDS:g} s:")
    print("  RSS " + ", ".join(f"{k} {v:.1f} MiB" for k, v in ours.items())
          + f" (steady: median once the {WINDOW_SECONDS} s power window is full)")
    if by_five:
        print("  RSS every 5 minutes: " + ", ".join(
            f"{m} min {v:.1f}" for m, v in by_five.items()) + " MiB")
    print(f"  reference: a bare interpreter importing the same libraries {ref:.1f} MiB -> "
          f"steady / reference = {ours['steady'] / ref:.2f}, start / reference = "
          f"{ours['start'] / ref:.2f}")


if __name__ == "__main__":
    main()
