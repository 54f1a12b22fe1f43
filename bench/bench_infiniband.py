"""Cost of reading every InfiniBand counter of an 8-HCA node, against references.

Builds an 8-HCA sysfs tree in a temporary directory (one port each, ~30 counters in
counters/ + counters_ext/ and ~40 in hw_counters/, as on a ConnectX-7), then times:

- ``InfinibandCollector.read()`` (list + read + parse everything),
- reference A: a plain ``open(f).read()`` of the same files (no listing, no parsing),
- reference B: ``os.open``/``os.read``/``os.close`` of the same files (the syscall floor),
- rendering: ``infiniband_families`` + ``generate_latest`` of one reading,
- reference C (if installed): node_exporter 1.5 scraping the same tree, both the HTTP
  round trip and its own ``node_scrape_collector_duration_seconds{collector="infiniband"}``.

Usage: ``PYTHONPATH=. python bench/bench_infiniband.py [--reads 1000] [--hcas 8]``.
A tmpfs tree is faster than real sysfs (where each read goes to the driver, and
hw_counters may query firmware), so treat the figures as the exporter's own cost.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from exporter.collectors.infiniband.families import infiniband_families
from exporter.collectors.infiniband.reading import InfinibandCollector
from exporter.sim import ib_tree


def timings(fn: Callable[[], object], n: int) -> list[float]:
    fn()  # warm up
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def summary(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return statistics.median(ordered), ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


def node_exporter_times(tree: Path, n: int) -> tuple[list[float], list[float]] | None:
    binary = shutil.which("prometheus-node-exporter") or shutil.which("node_exporter")
    if binary is None:
        return None
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [
            binary,
            f"--path.sysfs={tree}",
            "--collector.disable-defaults",
            "--collector.infiniband",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        deadline = time.monotonic() + 15
        while True:
            try:
                urllib.request.urlopen(url, timeout=5).read()  # noqa: S310 (loopback)
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    return None
                time.sleep(0.05)
        http, collector = [], []
        for _ in range(n):
            t0 = time.perf_counter()
            body = urllib.request.urlopen(url, timeout=5).read().decode()  # noqa: S310
            http.append(time.perf_counter() - t0)
            for fam in text_string_to_metric_families(body):
                for s in fam.samples:
                    if (
                        s.name == "node_scrape_collector_duration_seconds"
                        and s.labels.get("collector") == "infiniband"
                    ):
                        collector.append(s.value)
        return http, collector
    finally:
        proc.kill()
        proc.wait(timeout=10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reads", type=int, default=1000)
    parser.add_argument("--hcas", type=int, default=8)
    parser.add_argument("--scrapes", type=int, default=200)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="cte-ib-bench-") as tmp:
        tree = Path(tmp)
        ib_tree.bench_tree(tree, args.hcas)
        files = ib_tree.files_under(tree)
        source = InfinibandCollector(tree)
        reading = source.read()
        ports = [p for d in reading.devices for p in d.ports]
        values = sum(len(p.counters) + len(p.counters_ext) + len(p.hw_counters) for p in ports)

        def plain_read() -> None:
            for f in files:
                with open(f) as fh:
                    fh.read()

        def os_read() -> None:
            for f in files:
                fd = os.open(f, os.O_RDONLY)
                os.read(fd, 4096)
                os.close(fd)

        class Collector:
            def collect(self):  # type: ignore[no-untyped-def]
                return infiniband_families(reading)

        registry = CollectorRegistry()
        registry.register(Collector())

        ours = summary(timings(source.read, args.reads))
        ref_a = summary(timings(plain_read, args.reads))
        ref_b = summary(timings(os_read, args.reads))
        render = summary(timings(lambda: generate_latest(registry), args.reads // 4))
        ne = node_exporter_times(tree, args.scrapes)

    ms = 1000.0
    print(
        f"tree: {args.hcas} HCAs, {len(ports)} ports, {len(files)} files, {values} counter values"
    )
    print(f"python {sys.version.split()[0]}, {args.reads} reads each; median / p99")
    print(f"InfinibandCollector.read()        {ours[0] * ms:7.3f} ms / {ours[1] * ms:7.3f} ms")
    print(
        f"ref A: open().read() per file  {ref_a[0] * ms:7.3f} ms / {ref_a[1] * ms:7.3f} ms"
        f"   ratio ours/A = {ours[0] / ref_a[0]:.2f}"
    )
    print(
        f"ref B: os.open/read/close      {ref_b[0] * ms:7.3f} ms / {ref_b[1] * ms:7.3f} ms"
        f"   ratio ours/B = {ours[0] / ref_b[0]:.2f}"
    )
    print(f"render (families + exposition) {render[0] * ms:7.3f} ms / {render[1] * ms:7.3f} ms")
    if ne is None:
        print("ref C: node_exporter not installed; skipped")
        return
    http, collector = (summary(x) for x in ne)
    print(
        f"ref C: node_exporter scrape    {http[0] * ms:7.3f} ms / {http[1] * ms:7.3f} ms"
        f"   ratio ours/C = {ours[0] / http[0]:.2f} (HTTP round trip, {args.scrapes} scrapes)"
    )
    print(
        f"       its infiniband collector {collector[0] * ms:6.3f} ms / {collector[1] * ms:7.3f} ms"
        f"   ratio ours/C' = {ours[0] / collector[0]:.2f} (self-reported)"
    )


if __name__ == "__main__":
    main()
