"""The profiling collector's spec: its flag, settings, factory and families."""

from __future__ import annotations

from dataclasses import dataclass

from exporter.collectors.profiling.families import profiling_families
from exporter.collectors.profiling.reading import (
    DEFAULT_INTERVAL_SECONDS,
    ProfilingCollector,
)
from exporter.collectors.registry import CollectorSpec
from exporter.options import RECORD, RUN, setting


@dataclass(frozen=True)
class ProfilingSettings:
    interval_seconds: float = setting(
        DEFAULT_INTERVAL_SECONDS, "seconds between GPM samples; the profiling ratios "
        "average over it (each read costs ~1.6 ms of CPU per GPU)",
        key="profiling_interval_seconds", flag="--collector.profiling.interval", low=1.0,
        high=3600.0, metavar="SECONDS", commands=(RUN, RECORD))


SPEC = CollectorSpec(
    name="profiling",
    help="profiling metrics from NVML GPM (Hopper and later): SM, tensor, FP and DRAM "
         "activity, the share of time the GPU computes rather than waits",
    default=True,
    factory=lambda settings, context: ProfilingCollector(context),
    families=profiling_families,
    settings=ProfilingSettings,
    interval=lambda settings: settings.interval_seconds,
)
