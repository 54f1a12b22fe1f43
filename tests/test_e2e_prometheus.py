"""End to end: a real Prometheus scrapes `cluster-telemetry-exporter run --fake`."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.prom import Prometheus
from tests.tools import free_port, stop_process, wait_for


@pytest.fixture
def exporter_process():
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "exporter", "run", "--fake", "--energy.interval", "1",
         "--web.listen-address", f"127.0.0.1:{port}"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        yield port, proc
    finally:
        stop_process(proc)


@pytest.mark.e2e
def test_prometheus_scrapes_power_for_all_gpus(tmp_path, exporter_process):
    port, proc = exporter_process
    prom = Prometheus(tmp_path, [f"127.0.0.1:{port}"], scrape_interval="500ms")
    try:
        # two successful scrapes of the exporter
        wait_for(lambda: prom.query('count_over_time(up{job="gpu"}[1m]) >= 2 and up == 1'),
                 timeout=30, interval=0.2)
        result = prom.query("gpu_power_watts")
        assert sorted(int(r["metric"]["gpu"]) for r in result) == list(range(8))
        assert all(100 < float(r["value"][1]) < 800 for r in result)
        energy = prom.query("gpu_energy_joules_total")
        assert len(energy) == 8
        targets = prom.api("targets")["activeTargets"]
        assert targets[0]["health"] == "up" and targets[0]["lastError"] == ""
        # a rate over either energy counter is the GPUs' average power: the driver's
        # (read every second here) and the integral of the native-rate samples (drained
        # every second). 3 s hold at least one whole 2 s training step: 400-640 W.
        for counter in ("gpu_energy_joules_total", "gpu_power_sampled_energy_joules_total"):
            def plausible(c=counter):  # once the 3 s window is full of scrapes
                avg = prom.query(f"rate({c}[3s]) and count_over_time({c}[3s]) >= 6")
                return len(avg) == 8 and all(150 < float(r["value"][1]) < 700 for r in avg)

            wait_for(plausible, timeout=30, interval=0.2)
    finally:
        prom.stop()
    assert proc.poll() is None  # the exporter kept running throughout
