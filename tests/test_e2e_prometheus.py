"""End to end: a real Prometheus scrapes `cluster-telemetry-exporter run --fake`."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from tests.prom import Prometheus
from tests.tools import free_port, stop_process, wait_for


@pytest.fixture
def exporter_process():
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "exporter", "run", "--fake",
         "--web.listen-address", f"127.0.0.1:{port}"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        yield port, proc
    finally:
        stop_process(proc)


def test_prometheus_scrapes_power_for_all_gpus(tmp_path, exporter_process):
    port, proc = exporter_process
    prom = Prometheus(tmp_path, [f"127.0.0.1:{port}"])
    try:
        # two successful scrapes of the exporter
        wait_for(lambda: prom.query('count_over_time(up{job="gpu"}[1m]) >= 2 and up == 1'),
                 timeout=30, interval=0.5)
        result = prom.query("gpu_power_watts")
        assert sorted(int(r["metric"]["gpu"]) for r in result) == list(range(8))
        assert all(100 < float(r["value"][1]) < 800 for r in result)
        energy = prom.query("gpu_energy_joules_total")
        assert len(energy) == 8
        targets = prom.api("targets")["activeTargets"]
        assert targets[0]["health"] == "up" and targets[0]["lastError"] == ""
        # a rate over the energy counter is the GPUs' average power
        time.sleep(2)
        avg = wait_for(lambda: prom.query("rate(gpu_energy_joules_total[10s])"), timeout=15)
        assert all(150 < float(r["value"][1]) < 700 for r in avg)
    finally:
        prom.stop()
    assert proc.poll() is None  # the exporter kept running throughout
