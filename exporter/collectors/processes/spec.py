"""The processes collector's spec: its flag, settings, factory and families.

The collector's modules are imported when it is made or its reading rendered: a node
that leaves it off (the default) never loads them."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from prometheus_client.metrics_core import Metric

from exporter.collectors.registry import CollectorSpec
from exporter.options import setting
from exporter.sampling.collector_api import CollectorContext
from exporter.sampling.snapshot import Snapshot

if TYPE_CHECKING:
    from exporter.collectors.processes.reading import ProcessesCollector, ProcessesReading

DEFAULT_INTERVAL = 15.0
DEFAULT_MAX = 256


@dataclass(frozen=True)
class ProcessesSettings:
    interval_seconds: float = setting(
        DEFAULT_INTERVAL, "how often processes and their utilization are read (8 GPUs "
        "cost ~16 ms of CPU a read)", key="processes_interval_seconds",
        flag="--collector.processes.interval", low=1.0, high=3600.0, metavar="SECONDS")
    max: int = setting(
        DEFAULT_MAX, "most processes exported per node; the rest are counted as dropped",
        key="processes_max", flag="--collector.processes.max", low=1, high=100000,
        metavar="N")
    proc_labels: bool = setting(
        True, "read each new process's command name, container id and ranks from "
        "--path.procfs (gpu_process_info)", key="processes_proc_labels",
        flag="--collector.processes.proc-labels")
    procfs: str = setting(
        "/proc", "procfs mount point (as node_exporter's flag); the host's, for the PIDs "
        "NVML reports", key="path_procfs", flag="--path.procfs", metavar="DIR")


def _make(settings: ProcessesSettings, context: CollectorContext) -> ProcessesCollector:
    from exporter.collectors.processes.reading import ProcessesCollector

    # a fake or replayed node's PIDs are made up: /proc would name this host's processes
    real = not context.simulated or settings.procfs != "/proc"
    procfs = settings.procfs if settings.proc_labels and real else None
    return ProcessesCollector(context, settings.max, procfs)



def _families(reading: ProcessesReading, snapshot: Snapshot) -> Iterator[Metric]:
    from exporter.collectors.processes.families import processes_families

    return processes_families(reading, snapshot)


SPEC = CollectorSpec(
    name="processes",
    help="per GPU and process: memory, SM utilization and the GPU's energy split by it "
    "(nvmlDeviceGetProcessUtilization, ~2 ms of CPU per GPU a read)",
    default=False,
    factory=_make,
    families=_families,
    settings=ProcessesSettings,
    interval=lambda settings: settings.interval_seconds,
)
