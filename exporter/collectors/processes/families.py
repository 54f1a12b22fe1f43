"""Processes reading -> per-process families on `gpu, uuid, pid`.

Every family keeps the same three labels (a process's command, container and ranks are
on ``gpu_process_info``, joined on ``pid``), so series stay few and a process's series all
go when it exits. The energy family adds one ``pid="idle"`` series per GPU: the energy
no listed process used, so that ``sum by (gpu)`` of the counter is the GPU's energy.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.metrics_core import Metric

from exporter.collectors.processes.procfs import PROC_ERRORS, ProcLabels
from exporter.collectors.processes.reading import ProcessesReading
from exporter.families import Family
from exporter.sampling.snapshot import Snapshot

__all__ = ["DECLARED", "IDLE_PID", "processes_families"]

IDLE_PID = "idle"
_LABELS = ("gpu", "uuid", "pid")
_ON = "`--collector.processes` is on"

MEMORY = Family(
    "gpu_process_memory_used_bytes", "gauge", "Device memory the process holds on the GPU.",
    _LABELS, unit="bytes", source="`nvmlDeviceGetComputeRunningProcesses`",
    doc=f"Device memory the process holds (present only when {_ON}).")
SM = Family(
    "gpu_process_sm_utilization_ratio", "gauge",
    "Share of time the process's kernels ran on the GPU's SMs since the previous read (0-1).",
    _LABELS, unit="ratio", source="`nvmlDeviceGetProcessUtilization`",
    doc="Share of time the process's kernels ran on the SMs since the previous read (present "
        f"only when {_ON}, on GPUs not in MIG mode).")
ENERGY = Family(
    "gpu_process_energy_joules_total", "counter",
    "The GPU's energy attributed to the process in proportion to its SM utilization; "
    'pid="idle" holds the rest.', _LABELS, unit="J", source="sampled power x SM share",
    doc="The GPU's energy attributed to the process by its SM utilization; `pid=\"idle\"` "
        f"holds the rest (present only when {_ON}, on GPUs not in MIG mode).")
INFO = Family(
    "gpu_process_info", "info",
    "A GPU process: its command name and container id (from /proc, empty where unreadable), "
    "MIG GPU instance (empty on a whole GPU), and global and local rank (from its "
    "environment, empty where unknown); value 1.",
    (*_LABELS, "command", "container_id", "gpu_instance", "rank", "local_rank"),
    source="`/proc/PID/comm`, `/proc/PID/cgroup`, `/proc/PID/environ`; NVML's instance id",
    doc="A GPU process; value 1. `rank` and `local_rank` come from the environment the "
        "process started with (`RANK`, else `OMPI_COMM_WORLD_RANK`, `PMI_RANK`, "
        "`SLURM_PROCID`; `LOCAL_RANK`, else `OMPI_COMM_WORLD_LOCAL_RANK`, `SLURM_LOCALID`), "
        "which only the process's user or `CAP_SYS_PTRACE` may read. Empty labels where "
        f"unknown (present only when {_ON}).")
DROPPED = Family(
    "cte_gpu_processes_dropped_total", "counter",
    "Processes left out at --collector.processes.max, counted on every read they are left "
    "out.", source="exporter",
    doc="Processes left out at `--collector.processes.max`, on every read they are left out "
        f"(present only when {_ON}).")
PROC_ERRORS_TOTAL = Family(
    "cte_gpu_process_proc_errors_total", "counter",
    "New processes whose /proc entry, or environment, could not be read for "
    "gpu_process_info, by reason.", ("reason",), source="exporter",
    doc="New processes whose `/proc` entry could not be read: `vanished`, `read_error`; "
        "`environ_denied`: its environment was refused, its ranks are unknown "
        f"(present only when {_ON}).")

DECLARED = (MEMORY, SM, ENERGY, INFO, DROPPED, PROC_ERRORS_TOTAL)


def _text(number: int | None) -> str:
    return "" if number is None else str(number)


def processes_families(reading: ProcessesReading, snapshot: Snapshot) -> Iterator[Metric]:
    uuids = {i.index: i.uuid for i in snapshot.identities if i is not None}
    memory, sm, energy = MEMORY.gauge(), SM.gauge(), ENERGY.counter()
    info = INFO.info(by=INFO.labels)
    for process in reading.processes:
        uuid = uuids.get(process.gpu)
        if uuid is None:
            continue
        key = [str(process.gpu), uuid, str(process.pid)]
        if process.memory_used_bytes is not None:
            memory.add_metric(key, process.memory_used_bytes)
        if process.sm_utilization_ratio is not None:
            sm.add_metric(key, process.sm_utilization_ratio)
        if process.energy_joules is not None:
            energy.add_metric(key, process.energy_joules)
        labels = process.labels or ProcLabels()
        info.add_metric(key + [labels.command, labels.container_id,
                               _text(process.gpu_instance), _text(labels.rank),
                               _text(labels.local_rank)], {})
    for gpu, joules in sorted(reading.idle_energy_joules.items()):
        if gpu in uuids:
            energy.add_metric([str(gpu), uuids[gpu], IDLE_PID], joules)
    for family in (memory, sm, energy, info):
        if family.samples:
            yield family
    yield DROPPED.counter(reading.dropped_total)
    yield PROC_ERRORS_TOTAL.by_label(reading.proc_errors_total, PROC_ERRORS)
