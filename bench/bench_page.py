"""What an open live page costs the exporter. Prints figures; not a pass/fail test.

    python bench/bench_page.py [--seconds 30] [--rounds 3] [--pages 1]

One exporter (`run --fake` at defaults: the training scenario, fake NVML costs on, every
analysis on) is measured in alternating phases of `--seconds`: page closed, page open,
closed, open, ... (`--rounds` of each; alternating cancels slow drift on a shared box).
In every phase a Prometheus pair scrapes it (2 scrapes per 15 s, gzip). With the page
open, a client process polls as page.js does: GET /api/v1/power?seconds=60 and GET
/api/v1/findings, the next poll a second after the last began, keep-alive, gzip. The
figure is the exporter process's CPU share (user + system, psutil) with the page open
against closed, as a ratio, measured in one run; the clients run in other processes.
Also: scrape latency, the power loop's schedule and the API's answer times per phase.
"""

from __future__ import annotations

import argparse
import gzip
import http.client
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from timing import median_seconds  # noqa: E402

from exporter.app import Exporter  # noqa: E402
from exporter.cli import tune_interpreter  # noqa: E402
from exporter.config import Config  # noqa: E402
from exporter.web import api  # noqa: E402

PAGE_PATHS = ("/api/v1/power?seconds=60", "/api/v1/findings")
HEADERS = {"Accept-Encoding": "gzip"}

# The page's polling, in its own process so its CPU is not the exporter's: prints one JSON
# line (answer times in ms and bytes per path) when stdin closes.
POLLER = """
import http.client, json, sys, threading, time
port, paths = int(sys.argv[1]), sys.argv[2:]
stats = {p: {"ms": [], "bytes": 0} for p in paths}
done = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), done.set()), daemon=True).start()
conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
while not done.is_set():
    start = time.monotonic()
    for path in paths:
        t0 = time.perf_counter()
        conn.request("GET", path, headers={"Accept-Encoding": "gzip"})
        body = conn.getresponse().read()
        stats[path]["ms"].append((time.perf_counter() - t0) * 1000)
        stats[path]["bytes"] += len(body)
    done.wait(max(0.0, 1.0 - (time.monotonic() - start)))
print(json.dumps(stats))
"""


def _scrape(port: int) -> float:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    t0 = time.perf_counter()
    conn.request("GET", "/metrics", headers=HEADERS)
    conn.getresponse().read()
    conn.close()
    return (time.perf_counter() - t0) * 1000


def _phase(exp: Exporter, seconds: float, pages: int) -> dict:
    """One phase: CPU share of this process (the exporter), scrapes every 7.5 s."""
    pollers = [subprocess.Popen([sys.executable, "-c", POLLER, str(exp.port), *PAGE_PATHS],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
               for _ in range(pages)]
    time.sleep(1.0 if pages else 0.0)  # the pollers' own start is not measured
    proc = psutil.Process()
    power0 = exp.current.snapshot.loops["power"]
    c0, w0 = proc.cpu_times(), time.monotonic()
    scrapes = []
    end = w0 + seconds
    while time.monotonic() < end:
        scrapes.append(_scrape(exp.port))
        time.sleep(min(7.5, max(0.0, end - time.monotonic())))
    c1, w1 = proc.cpu_times(), time.monotonic()
    power1 = exp.current.snapshot.loops["power"]
    answers: dict[str, dict] = {}
    for poller in pollers:
        out, _ = poller.communicate("", timeout=30)
        for path, s in json.loads(out).items():
            mine = answers.setdefault(path, {"ms": [], "bytes": 0})
            mine["ms"] += s["ms"]
            mine["bytes"] += s["bytes"]
    return {"cpu": (c1.user + c1.system - c0.user - c0.system) / (w1 - w0),
            "scrape_ms": scrapes, "answers": answers,
            "overruns": power1.overruns_total - power0.overruns_total,
            "jitter_p99_ms": power1.jitter_p99_seconds * 1000,
            "achieved_hz": power1.achieved_hertz}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=30.0, help="per phase")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--pages", type=int, default=1, help="pages open at once")
    args = parser.parse_args()
    tune_interpreter()  # as `run` does
    exp = Exporter(Config.of(listen_address="127.0.0.1:0", fake=True, collector_infiniband=False))
    exp.start()
    try:
        time.sleep(15)  # buffers fill, the first analyses run
        phases: dict[str, list[dict]] = {"closed": [], "open": []}
        for _ in range(args.rounds):
            phases["closed"].append(_phase(exp, args.seconds, 0))
            phases["open"].append(_phase(exp, args.seconds, args.pages))
        snapshot = exp.current.snapshot
    finally:
        exp.stop()
    _report(phases, args)
    _build_cost(snapshot)


def _build_cost(snapshot) -> None:
    """One /api/v1/power?seconds=60 answer, built as the API does and, for reference in the
    same run, with json.dumps formatting the same rounded numbers."""
    query = api.PowerQuery(60, None)
    body = api.power_body(snapshot, query)
    ours = median_seconds(lambda: api.power_body(snapshot, query), 50)
    zipped = median_seconds(lambda: gzip.compress(body, compresslevel=1, mtime=0), 50)

    def reference() -> bytes:
        parsed = json.loads(body)  # the same rounded numbers, formatted by json.dumps
        return json.dumps(parsed, separators=(",", ":")).encode()

    plain = reference()
    dumps = median_seconds(lambda: json.dumps(json.loads(plain)), 20) - median_seconds(
        lambda: json.loads(plain), 20)
    print(f"  one /api/v1/power?seconds=60 answer ({len(body) / 1024:.0f} KiB): built in "
          f"{ours * 1000:.2f} ms, gzip level 1 {zipped * 1000:.2f} ms; json.dumps of the "
          f"same numbers alone {dumps * 1000:.2f} ms (ours / reference, whole build: "
          f"{ours / dumps:.2f})")


def _report(phases: dict[str, list[dict]], args: argparse.Namespace) -> None:
    cpu = {name: float(np.mean([p["cpu"] for p in runs])) for name, runs in phases.items()}
    print(f"exporter CPU, `run --fake` defaults, {args.rounds} x {args.seconds:.0f} s per "
          f"state, alternating; {args.pages} page(s) polling {' + '.join(PAGE_PATHS)} "
          "every second:")
    for name, runs in phases.items():
        shares = ", ".join(f"{p['cpu'] * 100:.2f}" for p in runs)
        scrapes = np.concatenate([p["scrape_ms"] for p in runs])
        print(f"  page {name:6s} {cpu[name] * 100:6.2f} % of one core (phases: {shares}); "
              f"scrape p50 {np.percentile(scrapes, 50):.2f} ms, max {scrapes.max():.2f} ms; "
              f"power loop overruns {sum(p['overruns'] for p in runs)}, p99 jitter "
              f"{max(p['jitter_p99_ms'] for p in runs):.2f} ms, "
              f"{min(p['achieved_hz'] for p in runs):.2f} Hz")
    extra = cpu["open"] - cpu["closed"]
    print(f"  open / closed = {cpu['open'] / cpu['closed']:.2f}; each open page adds "
          f"{extra / args.pages * 100:.2f} % of one core "
          f"({extra / args.pages * 3600:.0f} CPU-seconds an hour)")
    for path in PAGE_PATHS:
        ms = np.concatenate([p["answers"][path]["ms"] for p in phases["open"]])
        size = sum(p["answers"][path]["bytes"] for p in phases["open"]) / len(ms)
        print(f"  {path:28s} answers {len(ms):4d}: p50 {np.percentile(ms, 50):6.2f} ms, "
              f"p99 {np.percentile(ms, 99):6.2f} ms, {size / 1024:6.1f} KiB gzipped")


if __name__ == "__main__":
    main()
