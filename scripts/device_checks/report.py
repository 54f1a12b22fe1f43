"""Print device_check's report."""

from __future__ import annotations

import json


def print_report(report: dict) -> None:
    print(f"GPU: {report['gpu_count']}x {report['gpu_name']}, driver {report['driver']}, "
          f"NVML {report['nvml']}{' (FAKE, modelled H200 costs)' if report['fake'] else ''}")
    print("NVML calls on GPU 0, each alone (p50 / p99 wall, mean CPU):")
    for name, lat in report["call_latency"].items():
        note = f"  [{lat['error']}]" if lat["error"] else ""
        print(f"  {name:58s} {lat['p50_us']:9.1f} / {lat['p99_us']:9.1f} us, "
              f"cpu {lat['cpu_us']:9.1f} us{note}")
    print(f"memory info, version 1 against version 2: {json.dumps(report['memory_info'])}")
    print(f"instant power field updates: {json.dumps(report['power_update'])}")
    print(f"driver power-sample buffer: {json.dumps(report['power_samples'])}")
    gpm = dict(report["gpm"])
    for name, lat in gpm.pop("call_latency", {}).items():
        print(f"  {name:58s} {lat['p50_us']:9.1f} / {lat['p99_us']:9.1f} us, "
              f"cpu {lat['cpu_us']:9.1f} us")
    print(f"GPM profiling metrics on GPU 0: {json.dumps(gpm)}")
    print(f"exporter: {json.dumps(report['exporter'])}")
    for warning in report["warnings"]:
        print(f"WARN {warning}")
    for failure in report["failures"]:
        print(f"FAIL {failure}")
    print("RESULT: " + ("ok" if not report["failures"] else
                        f"{len(report['failures'])} check(s) failed"))
