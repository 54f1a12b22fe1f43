"""Exporter benchmarks (issue: core). Prints figures and ratios; not a pass/fail test.

    python bench/bench_exporter.py cpu [--seconds 60]
    python bench/bench_exporter.py scrape [--seconds 10] [--scrapers 10]
    python bench/bench_exporter.py sampling [--seconds 10]
    python bench/bench_exporter.py rss [--seconds 600]

Each figure is printed next to a reference measured in the same run.
"""

from __future__ import annotations

import argparse
import http.client
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from exporter.app import Exporter  # noqa: E402
from exporter.config import Config  # noqa: E402
from exporter.gpu.backend import NvmlBackend  # noqa: E402
from exporter.gpu.state import read_power, read_state  # noqa: E402
from exporter.sampling.sampler import Sampler, SamplerSettings  # noqa: E402
from exporter.sim import fake  # noqa: E402
from exporter.sim.scenarios import load_scenario  # noqa: E402


def cpu(seconds: float) -> None:
    """CPU-seconds per wall-second of the whole exporter at defaults, fake's share apart."""
    exp = Exporter(Config(listen_address="127.0.0.1:0", fake=True, collector_infiniband=False))
    exp.start()
    time.sleep(2)
    lib = exp.fake_lib
    proc = psutil.Process()
    c0, f0, w0 = proc.cpu_times(), lib.busy_seconds, time.monotonic()
    # scraped like a Prometheus pair would: two scrapers, every 15 s, gzip
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for _ in range(2):
            conn = http.client.HTTPConnection("127.0.0.1", exp.port, timeout=10)
            conn.request("GET", "/metrics", headers=HEADERS)
            conn.getresponse().read()
            conn.close()
        time.sleep(min(15.0, max(0.0, end - time.monotonic())))
    c1, f1, w1 = proc.cpu_times(), lib.busy_seconds, time.monotonic()
    loops = {loop.name: loop.cpu_seconds for loop in exp.sampler._loops}
    exp.stop()
    wall = w1 - w0
    total = (c1.user + c1.system - c0.user - c0.system) / wall
    fake_share = (f1 - f0) / wall
    ours = total - fake_share

    # Reference, same run: the bare pynvml calls the loops make (20 Hz power + 1 Hz sweep
    # of 8 GPUs), timed in a tight loop, i.e. the floor any NVML exporter pays at this rate.
    with fake.installed(load_scenario("training")) as ref_lib:
        backend = NvmlBackend()
        n = backend.open()
        t0, fk0 = time.process_time(), ref_lib.busy_seconds
        for _ in range(200):
            for gpu in range(n):
                read_power(backend, gpu)
        power_cost = (time.process_time() - t0 - (ref_lib.busy_seconds - fk0)) / 200
        t0, fk0 = time.process_time(), ref_lib.busy_seconds
        for _ in range(20):
            for gpu in range(n):
                read_state(backend, gpu)
        sweep_cost = (time.process_time() - t0 - (ref_lib.busy_seconds - fk0)) / 20
        backend.close()
    floor = power_cost * 20 + sweep_cost * 1
    print(f"cpu over {wall:.0f} s at 20 Hz power, 1 s sweep, 8 GPUs, scraped twice per 15 s:")
    print(f"  whole process      {total * 100:6.2f} % of one core")
    print(f"  inside the fake    {fake_share * 100:6.2f} % (simulated driver, not ours)")
    print(f"  ours               {ours * 100:6.2f} %   (target <= 1 %)")
    print("  by thread since start (incl. the fake's share): " + ", ".join(
        f"{name} {cpu_s:.2f} s" for name, cpu_s in loops.items()))
    print(f"  reference: bare pynvml calls at the same rates {floor * 100:.2f} % "
          f"-> ours / reference = {ours / floor:.2f}")


def _reference_server(port: int) -> subprocess.Popen:
    """prometheus_client's own server, calling generate_latest on every scrape."""
    code = f"""
import time
from prometheus_client import start_http_server, REGISTRY
from exporter.app import Exporter
from exporter.config import Config
from exporter.metrics.render import _Families, FAMILY_SOURCES
exp = Exporter(Config(listen_address='127.0.0.1:0', fake=True, collector_infiniband=False))
exp.start()
class PerScrape:
    def collect(self):
        yield from _Families(exp.current.snapshot, FAMILY_SOURCES).collect()
for c in list(REGISTRY._collector_to_names):
    REGISTRY.unregister(c)
REGISTRY.register(PerScrape())
start_http_server({port}, addr='127.0.0.1')
time.sleep(3600)
"""
    return subprocess.Popen([sys.executable, "-c", code])


def _exporter_server(port: int) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "exporter", "run", "--fake",
                             "--no-collector.infiniband", "--web.listen-address",
                             f"127.0.0.1:{port}"], stderr=subprocess.DEVNULL)


# What Prometheus sends.
HEADERS = {"Accept-Encoding": "gzip",
           "Accept": "application/openmetrics-text;version=1.0.0;q=0.5,text/plain;q=0.4"}


def _load(port: int, seconds: float, scrapers: int, pause: float = 0.0) -> list[float]:
    latencies: list[float] = []
    lock = threading.Lock()
    stop = time.monotonic() + seconds

    def worker() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        mine = []
        while time.monotonic() < stop:
            t0 = time.perf_counter()
            conn.request("GET", "/metrics", headers=HEADERS)
            resp = conn.getresponse()
            resp.read()
            mine.append(time.perf_counter() - t0)
            if pause:
                time.sleep(pause)
            if resp.getheader("Connection", "").lower() == "close":
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        with lock:
            latencies.extend(mine)

    threads = [threading.Thread(target=worker) for _ in range(scrapers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return latencies


def _wait_port(port: int) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
            conn.request("GET", "/metrics")
            if conn.getresponse().status == 200:
                return
        except OSError:
            time.sleep(0.2)
    raise SystemExit(f"server on {port} did not start")


def scrape(seconds: float, scrapers: int) -> None:
    """Two loads: back-to-back (saturating: 2 cores shared by server and clients) and paced
    (each scraper 10 scrapes/s, far above any real Prometheus)."""
    for label, pause in (("back-to-back", 0.0), ("paced, 0.1 s between scrapes", 0.1)):
        results = {}
        print(f"{scrapers} concurrent scrapers, {label}, {seconds:.0f} s, gzip accepted:")
        for name, start, port in (("ours (cached bytes)", _exporter_server, 19961),
                                  ("reference: generate_latest per scrape", _reference_server,
                                   19962)):
            proc = start(port)
            try:
                _wait_port(port)
                time.sleep(2)
                lat = np.array(_load(port, seconds, scrapers, pause)) * 1000
            finally:
                proc.terminate()
                proc.wait(10)
            results[name] = lat
            print(f"  {name:40s} scrapes {len(lat):6d}  p50 {np.percentile(lat, 50):7.2f} ms"
                  f"  p99 {np.percentile(lat, 99):7.2f} ms")
        ours, ref = results.values()
        print(f"  ours/reference: p50 {np.percentile(ours, 50) / np.percentile(ref, 50):.2f}, "
              f"p99 {np.percentile(ours, 99) / np.percentile(ref, 99):.2f}, "
              f"scrapes {len(ours) / len(ref):.2f}x (target p99 <= 5 ms)")


def sampling(seconds: float) -> None:
    print(f"power loop, 8 GPUs, {seconds:.0f} s per rate:")
    for hz in (20, 50, 100, 200):
        if hz > 100:
            break
        with fake.installed(load_scenario("training")):
            sampler = Sampler(NvmlBackend(), SamplerSettings(power_hertz=hz, backend="fake"))
            sampler.start()
            time.sleep(1)
            n0 = sampler.power_loop.iterations
            t0 = time.monotonic()
            time.sleep(seconds)
            n1 = sampler.power_loop.iterations
            stats = sampler.power_loop.stats()
            sampler.stop()
        achieved = (n1 - n0) / (time.monotonic() - t0)
        ok = achieved >= 0.99 * hz and stats.jitter_p99_seconds <= 0.005
        print(f"  {hz:4d} Hz: achieved {achieved:7.2f} Hz ({achieved / hz * 100:5.1f} %), "
              f"p99 jitter {stats.jitter_p99_seconds * 1000:5.2f} ms, overruns "
              f"{stats.overruns_total}  {'holds' if ok else 'DOES NOT HOLD'}")
    # Reference, same run: a naive time.sleep(period) loop doing nothing, which drifts.
    period, n = 0.05, int(seconds * 20)
    t0 = time.monotonic()
    for _ in range(n):
        time.sleep(period)
    naive = n / (time.monotonic() - t0)
    print(f"  reference: a bare time.sleep(1/20) loop achieves {naive:.2f} Hz "
          f"({naive / 20 * 100:.1f} %): the deadline schedule does not drift like it")


def rss(seconds: float) -> None:
    proc = _exporter_server(19963)
    try:
        _wait_port(19963)
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
    print(f"RSS at start {start / 2**20:.1f} MiB, after {seconds:.0f} s {end / 2**20:.1f} MiB "
          f"(max seen {max(samples) / 2**20:.1f} MiB)")
    print(f"reference: a bare interpreter importing the same libraries {ref_rss / 2**20:.1f} MiB"
          f" -> ours / reference = {end / ref_rss:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("what", choices=["cpu", "scrape", "sampling", "rss"])
    parser.add_argument("--seconds", type=float)
    parser.add_argument("--scrapers", type=int, default=10)
    args = parser.parse_args()
    if args.what == "cpu":
        cpu(args.seconds or 60)
    elif args.what == "scrape":
        scrape(args.seconds or 10, args.scrapers)
    elif args.what == "sampling":
        sampling(args.seconds or 10)
    else:
        rss(args.seconds or 600)


if __name__ == "__main__":
    main()
