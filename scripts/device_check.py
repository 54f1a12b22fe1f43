"""Check the exporter on a real GPU node and measure what REFERENCE.md leaves unverified.

    python scripts/device_check.py [--seconds 20] [--json OUT] [--fake]

1. Per-call NVML latency (p50/p99) of every call the exporter makes.
2. The update period of the instant-power field (poll fast, smallest interval between
   changes, as Zeus does) and the observable band it implies.
3. Runs the exporter on real NVML (or --fake), scrapes /metrics twice and checks that
   every GPU metric in docs/metrics.md is present for every GPU and sane.
Prints a report; exits 1 if a check failed. Needs nothing beyond the package.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pynvml
from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from exporter.app import Exporter  # noqa: E402
from exporter.config import Config  # noqa: E402
from exporter.gpu.backend import NvmlBackend  # noqa: E402
from exporter.sim import fake  # noqa: E402
from exporter.sim.scenarios import load_scenario  # noqa: E402

DOCS = Path(__file__).resolve().parent.parent / "docs" / "metrics.md"
# Families a GPU may lack without being wrong (fanless SXM boards, no HBM sensor).
OPTIONAL = {"gpu_fan_speed_ratio", "gpu_memory_temperature_celsius"}
SANE = {  # family -> (low, high) for every sample
    "gpu_power_watts": (0, 1500), "gpu_power_average_watts": (0, 1500),
    "gpu_temperature_celsius": (0, 120), "gpu_memory_temperature_celsius": (0, 130),
    "gpu_utilization_ratio": (0, 1), "gpu_memory_utilization_ratio": (0, 1),
    "gpu_sm_clock_hertz": (1e7, 5e9), "gpu_memory_clock_hertz": (1e7, 2e10),
    "gpu_power_limit_watts": (50, 1500), "gpu_power_default_limit_watts": (50, 1500),
    "gpu_pcie_link_generation": (1, 6), "gpu_pcie_link_width": (1, 32),
    "gpu_performance_state": (0, 15),
}


def timed(fn, *args, repeat: int = 200) -> dict:
    times, error = [], ""
    for _ in range(repeat):
        t0 = time.perf_counter()
        try:
            fn(*args)
        except pynvml.NVMLError as exc:
            error = type(exc).__name__
        times.append(time.perf_counter() - t0)
    us = np.array(times) * 1e6
    return {"p50_us": round(float(np.percentile(us, 50)), 1),
            "p99_us": round(float(np.percentile(us, 99)), 1), "error": error}


def call_latencies(handle) -> dict:
    p = pynvml
    calls = {
        "nvmlDeviceGetFieldValues(POWER_INSTANT,TOTAL_ENERGY)":
            (p.nvmlDeviceGetFieldValues, handle, [p.NVML_FI_DEV_POWER_INSTANT,
                                                  p.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION]),
        "nvmlDeviceGetFieldValues(sweep: 5 fields)":
            (p.nvmlDeviceGetFieldValues, handle, [185, 82, 94, 197, 198]),
        "nvmlDeviceGetPowerUsage": (p.nvmlDeviceGetPowerUsage, handle),
        "nvmlDeviceGetUtilizationRates": (p.nvmlDeviceGetUtilizationRates, handle),
        "nvmlDeviceGetMemoryInfo": (p.nvmlDeviceGetMemoryInfo, handle),
        "nvmlDeviceGetTemperature": (p.nvmlDeviceGetTemperature, handle, 0),
        "nvmlDeviceGetClockInfo(SM)": (p.nvmlDeviceGetClockInfo, handle, p.NVML_CLOCK_SM),
        "nvmlDeviceGetPerformanceState": (p.nvmlDeviceGetPerformanceState, handle),
        "nvmlDeviceGetEnforcedPowerLimit": (p.nvmlDeviceGetEnforcedPowerLimit, handle),
        "nvmlDeviceGetCurrPcieLinkGeneration": (p.nvmlDeviceGetCurrPcieLinkGeneration, handle),
        "nvmlDeviceGetCurrentClocksEventReasons":
            (p.nvmlDeviceGetCurrentClocksEventReasons, handle),
    }
    return {name: timed(fn, *args) for name, (fn, *args) in calls.items()}


def power_update_period(handle, seconds: float) -> dict:
    """Poll instant power as fast as possible; intervals between value changes."""
    field = [pynvml.NVML_FI_DEV_POWER_INSTANT]
    changes, polls, last = [], 0, None
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        (value,) = pynvml.nvmlDeviceGetFieldValues(handle, field)
        polls += 1
        now = time.perf_counter()
        if value.nvmlReturn != 0:
            return {"error": f"field 186 returned {value.nvmlReturn}"}
        if value.value.uiVal != last:
            changes.append(now)
            last = value.value.uiVal
    intervals = np.diff(changes[1:])  # the first change is just the first reading
    if len(intervals) < 3:
        return {"polls": polls, "error": "the instant power did not change while polled"}
    period = float(np.percentile(intervals, 5))
    return {"polls": polls, "poll_rate_hz": round(polls / seconds),
            "changes": len(changes), "min_interval_ms": round(float(intervals.min()) * 1e3, 2),
            "p5_interval_ms": round(period * 1e3, 2),
            "median_interval_ms": round(float(np.median(intervals)) * 1e3, 2),
            "observable_band_hz": [0, round(0.5 / float(np.median(intervals)), 2)]}


def documented_gpu_families() -> set[str]:
    text = DOCS.read_text()
    section = text.split("## GPU (NVML)", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"^\| `([a-z0-9_]+)` \|", section, re.M))


def scrape(port: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append(sample)
    return out


def check_metrics(use_fake: bool, seconds: float) -> tuple[list[str], list[str], dict]:
    failures, warnings = [], []
    exp = Exporter(Config(listen_address="127.0.0.1:0", fake=use_fake,
                          collector_infiniband=False))
    exp.start()
    try:
        time.sleep(2)
        first = scrape(exp.port)
        time.sleep(max(2.0, seconds / 4))
        second = scrape(exp.port)
        gpus = exp.sampler.gpu_count
        loop = exp.current.snapshot.power_loop
    finally:
        exp.stop()
    for name in sorted(documented_gpu_families()):
        samples = second.get(name, [])
        seen = {s.labels.get("gpu") for s in samples}
        if len(seen) < gpus:
            (warnings if name in OPTIONAL else failures).append(
                f"{name}: present for {len(seen)} of {gpus} GPUs")
        low, high = SANE.get(name, (None, None))
        for s in samples:
            if low is not None and not low <= s.value <= high:
                failures.append(f"{name}{s.labels}: {s.value} outside [{low}, {high}]")
    for s in second.get("gpu_memory_used_bytes", []):
        total = [t.value for t in second.get("gpu_memory_total_bytes", [])
                 if t.labels["gpu"] == s.labels["gpu"]]
        if total and s.value > total[0]:
            failures.append(f"gpu {s.labels['gpu']}: memory used > total")
    before = {s.labels["gpu"]: s.value for s in first.get("gpu_energy_joules_total", [])}
    for s in second.get("gpu_energy_joules_total", []):
        if s.labels["gpu"] in before and s.value < before[s.labels["gpu"]]:
            failures.append(f"gpu {s.labels['gpu']}: energy counter went down")
    errors = {f"{s.labels['call']}/{s.labels['error']}": s.value
              for s in second.get("cte_nvml_errors_total", [])}
    summary = {"gpus": gpus, "power_loop_hz": round(loop.achieved_hertz, 2),
               "power_loop_jitter_p99_ms": round(loop.jitter_p99_seconds * 1e3, 2),
               "nvml_errors": errors}
    return failures, warnings, summary


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--json", metavar="OUT", help="also write the report as JSON")
    parser.add_argument("--fake", action="store_true", help="dry run on the simulated node")
    args = parser.parse_args()

    report: dict = {"fake": args.fake}
    ctx = fake.installed(load_scenario("training")) if args.fake else None
    if ctx is not None:
        ctx.__enter__()
    try:
        backend = NvmlBackend()
        count = backend.open()
        handle = backend.handle(0)
        report["driver"] = backend.driver_version
        report["nvml"] = backend.nvml_version
        report["gpu_name"] = pynvml.nvmlDeviceGetName(handle)
        report["gpu_count"] = count
        report["call_latency"] = call_latencies(handle)
        report["power_update"] = power_update_period(handle, min(5.0, args.seconds / 4))
        backend.close()
    finally:
        if ctx is not None:
            ctx.__exit__(None, None, None)
    failures, warnings, summary = check_metrics(args.fake, args.seconds)
    report.update(exporter=summary, failures=failures, warnings=warnings)

    print(f"GPU: {report['gpu_count']}x {report['gpu_name']}, driver {report['driver']}, "
          f"NVML {report['nvml']}{' (FAKE)' if args.fake else ''}")
    print("NVML call latency on GPU 0 (200 calls each):")
    for name, lat in report["call_latency"].items():
        note = f"  [{lat['error']}]" if lat["error"] else ""
        print(f"  {name:56s} p50 {lat['p50_us']:8.1f} us  p99 {lat['p99_us']:8.1f} us{note}")
    print(f"instant power field updates: {json.dumps(report['power_update'])}")
    print(f"exporter: {json.dumps(summary)}")
    for w in warnings:
        print(f"WARN {w}")
    for f in failures:
        print(f"FAIL {f}")
    print("RESULT: " + ("ok" if not failures else f"{len(failures)} check(s) failed"))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
