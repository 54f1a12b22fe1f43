"""scripts/device_check.py runs end to end (on the fake here; on a real GPU node by hand)."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.tools import REPO


def test_device_check_dry_run_on_the_fake(tmp_path):
    out = tmp_path / "report.json"
    result = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "device_check.py"), "--fake", "--seconds", "4",
         "--json", str(out)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "RESULT: ok" in result.stdout
    report = json.loads(out.read_text())
    assert report["gpu_count"] == 8 and report["fake"] is True
    # the fake's instant-power field changes every 100 ms, as an H200's: the script finds it
    assert abs(report["power_update"]["median_interval_ms"] - 100) < 5
    # and the driver's buffer: a sample every ~20 ms, 119 of them, a late drain loses some
    samples = report["power_samples"]
    assert abs(samples["median_interval_ms"] - 20) < 3 and samples["capacity_found"] == 119
    assert samples["samples_per_second"] > 40 and samples["lost_samples"] > 100
    assert report["failures"] == []
    assert "gpu_fan_speed_ratio: present for 0 of 8 GPUs" in report["warnings"]
    # version 2 of the memory call gives what the sweep serves for version 1 on every GPU
    assert report["memory_info"] == {"agree": True, "differ": {}, "unsupported": []}
    calls = report["call_latency"]
    # each call the exporter makes is measured alone, under a name that says which
    assert {"nvmlDeviceGetFieldValues(TOTAL_ENERGY_CONSUMPTION)",
            "nvmlDeviceGetFieldValues(POWER_INSTANT)",
            "nvmlDeviceGetSamples(TOTAL_POWER, last second)",
            "nvmlDeviceGetUtilizationRates", "nvmlDeviceGetMemoryInfo"} <= set(calls)
    # the health-interval fields whose costs are estimates are measured too: each alone,
    # the memory errors as the sweep batches them, the per-link fields for one link
    assert {"nvmlDeviceGetFieldValues(ECC_SBE_VOL_TOTAL)",
            "nvmlDeviceGetFieldValues(REMAPPED_FAILURE)",
            "nvmlDeviceGetFieldValues(POWER_MAX_LIMIT)",
            "nvmlDeviceGetFieldValues(GET_GPU_RECOVERY_ACTION)",
            "nvmlDeviceGetFieldValues(memory errors: 11 fields)",
            "nvmlDeviceGetFieldValues(NVLINK_GET_STATE, link 0)",
            "nvmlDeviceGetFieldValues(NVLINK_CRC_DATA_L0, link 0)",
            "nvmlDeviceGetNvLinkErrorCounter(link 0, DL_CRC_DATA)"} <= set(calls)
    assert calls["nvmlDeviceGetNvLinkErrorCounter(link 0, DL_CRC_DATA)"]["error"] == ""
    # the fake charges the H200's costs: the energy field costs milliseconds
    assert calls["nvmlDeviceGetFieldValues(TOTAL_ENERGY_CONSUMPTION)"]["p50_us"] >= 2500
    # GPM on the fake's H200: supported, its costs as measured, the 8 metrics of training
    gpm = report["gpm"]
    assert gpm["status"] == "supported" and len(gpm["metrics"]) == 8
    assert 0.2 < gpm["metrics"]["tensor_active_ratio"] < 0.98
    assert gpm["call_latency"]["nvmlGpmSampleGet"]["p50_us"] >= 40
    assert gpm["call_latency"]["nvmlGpmMetricsGet(8 metrics)"]["p50_us"] >= 1000
    assert gpm["call_latency"]["nvmlGpmMetricsGet(8 metrics), first call"]["p50_us"] >= 4000
    assert "GPM profiling metrics on GPU 0" in result.stdout
    exporter = report["exporter"]
    assert exporter["power_source"] == ["buffer"] and exporter["observable_band_hz"] >= 20
    assert "process_cpu_percent_per_gpu" in exporter and "modelled_driver_cpu_percent" in exporter
    assert exporter["profiling_supported"] == ["supported"]


def test_device_check_without_a_gpu_says_so_in_one_line(tmp_path):
    import pynvml
    import pytest

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        pass
    else:
        pynvml.nvmlShutdown()
        pytest.skip("this machine has a GPU: the check would run on it")
    result = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "device_check.py"), "--json",
         str(tmp_path / "report.json")], capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert "NVML is not available" in lines[0] and "--fake" in lines[0]
