"""Run the exporter on real NVML (or the fake) and check what it serves; measure its CPU."""

from __future__ import annotations

import re
import time
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from exporter.app import Exporter
from exporter.config import Config
from exporter.gpu import gpm

DOCS = Path(__file__).resolve().parent.parent.parent / "docs" / "metrics.md"
# Families a GPU may lack without being wrong (fanless SXM boards, no HBM sensor).
OPTIONAL = {"gpu_fan_speed_ratio", "gpu_memory_temperature_celsius",
            "gpu_encoder_utilization_ratio", "gpu_decoder_utilization_ratio"}  # H100: no NVENC
SANE = {  # family -> (low, high) for every sample
    "gpu_power_watts": (0, 1500), "gpu_power_average_watts": (0, 1500),
    "gpu_temperature_celsius": (0, 120), "gpu_memory_temperature_celsius": (0, 130),
    "gpu_utilization_ratio": (0, 1), "gpu_memory_utilization_ratio": (0, 1),
    "gpu_sm_clock_hertz": (1e7, 5e9), "gpu_memory_clock_hertz": (1e7, 2e10),
    "gpu_power_limit_watts": (50, 1500), "gpu_power_default_limit_watts": (50, 1500),
    "gpu_pcie_link_generation": (1, 6), "gpu_pcie_link_width": (1, 32),
    "gpu_performance_state": (0, 15), "gpu_power_sample_interval_seconds": (0.001, 1),
}


def documented_gpu_families() -> set[str]:
    text = DOCS.read_text()
    section = text.split("## GPU (NVML)", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"^\| `([a-z0-9_]+)` \|", section, re.M))


def scrape(port: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    out: dict[str, list] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append(sample)
    return out


def _checks(first: dict, second: dict, gpus: int) -> tuple[list[str], list[str]]:
    failures, warnings = [], []
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
    for name in ("gpu_energy_joules_total", "gpu_power_sampled_energy_joules_total"):
        before = {s.labels["gpu"]: s.value for s in first.get(name, [])}
        for s in second.get(name, []):
            if s.labels["gpu"] in before and s.value < before[s.labels["gpu"]]:
                failures.append(f"gpu {s.labels['gpu']}: {name} went down")
    failures += _profiling_checks(second)
    for s in second.get("gpu_power_samples_lost_total", []):
        if s.value > 0:
            warnings.append(f"gpu {s.labels['gpu']}: {s.value:.0f} power samples lost")
    return failures, warnings


def _profiling_checks(scraped: dict) -> list[str]:
    """Every GPU that says it supports GPM has the 8 ratios, each in [0, 1]."""
    failures = []
    supported = {s.labels["gpu"] for s in scraped.get("gpu_profiling_supported", [])
                 if s.value == 1}
    for metric in gpm.METRICS:
        values = {s.labels["gpu"]: s.value for s in scraped.get(metric.metric, [])}
        if supported - set(values):
            failures.append(f"{metric.metric}: missing for GPUs {sorted(supported - set(values))}"
                            " that support GPM")
        failures += [f"{metric.metric}{{gpu={g}}}: {v} outside [0, 1]"
                     for g, v in values.items() if not 0 <= v <= 1]
    return failures


def check_metrics(use_fake: bool, seconds: float) -> tuple[list[str], list[str], dict]:
    """Run the exporter for ~`seconds`; failures, warnings and a summary with its CPU."""
    # profiling every 2 s (10 s by default) so that its ratios are in the second scrape;
    # every family (profile full), so that each is checked on the hardware
    exp = Exporter(Config.of(listen_address="127.0.0.1:0", fake=use_fake, energy_interval_seconds=2,
                             collector_infiniband=False, profiling_interval_seconds=2,
                             metrics_profile="full"))
    exp.start()
    try:
        time.sleep(3)
        first = scrape(exp.port)
        cpu0, wall0 = time.process_time(), time.monotonic()
        busy0 = exp.fake_lib.busy_seconds if exp.fake_lib is not None else 0.0
        time.sleep(max(3.0, seconds / 2))
        cpu = (time.process_time() - cpu0) / (time.monotonic() - wall0)
        driver = ((exp.fake_lib.busy_seconds - busy0) / (time.monotonic() - wall0)
                  if exp.fake_lib is not None else None)
        second = scrape(exp.port)
        gpus = exp.sampler.gpu_count
        snap = exp.current.snapshot
    finally:
        exp.stop()
    failures, warnings = _checks(first, second, gpus)
    sources = {s.labels["source"] for s in second.get("gpu_power_source_info", [])}
    summary = {
        "gpus": gpus, "power_source": sorted(sources),
        "power_samples_per_second_per_gpu": round(
            sum(p.samples_total for p in snap.power_sampling.values()) / max(gpus, 1)
            / max(time.time() - snap.started_at, 1e-9), 1),
        "observable_band_hz": round(snap.observable_band_hz[1], 2),
        "process_cpu_percent": round(cpu * 100, 2),
        "process_cpu_percent_per_gpu": round(cpu * 100 / max(gpus, 1), 3),
        "loop_cpu_seconds": {n: round(s.cpu_seconds_total, 3) for n, s in snap.loops.items()},
        "profiling_supported": sorted({s.labels["reason"]
                                       for s in second.get("gpu_profiling_supported", [])}),
        "nvml_errors": {f"{c}/{e}": n for (c, e), n in snap.nvml_errors.items()},
    }
    if driver is not None:
        summary["modelled_driver_cpu_percent"] = round(driver * 100, 2)
    return failures, warnings, summary
