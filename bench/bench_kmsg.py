"""Reading a long kernel log: how long, and what /metrics and /readyz answer meanwhile.

    python bench/bench_kmsg.py [--records 100000] [--every 0.1]

Writes a kernel log (a regular file standing in for /dev/kmsg) of `--records` XID lines
on the fake's eight GPUs, one every 10 ms, starts `run --fake` with a state directory
on it, and scrapes /metrics and /readyz every `--every` s: before the log is read
(`cte_kmsg_xids_total` 0), while it is read, and after. Prints the time the read took,
the process's CPU-seconds over it, and the scrape latencies of each phase (median, 99th
percentile, max) with their ratio to the phase before. Not a pass/fail test.
"""

from __future__ import annotations

import argparse
import http.client
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
from targets import free_port, wait_http

# The fake's GPUs sit on these PCI buses (exporter/sim/physics.py), in index order.
FAKE_BUSES = (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)
BOOT_ID = "7d1c9a52-0b7e-4a33-9b1a-0c5a0f00b0be"


def write_log(path: Path, records: int) -> None:
    with path.open("w") as f:
        f.write("6,0,0,-;Linux version 6.8.0\n")
        for i in range(1, records + 1):
            bus = FAKE_BUSES[i % len(FAKE_BUSES)]
            f.write(f"3,{i},{i * 10_000},-;NVRM: Xid (PCI:0000:{bus:02x}:00): 13, pid={i}, "
                    "name=python, Graphics SM Warp Exception\n")


def get(port: int, path: str) -> tuple[float, int, bytes]:
    """(seconds, status, body) of one request; status 0 when it failed."""
    started = time.monotonic()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        body = resp.read()
        status = resp.status
    except OSError:
        body, status = b"", 0
    finally:
        conn.close()
    return time.monotonic() - started, status, body


def xids_read(body: bytes) -> float:
    for line in body.splitlines():
        if line.startswith(b"cte_kmsg_xids_total "):
            return float(line.split()[1])
    return 0.0


def summary(latencies: list[float]) -> str:
    if not latencies:
        return "no scrapes"
    ordered = sorted(latencies)
    p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
    return (f"{len(ordered)} scrapes, median {1000 * statistics.median(ordered):.1f} ms, "
            f"p99 {1000 * p99:.1f} ms, max {1000 * ordered[-1]:.1f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--every", type=float, default=0.1, help="scrape interval (s)")
    parser.add_argument("--after", type=float, default=5.0, help="seconds scraped after")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        write_log(d / "kmsg", args.records)
        (d / "boot_id").write_text(BOOT_ID + "\n")
        port = free_port()
        proc = subprocess.Popen(
            [sys.executable, "-m", "exporter", "run", "--fake", "--no-collector.host",
             "--no-collector.infiniband", "--web.listen-address", f"127.0.0.1:{port}",
             "--storage.path", str(d / "state"), "--storage.kmsg-path", str(d / "kmsg"),
             "--storage.boot-id-path", str(d / "boot_id")],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        phases: dict[str, list[float]] = {"before": [], "reading": [], "after": []}
        not_ready = 0
        try:
            wait_http(port, proc=proc)
            ps = psutil.Process(proc.pid)
            began = ended = cpu_began = cpu_ended = None
            while True:
                seconds, status, body = get(port, "/metrics")
                ready_seconds, ready_status, ready = get(port, "/readyz")
                read = xids_read(body)
                now = time.monotonic()
                cpu = sum(ps.cpu_times()[:2])
                if read == 0 and began is None:
                    phases["before"].append(seconds)
                elif read < args.records:
                    if began is None:
                        began, cpu_began = now, cpu
                    phases["reading"].append(seconds)
                    not_ready += ready_status != 200 or b"stalled" in ready
                else:
                    if ended is None:
                        ended, cpu_ended = now, cpu
                        began = began or now
                        cpu_began = cpu_began if cpu_began is not None else cpu
                    phases["after"].append(seconds)
                    if now - ended >= args.after:
                        break
                time.sleep(args.every)
        finally:
            proc.terminate()
            proc.wait(10)
    print(f"kernel log of {args.records:,} XID records, read by run --fake "
          f"(pid {proc.pid}, {os.cpu_count()} CPUs here):")
    print(f"  read in about {ended - began:.1f} s (between the scrapes that saw it begin and "
          f"end), {cpu_ended - cpu_began:.1f} CPU-seconds of the whole process")
    base = statistics.median(phases["before"]) if phases["before"] else float("nan")
    for name, latencies in phases.items():
        ratio = (f"; median / before = {statistics.median(latencies) / base:.2f}"
                 if latencies and name != "before" else "")
        print(f"  /metrics {name}: {summary(latencies)}{ratio}")
    print(f"  /readyz not ok or 'stalled' while reading: {not_ready} time(s)")


if __name__ == "__main__":
    main()
