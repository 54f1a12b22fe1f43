"""The processes collector's spec: its flag, options, factory and families."""

from __future__ import annotations

from typing import Any

from exporter.collectors.processes.families import processes_families
from exporter.collectors.processes.reading import (
    DEFAULT_INTERVAL,
    DEFAULT_MAX,
    ProcessesSource,
)
from exporter.collectors.registry import CollectorSpec
from exporter.options import Option
from exporter.sampling.collector_api import CollectorContext


def _make(config: Any, context: CollectorContext) -> ProcessesSource:
    # a fake or replayed node's PIDs are made up: /proc would name this host's processes
    real = not (config.fake or config.replay) or config.path_procfs != "/proc"
    procfs = config.path_procfs if config.processes_proc_labels and real else None
    return ProcessesSource(context, config.processes_max, procfs)


SPEC = CollectorSpec(
    name="processes",
    help="per GPU and process: memory, SM utilization and the GPU's energy split by it "
    "(nvmlDeviceGetProcessUtilization, ~2 ms of CPU per GPU a read)",
    default=False,
    factory=_make,
    families=processes_families,
    interval=lambda config: config.processes_interval_seconds,
    options=(
        Option("processes_interval_seconds", "--collector.processes.interval", float,
               DEFAULT_INTERVAL, "how often processes and their utilization are read (8 GPUs "
               "cost ~16 ms of CPU a read)", 1.0, 3600.0, metavar="SECONDS"),
        Option("processes_max", "--collector.processes.max", int, DEFAULT_MAX,
               "most processes exported per node; the rest are counted as dropped", 1,
               100000, metavar="N"),
        Option("processes_proc_labels", "--collector.processes.proc-labels", bool, True,
               "read each new process's command name and container id from --path.procfs "
               "(gpu_process_info)"),
        Option("path_procfs", "--path.procfs", str, "/proc", "procfs mount point (as "
               "node_exporter's flag); the host's, for the PIDs NVML reports",
               metavar="DIR"),
    ),
)
