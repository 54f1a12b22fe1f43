"""Memory of `run --fake` (8 GPUs) over the time its windows take to fill: RSS at start,
once the 660 s power window is full, and steady after it, scraped like a Prometheus
pair; beside it, a bare interpreter importing the same libraries (measured in the same
run). Prints figures; not a pass/fail test.

    python bench/bench_memory.py [--seconds 780] [--scenario faults] [--every 5]

The power window is full after 660 s, so --seconds below ~720 measures no steady state.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

import psutil
from targets import free_port, scrape, wait_http

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


def measure(seconds: float, scenario: str, every: float) -> dict[str, float]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "exporter", "run", "--fake", "--scenario",
                             scenario, "--web.listen-address", f"127.0.0.1:{port}"],
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
    return {"start": start / MIB, "at 60 s": next(r for t, r in series if t >= 60) / MIB
            if series[-1][0] >= 60 else float("nan"),
            "steady": steady / MIB, "max": max(r for _, r in series) / MIB,
            "end": series[-1][1] / MIB}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=WINDOW_SECONDS + 120)
    parser.add_argument("--scenario", default="training")
    parser.add_argument("--every", type=float, default=5.0, help="RSS sample interval (s)")
    args = parser.parse_args()
    ours = measure(args.seconds, args.scenario, args.every)
    ref = _reference_rss() / MIB
    print(f"run --fake --scenario {args.scenario}, {args.seconds:g} s, scraped every "
          f"{SCRAPE_SECONDS:g} s:")
    print("  RSS " + ", ".join(f"{k} {v:.1f} MiB" for k, v in ours.items())
          + f" (steady: median once the {WINDOW_SECONDS} s power window is full)")
    print(f"  reference: a bare interpreter importing the same libraries {ref:.1f} MiB -> "
          f"steady / reference = {ours['steady'] / ref:.2f}, start / reference = "
          f"{ours['start'] / ref:.2f}")


if __name__ == "__main__":
    main()
