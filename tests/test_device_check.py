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
    # the fake's instant-power sensor updates every 50 ms: the script must find that
    assert abs(report["power_update"]["median_interval_ms"] - 50) < 3
    assert report["power_update"]["observable_band_hz"][1] == 10
    assert report["failures"] == []
    assert "gpu_fan_speed_ratio: present for 0 of 8 GPUs" in report["warnings"]
    assert set(report["call_latency"]) >= {"nvmlDeviceGetUtilizationRates",
                                           "nvmlDeviceGetMemoryInfo"}
