"""The alert rules' thresholds, from the health settings: the verdict and the alerts judge
with the same numbers, and a threshold changed in the node's config moves both.

Each managed threshold names its rule file, its alert, a pattern that finds the number in
that alert's text (its expression or description) and the number as the settings give it.
`apply` rewrites the numbers in a rule file's text and leaves every other byte alone, so the
files stay hand-written YAML with their comments; scripts/build_health_rules.py writes
them (the committed files are the defaults: a test keeps them so) or an operator's copy from
their own config.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from exporter.health.settings import HealthSettings

NUMBER = r"(?P<n>[0-9][0-9.e+-]*)"


@dataclass(frozen=True)
class Threshold:
    file: str  # under alerts/
    alert: str
    pattern: str  # a regular expression with NUMBER in it, found in the alert's text
    value: Callable[[HealthSettings], float]
    setting: str  # the health_* key, for the docs

    def find(self, text: str) -> re.Match[str]:
        block = alert_block(text, self.alert)
        found = re.search(self.pattern.replace("{n}", NUMBER), text[block[0]:block[1]])
        if found is None:
            raise ValueError(f"{self.file}: {self.alert}: no threshold matching "
                             f"{self.pattern!r}")
        return found


def _scaled(ratio: float) -> Callable[[HealthSettings], float]:
    """The PCIe per-lane rate of a later generation: the Gen1 setting times DCGM's ratio."""
    return lambda s: s.pcie_replays_per_lane_per_minute * ratio / 0.15


THRESHOLDS = (
    Threshold("gpu-hardware.yml", "GpuRetiredPagesHigh",
              r"\(gpu_retired_pages_total\) >= {n}", lambda s: s.retired_pages_max,
              "health_retired_pages_max"),
    Threshold("gpu-hardware.yml", "GpuNvlinkReplayRecoveryErrors", r"\[1m\]\) >= {n}",
              lambda s: s.nvlink_replays_per_minute, "health_nvlink_replays_per_minute"),
    Threshold("gpu-hardware.yml", "GpuNvlinkCrcErrors", r"\[1m\]\)\) >= {n}",
              lambda s: s.nvlink_crc_per_minute, "health_nvlink_crc_per_minute"),
    Threshold("gpu-hardware.yml", "GpuNvlinkCrcErrorsCritical", r"\[1m\]\)\) >= {n}",
              lambda s: s.nvlink_crc_per_second, "health_nvlink_crc_per_second"),
    Threshold("gpu-hardware.yml", "GpuPcieReplaysHigh",
              r"\({n} \* 2 \^ \(gpu_pcie_link_generation - 3\)", _scaled(0.48),
              "health_pcie_replays_per_lane_per_minute"),
    Threshold("gpu-hardware.yml", "GpuPcieReplaysHigh",
              r"or {n} \* 2 \^ \(gpu_pcie_link_generation - 1\)", _scaled(0.15),
              "health_pcie_replays_per_lane_per_minute"),
    Threshold("gpu-hardware.yml", "GpuPcieLinkGenerationDegraded",
              r"gpu_utilization_ratio > {n}", lambda s: s.pcie_load_ratio,
              "health_pcie_load_ratio"),
    Threshold("gpu-hardware.yml", "GpuPcieLinkWidthDegraded",
              r"gpu_utilization_ratio > {n}", lambda s: s.pcie_load_ratio,
              "health_pcie_load_ratio"),
    Threshold("fabric.yml", "InfinibandSymbolErrorRate",
              r"symbol_errors_total\[5m\]\) > {n}",
              lambda s: s.infiniband_symbol_errors_per_second,
              "health_infiniband_symbol_errors_per_second"),
    Threshold("fabric.yml", "InfinibandSymbolErrorRate", r"\(threshold {n}/s\)",
              lambda s: s.infiniband_symbol_errors_per_second,
              "health_infiniband_symbol_errors_per_second"),
    Threshold("fabric.yml", "InfinibandLinkErrorRecoveryRate", r"\* 60 > {n}",
              lambda s: s.infiniband_link_error_recovery_per_minute,
              "health_infiniband_link_error_recovery_per_minute"),
    Threshold("fabric.yml", "InfinibandLinkErrorRecoveryRate", r"\(threshold {n}/min\)",
              lambda s: s.infiniband_link_error_recovery_per_minute,
              "health_infiniband_link_error_recovery_per_minute"),
)
FILES = tuple(dict.fromkeys(t.file for t in THRESHOLDS))


def alert_block(text: str, alert: str) -> tuple[int, int]:
    """Where one alert's rule is in a rule file's text: from its `- alert:` line to the
    next rule (or the end)."""
    start = re.search(rf"^\s*- alert: {re.escape(alert)}\s*$", text, re.M)
    if start is None:
        raise ValueError(f"no alert {alert}")
    following = re.search(r"^\s*- (alert|record):", text[start.end():], re.M)
    return start.start(), start.end() + following.start() if following else len(text)


def number(value: float) -> str:
    """As PromQL and a person read it: 63, 0.5, 0.96, 1e+06."""
    return f"{value:.6g}"


def apply(file: str, text: str, settings: HealthSettings) -> str:
    """The rule file's text with every managed threshold set from `settings`."""
    for threshold in (t for t in THRESHOLDS if t.file == file):
        block_start, _ = alert_block(text, threshold.alert)
        found = threshold.find(text)
        at = block_start + found.start("n"), block_start + found.end("n")
        text = text[:at[0]] + number(threshold.value(settings)) + text[at[1]:]
    return text
