"""Exporter benchmarks: scrape latency, sampling rates, memory. Prints figures and ratios
against references measured in the same run; not a pass/fail test.

    python bench/bench_exporter.py scrape [--seconds 10] [--scrapers 10]
    python bench/bench_exporter.py sampling [--seconds 10]
    python bench/bench_exporter.py rss [--seconds 600]

CPU share (ours, nvitop-exporter, node_exporter side by side) is bench/bench_cpu.py.
"""

from __future__ import annotations

import argparse
import dataclasses
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import psutil
from targets import TargetDown, free_port, scrape, start_node_exporter, wait_http

from exporter.gpu.backend import NvmlBackend
from exporter.sampling.sampler import Sampler, SamplerSettings
from exporter.sim import fake
from exporter.sim.scenarios import Scenario, load_scenario

# -- scrape latency -----------------------------------------------------------------------


def serve_generate_latest(port: int) -> None:
    """The reference server (run in a child): prometheus_client's own HTTP server with a
    collector that builds the same families on every scrape, as a conventional exporter
    does (ours renders once per snapshot and serves cached bytes)."""
    from prometheus_client import CollectorRegistry, start_http_server

    from exporter.app import Exporter
    from exporter.config import build_config
    from exporter.metrics.render import FAMILY_FUNCTIONS

    exp = Exporter(build_config(None, {"listen_address": "127.0.0.1:0", "fake": True,
                                       "collector_infiniband": False}))
    exp.start()

    class PerScrape:
        def collect(self) -> Iterator[Any]:
            assert exp.current is not None
            snapshot = exp.current.snapshot
            for source in FAMILY_FUNCTIONS:
                yield from source(snapshot)

    registry = CollectorRegistry()
    registry.register(PerScrape())  # type: ignore[arg-type]
    start_http_server(port, addr="127.0.0.1", registry=registry)
    threading.Event().wait()


def _ours(port: int) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "exporter", "run", "--fake",
                             "--no-collector.infiniband", "--web.listen-address",
                             f"127.0.0.1:{port}"], stderr=subprocess.DEVNULL)


def _generate_latest(port: int) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, __file__, "serve-generate-latest",
                             "--port", str(port)], stderr=subprocess.DEVNULL)


def _load(port: int, seconds: float, scrapers: int, pause: float) -> list[float]:
    """`scrapers` clients, each on one keep-alive connection, `pause` s between scrapes."""
    import http.client

    latencies: list[float] = []
    lock = threading.Lock()
    stop = time.monotonic() + seconds

    def worker() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        mine = []
        while time.monotonic() < stop:
            try:
                mine.append(scrape(port, conn)[0])
            except (OSError, http.client.HTTPException):
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            if pause:
                time.sleep(pause)
        conn.close()
        with lock:
            latencies.extend(mine)

    threads = [threading.Thread(target=worker) for _ in range(scrapers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return latencies


SCRAPE_TARGETS: dict[str, Callable[[int], subprocess.Popen]] = {
    "ours (run --fake)": _ours,
    "ref: generate_latest per scrape": _generate_latest,
    "ref: node_exporter (cpu, meminfo)": start_node_exporter,
}


def _measure_target(start: Callable[[int], subprocess.Popen], seconds: float, scrapers: int,
                    pause: float) -> np.ndarray | None:
    port = free_port()
    try:
        proc = start(port)
    except FileNotFoundError as exc:
        print(f"  skipped: {exc}")
        return None
    try:
        wait_http(port, proc=proc)
        time.sleep(2)  # past start-up: the first snapshots, the first renders
        return np.array(_load(port, seconds, scrapers, pause)) * 1000
    except TargetDown as exc:
        print(f"  skipped: {exc}")
        return None
    finally:
        proc.terminate()
        proc.wait(10)


# (label, scrapers, pause between one scraper's scrapes, least seconds)
LOADS = (
    # Every scrape lands on a snapshot no one has scraped yet, as each of Prometheus'
    # scrapes does at a 15 s interval (snapshots are published every second): ours pays
    # the render here, once per snapshot; the cached-bytes path is the two loads below.
    ("1 scraper, 1.1 s between scrapes (each one a fresh snapshot)", 1, 1.1, 30.0),
    ("paced, 0.1 s between scrapes", 0, 0.1, 0.0),
    ("back-to-back", 0, 0.0, 0.0),
)


def scrape_bench(seconds: float, scrapers: int) -> None:
    """Three loads per target, each target in its own process, one after the other: fresh
    snapshots (what Prometheus sees), paced (each scraper every 0.1 s, far above any real
    Prometheus) and back-to-back (saturating: two cores shared by server and clients)."""
    for label, clients, pause, least in LOADS:
        clients, window = clients or scrapers, max(seconds, least)
        print(f"{clients} concurrent scraper(s), {label}, {window:g} s, gzip accepted:")
        results: dict[str, np.ndarray] = {}
        for name, start in SCRAPE_TARGETS.items():
            lat = _measure_target(start, window, clients, pause)
            if lat is None or not len(lat):
                continue
            results[name] = lat
            print(f"  {name:34s} scrapes {len(lat):6d}  p50 {np.percentile(lat, 50):7.2f} ms"
                  f"  p99 {np.percentile(lat, 99):7.2f} ms")
        ours = results.get("ours (run --fake)")
        for name, ref in results.items():
            if ours is None or ref is ours:
                continue
            print(f"  ours / {name[5:]}: p50 {np.percentile(ours, 50) / np.percentile(ref, 50):.2f}"
                  f", p99 {np.percentile(ours, 99) / np.percentile(ref, 99):.2f}, "
                  f"scrapes {len(ours) / len(ref):.2f}x")


# -- sampling rates ------------------------------------------------------------------------


@dataclasses.dataclass
class Window:
    """A sampler run on the fake (stopped by now) and what it did in the measured window."""

    sampler: Sampler
    iterations: dict[str, int]  # per loop, in the window
    samples_per_gpu: float  # power samples stored per GPU, in the window
    wall: float

    def loop_line(self, name: str) -> str:
        loop = self.sampler.loop(name)
        assert loop is not None
        stats = loop.stats()
        achieved = self.iterations[name] / self.wall
        return (f"{name} loop {achieved:6.2f} Hz of {loop.hertz:g} "
                f"({achieved * loop.period * 100:5.1f} %), p99 lateness "
                f"{stats.jitter_p99_seconds * 1000:5.2f} ms, overruns {stats.overruns_total}")


def _run_sampler(scenario: Scenario, settings: SamplerSettings, seconds: float) -> Window:
    """Sample for `seconds` after 1 s of warm-up, on the fake with H200 costs, in threads."""
    with fake.installed(scenario):
        sampler = Sampler(NvmlBackend(), settings)
        sampler.start()
        time.sleep(1)
        loops0 = {loop.name: loop.iterations for loop in sampler.loops}
        samples0 = sum(s.samples_total for s in sampler.power.stats().values())
        t0 = time.monotonic()
        time.sleep(seconds)
        wall = time.monotonic() - t0
        samples = sum(s.samples_total for s in sampler.power.stats().values()) - samples0
        loops = {loop.name: loop.iterations - loops0[loop.name] for loop in sampler.loops}
        sampler.stop()
    return Window(sampler, loops, samples / max(1, sampler.gpu_count), wall)


def sampling(seconds: float) -> None:
    scenario = load_scenario("training")
    print(f"8-GPU fake (training), H200 call costs on, {seconds:g} s each:")
    run = _run_sampler(scenario, SamplerSettings(backend="fake"), seconds)
    power = run.sampler.power
    lost = sum(s.lost_total for s in power.stats().values())
    print(f"  driver's sample buffer, drained every {power.drain_interval:g} s: "
          f"{run.samples_per_gpu / run.wall:.1f} samples/s per GPU, lost {lost}, "
          f"observable band 0-{power.band()[1]:.1f} Hz")
    for name in ("power", "sweep"):
        print(f"    {run.loop_line(name)}")
    # Where the driver keeps no buffer, the instant field is polled at --power.sample-rate.
    no_buffer = dataclasses.replace(
        scenario, device=dataclasses.replace(scenario.device, power_sample_buffer=0))
    for hz in (20, 50, 100):
        settings = SamplerSettings(backend="fake", power_sample_rate_hz=hz)
        run = _run_sampler(no_buffer, settings, seconds)
        print(f"  polled at {hz:3d} Hz (no buffer): {run.loop_line('power')}, "
              f"{run.samples_per_gpu / run.wall:.1f} samples/s per GPU, "
              f"band 0-{run.sampler.power.band()[1]:.1f} Hz")
    # Reference, same run: a naive time.sleep(period) loop doing nothing, which drifts.
    period, n = 0.05, int(seconds * 20)
    t0 = time.monotonic()
    for _ in range(n):
        time.sleep(period)
    naive = n / (time.monotonic() - t0)
    print(f"  reference: a bare time.sleep(1/20) loop achieves {naive:.2f} Hz "
          f"({naive / 20 * 100:.1f} %): the deadline schedule does not drift like it")


# -- memory --------------------------------------------------------------------------------


def rss(seconds: float) -> None:
    port = free_port()
    proc = _ours(port)
    try:
        wait_http(port, proc=proc)
        ps = psutil.Process(proc.pid)
        start = ps.memory_info().rss
        t0 = time.monotonic()
        samples = []
        while time.monotonic() - t0 < seconds:
            time.sleep(min(30, seconds / 10))
            samples.append(ps.memory_info().rss)
        end = ps.memory_info().rss
    finally:
        proc.terminate()
        proc.wait(10)
    ref = subprocess.run([sys.executable, "-c",
                          "import numpy, prometheus_client, pynvml, psutil, yaml, resource;"
                          "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)"],
                         capture_output=True, text=True, check=True)
    ref_rss = int(ref.stdout) * 1024
    print(f"RSS at start {start / 2**20:.1f} MiB, after {seconds:g} s {end / 2**20:.1f} MiB "
          f"(max seen {max(samples) / 2**20:.1f} MiB)")
    print(f"reference: a bare interpreter importing the same libraries {ref_rss / 2**20:.1f} MiB"
          f" -> ours / reference = {end / ref_rss:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=["scrape", "sampling", "rss", "serve-generate-latest"])
    parser.add_argument("--seconds", type=float)
    parser.add_argument("--scrapers", type=int, default=10)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.what == "scrape":
        scrape_bench(args.seconds or 10, args.scrapers)
    elif args.what == "sampling":
        sampling(args.seconds or 10)
    elif args.what == "rss":
        rss(args.seconds or 600)
    else:
        serve_generate_latest(args.port)


if __name__ == "__main__":
    main()
