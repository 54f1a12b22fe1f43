"""Check the exporter on a real GPU node and measure the NVML costs docs/nvml-costs.md lists.

    python scripts/device_check.py [--seconds 20] [--json OUT] [--fake]

1. The wall time and CPU of every NVML call the exporter makes, each alone (keys name
   the call: `nvmlDeviceGetFieldValues(TOTAL_ENERGY_CONSUMPTION)`,
   `nvmlDeviceGetFieldValues(POWER_INSTANT)`, `nvmlDeviceGetSamples(TOTAL_POWER)`, ...).
2. The update period of the instant-power field (poll fast, intervals between changes,
   as Zeus does), and the driver's buffer of power samples (`power_samples`: median
   interval, samples a second, the capacity found, samples lost by a late drain).
3. GPM (profiling metrics) on GPU 0: support, the cost of nvmlGpmSampleGet and
   nvmlGpmMetricsGet (the first call apart), and the 8 metrics the exporter exports over
   a few seconds of whatever load the GPU runs (`gpm`).
4. Runs the exporter on real NVML (or --fake, with the fake's H200 costs), measures its
   CPU per GPU, scrapes /metrics twice and checks that every GPU metric in
   docs/metrics.md is present for every GPU and sane, and the profiling ratios for every
   GPU that supports GPM.
Prints a report; exits 1 if a check failed. With --fake it reports the fake's figures
the same way. Needs nothing beyond the package.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import pynvml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from device_checks.exporter_run import check_metrics  # noqa: E402 (scripts/device_checks)
from device_checks.gpm import gpm_check  # noqa: E402
from device_checks.report import print_report  # noqa: E402

from exporter.gpu import catalogue  # noqa: E402
from exporter.gpu import fields as fi  # noqa: E402
from exporter.gpu.backend import NvmlBackend, NvmlUnavailable, field_name  # noqa: E402
from exporter.sim import fake  # noqa: E402
from exporter.sim.scenarios import load_scenario  # noqa: E402


def timed(fn, *args, repeat: int = 100) -> dict:
    """p50/p99 wall and mean CPU (process time: the driver's threads too) of a call."""
    walls, error = [], ""
    cpu0 = time.process_time()
    for _ in range(repeat):
        t0 = time.perf_counter()
        try:
            fn(*args)
        except pynvml.NVMLError as exc:
            error = type(exc).__name__
        walls.append(time.perf_counter() - t0)
    cpu = (time.process_time() - cpu0) / repeat
    us = np.array(walls) * 1e6
    return {"p50_us": round(float(np.percentile(us, 50)), 1),
            "p99_us": round(float(np.percentile(us, 99)), 1),
            "cpu_us": round(cpu * 1e6, 1), "error": error}


def _field(handle, field_id: int):
    return lambda: pynvml.nvmlDeviceGetFieldValues(handle, [field_id])


# the memory errors, read in the slow sweep's batch: ECC, retired pages, rows
_MEMORY_FIELDS = tuple(e.nvml.id for f in catalogue.MEMORY_ERRORS
                       for e in catalogue.FAMILIES[f] if isinstance(e.nvml, catalogue.Field))
# read once, numbered in its catalogue entry alone
_POWER_MAX_LIMIT = catalogue.BY_KEY["power_max_limit_watts"].nvml
assert isinstance(_POWER_MAX_LIMIT, catalogue.Field)
_LINK_FIELDS = (*(e.nvml.id for e in catalogue.PER_LINK if isinstance(e.nvml, catalogue.Field)),
                fi.NVLINK_CRC_DATA[0])


def call_latencies(handle) -> dict:
    p = pynvml
    calls = {f"nvmlDeviceGetFieldValues({field_name(f)})": (_field(handle, f),) for f in (
        fi.TOTAL_ENERGY, fi.POWER_INSTANT, fi.POWER_AVERAGE, fi.MEMORY_TEMP,
        fi.PCIE_REPLAY_COUNTER, fi.PCIE_TX_BYTES, fi.PCIE_RX_BYTES, fi.VIOLATION_POWER,
        fi.VIOLATION_THERMAL, fi.VIOLATION_SW_THERMAL, fi.VIOLATION_HW_THERMAL,
        fi.VIOLATION_HW_POWER_BRAKE, *_MEMORY_FIELDS, _POWER_MAX_LIMIT.id, fi.RECOVERY_ACTION)}
    # the per-link fields of the device read, for link 0 (NotSupported without NVLink)
    calls.update({f"nvmlDeviceGetFieldValues({field_name(f)}, link 0)":
                  (p.nvmlDeviceGetFieldValues, handle, [(f, 0)]) for f in _LINK_FIELDS})
    calls.update({
        f"nvmlDeviceGetFieldValues(memory errors: {len(_MEMORY_FIELDS)} fields)":
            (p.nvmlDeviceGetFieldValues, handle, list(_MEMORY_FIELDS)),
        "nvmlDeviceGetNvLinkErrorCounter(link 0, DL_CRC_DATA)":
            (p.nvmlDeviceGetNvLinkErrorCounter, handle, 0, fi.NVLINK_ERROR_DL_CRC_DATA),
        "nvmlDeviceGetFieldValues(sweep: POWER_AVERAGE, MEMORY_TEMP)":
            (p.nvmlDeviceGetFieldValues, handle, [fi.POWER_AVERAGE, fi.MEMORY_TEMP]),
        "nvmlDeviceGetTotalEnergyConsumption": (p.nvmlDeviceGetTotalEnergyConsumption, handle),
        "nvmlDeviceGetSamples(TOTAL_POWER, last second)":
            (lambda: p.nvmlDeviceGetSamples(handle, p.NVML_TOTAL_POWER_SAMPLES,
                                            int((time.time() - 1) * 1e6)),),
        "nvmlDeviceGetSamples(TOTAL_POWER, whole buffer)":
            (p.nvmlDeviceGetSamples, handle, p.NVML_TOTAL_POWER_SAMPLES, 0),
        "nvmlDeviceGetSamples(GPU_UTILIZATION, whole buffer)":
            (p.nvmlDeviceGetSamples, handle, p.NVML_GPU_UTILIZATION_SAMPLES, 0),
        "nvmlDeviceGetPowerUsage": (p.nvmlDeviceGetPowerUsage, handle),
        "nvmlDeviceGetUtilizationRates": (p.nvmlDeviceGetUtilizationRates, handle),
        "nvmlDeviceGetMemoryInfo": (p.nvmlDeviceGetMemoryInfo, handle),
        "nvmlDeviceGetMemoryInfo_v2": (p.nvmlDeviceGetMemoryInfo, handle, p.nvmlMemory_v2),
        "nvmlDeviceGetEncoderUtilization": (p.nvmlDeviceGetEncoderUtilization, handle),
        "nvmlDeviceGetDecoderUtilization": (p.nvmlDeviceGetDecoderUtilization, handle),
        "nvmlDeviceGetTemperature": (p.nvmlDeviceGetTemperature, handle, 0),
        "nvmlDeviceGetClockInfo(SM)": (p.nvmlDeviceGetClockInfo, handle, p.NVML_CLOCK_SM),
        "nvmlDeviceGetPerformanceState": (p.nvmlDeviceGetPerformanceState, handle),
        "nvmlDeviceGetEnforcedPowerLimit": (p.nvmlDeviceGetEnforcedPowerLimit, handle),
        "nvmlDeviceGetCurrPcieLinkGeneration": (p.nvmlDeviceGetCurrPcieLinkGeneration, handle),
        "nvmlDeviceGetCurrentClocksEventReasons":
            (p.nvmlDeviceGetCurrentClocksEventReasons, handle),
    })
    repeat = {"nvmlDeviceGetSamples(TOTAL_POWER, last second)": 20}
    return {name: timed(fn, *args, repeat=repeat.get(name, 100))
            for name, (fn, *args) in calls.items()}


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
    return {"polls": polls, "poll_rate_hz": round(polls / seconds),
            "changes": len(changes), "min_interval_ms": round(float(intervals.min()) * 1e3, 2),
            "median_interval_ms": round(float(np.median(intervals)) * 1e3, 2),
            "observable_band_hz": [0, round(0.5 / float(np.median(intervals)), 2)]}


def power_samples(backend: NvmlBackend, seconds: float) -> dict:
    """The driver's buffer of power samples: drained every second for `seconds`, then
    once after a 5 s pause (how much a late drain loses, and the buffer's capacity)."""
    first = backend.samples(0, fi.TOTAL_POWER_SAMPLES, 0)
    if first is None:
        return {"error": "nvmlDeviceGetSamples(NVML_TOTAL_POWER_SAMPLES) is not supported"}
    stamps = [int(t) for t in first[0]]
    last = stamps[-1] if stamps else 0
    capacity = len(stamps)
    t0 = time.time()
    while time.time() - t0 < seconds:
        time.sleep(1.0)
        new = backend.samples(0, fi.TOTAL_POWER_SAMPLES, last)
        if new is not None and len(new[0]):
            stamps += [int(t) for t in new[0]]
            last = stamps[-1]
    time.sleep(5.0)
    got = backend.samples(0, fi.TOTAL_POWER_SAMPLES, last)
    late = [int(t) for t in got[0]] if got is not None else []
    capacity = max(capacity, len(late))
    if len(stamps) < 3:
        return {"error": f"only {len(stamps)} power samples in {seconds:g} s"}
    gaps = np.diff(np.array(stamps, dtype=float)) / 1e3  # ms
    interval = float(np.median(gaps))
    span = (stamps[-1] - stamps[0]) / 1e6
    lost_ms = (late[0] - last) / 1e3 - interval if late else None
    return {"median_interval_ms": round(interval, 2),
            "min_interval_ms": round(float(gaps.min()), 2),
            "max_interval_ms": round(float(gaps.max()), 2),
            "samples_per_second": round((len(stamps) - 1) / span, 1),
            "capacity_found": capacity,
            "late_drain_after_s": 5.0,
            "lost_samples": None if lost_ms is None else max(0, round(lost_ms / interval)),
            "lost_ms": None if lost_ms is None else round(lost_ms, 1),
            "observable_band_hz": [0, round(500 / interval, 2)]}


def memory_info_versions(count: int) -> dict:
    """Version 1 and version 2 of nvmlDeviceGetMemoryInfo on every GPU, read back to back:
    the sweep serves version 1's total and used from version 2 alone (total, and total -
    free), which holds where the two agree ("agree": every GPU did; "differ": the ones
    that did not; "unsupported": version 2 not answered, so the sweep reads version 1)."""
    out: dict = {"agree": True, "differ": {}, "unsupported": []}
    for gpu in range(count):
        handle = pynvml.nvmlDeviceGetHandleByIndex(gpu)
        try:
            v2 = pynvml.nvmlDeviceGetMemoryInfo(handle, pynvml.nvmlMemory_v2)
        except pynvml.NVMLError:
            out["unsupported"].append(gpu)
            continue
        v1 = pynvml.nvmlDeviceGetMemoryInfo(handle)
        served = (v2.total, v2.total - v2.free)
        if (v1.total, v1.used) != served:
            out["agree"] = False
            out["differ"][gpu] = {"v1_total_used": [v1.total, v1.used],
                                  "v2_total_total_minus_free": list(served),
                                  "v2_reserved": v2.reserved}
    return out


def measure_nvml(args: argparse.Namespace) -> dict:
    report: dict = {}
    backend = NvmlBackend()
    count = backend.open()
    handle = backend.handle(0)
    report["driver"] = backend.driver_version
    report["nvml"] = backend.nvml_version
    report["gpu_name"] = pynvml.nvmlDeviceGetName(handle)
    report["gpu_count"] = count
    report["call_latency"] = call_latencies(handle)
    report["memory_info"] = memory_info_versions(count)
    report["power_update"] = power_update_period(handle, min(5.0, args.seconds / 4))
    report["power_samples"] = power_samples(backend, min(10.0, args.seconds / 2))
    report["gpm"] = gpm_check(backend, min(5.0, args.seconds / 4), timed)
    backend.close()
    return report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--json", metavar="OUT", help="also write the report as JSON")
    parser.add_argument("--fake", action="store_true",
                        help="dry run on the simulated node (with its modelled H200 costs)")
    args = parser.parse_args()

    report: dict = {"fake": args.fake}
    ctx = fake.installed(load_scenario("training")) if args.fake else None
    if ctx is not None:
        ctx.__enter__()
    try:
        report.update(measure_nvml(args))
    except NvmlUnavailable as exc:  # run on a machine without a GPU: say so, in one line
        print(f"device_check: {exc}; on a machine without a GPU, --fake does a dry run",
              file=sys.stderr)
        return 1
    finally:
        if ctx is not None:
            ctx.__exit__(None, None, None)
    failures, warnings, summary = check_metrics(args.fake, args.seconds)
    if not report["memory_info"]["agree"]:  # memory moved between the two reads, or not
        warnings.append("nvmlDeviceGetMemoryInfo: version 1's total and used differ from "
                        "version 2's total and total - free (what the sweep serves) on GPUs "
                        f"{sorted(report['memory_info']['differ'])}; run again on an idle "
                        "GPU to tell a change between the reads from a driver that differs")
    report.update(exporter=summary, failures=failures, warnings=warnings)
    print_report(report)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
