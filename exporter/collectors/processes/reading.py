"""Per GPU and process: device memory, SM utilization, and the GPU's energy split among
its processes (``--collector.processes``, off by default).

Each read, per GPU: `nvmlDeviceGetComputeRunningProcesses_v3` (~30 us: PIDs, memory, MIG
instance) and `nvmlDeviceGetProcessUtilization(lastSeen)` (~2 ms of CPU on an H200: one
sample per process that ran since `lastSeen`, its SM utilization averaged over that span).

**Energy split.** Between two reads the GPU used ΔE joules (its power samples integrated,
`CollectorContext.energy_joules`). A process whose SM utilization over the span was u
gets ΔE x u (if the shares add up past 1, as under MPS, they are scaled to 1); the rest,
ΔE x (1 - Σu), stays on the GPU as the series ``pid="idle"``: idle and static power while
no listed kernel ran, plus the share of processes not listed (past the cap, or invisible
to this exporter). So per GPU, the process counters and ``idle`` add up to the GPU's
sampled energy. A GPU with no per-process utilization (MIG mode, where NVML answers
NotSupported, or an old driver) gets no energy series at all: nothing to split by, and
power is per GPU, not per MIG instance.

**Cardinality.** Series exist for the processes NVML lists now (and, for one read, one
that exited since the last read after running in it); an exited process's series are
gone at the next read. At most ``--collector.processes.max`` processes per node: those
already exported keep their place, newcomers come in by memory; the rest are counted in
``cte_gpu_processes_dropped_total`` on every read they are left out.

**Why off by default**: per-process series churn with every PID (a restarted job is new
series), command names may be sensitive, PIDs mean something only in the host's PID
namespace, and `nvmlDeviceGetProcessUtilization` is the costliest call we make per GPU
after the energy counter: at the default interval (15 s) 8 GPUs cost ~16 ms of CPU per
read, ~0.11 % of one core.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from exporter.collectors.processes.procfs import ProcLabels, ProcReader
from exporter.sampling.collector_api import CollectorContext, RankSource

__all__ = ["GpuProcess", "ProcessesReading",
           "ProcessesCollector", "split_energy"]

_NO_INSTANCE = 0xFFFFFFFF
_NOT_AVAILABLE = (None, 0xFFFFFFFFFFFFFFFF)


@dataclass(frozen=True)
class GpuProcess:
    gpu: int
    pid: int
    memory_used_bytes: float | None  # None: not listed now (it exited during the span)
    sm_utilization_ratio: float | None  # None: the GPU gives no per-process utilization
    energy_joules: float | None  # attributed since it first showed; None as above
    gpu_instance: int | None = None  # MIG: the GPU instance it runs in
    labels: ProcLabels | None = None  # command, container and ranks, where read


@dataclass(frozen=True)
class ProcessesReading(RankSource):
    processes: tuple[GpuProcess, ...]  # by GPU, then PID
    idle_energy_joules: Mapping[int, float]  # GPU -> energy no listed process used
    dropped_total: int = 0  # processes left out at the cap, summed over reads
    proc_errors_total: Mapping[str, int] = field(default_factory=dict)

    def gpu_ranks(self) -> dict[int, int]:
        """GPU index -> the global rank of the process that holds it.

        Processes without a known rank (not a distributed job's, their environment refused,
        ``--no-collector.processes.proc-labels``) are left aside. A GPU is in the map only
        when the ranked processes on it all carry one rank: two ranks on one GPU (processes
        of two jobs, or a job restarted with another layout, whose exited process is still
        in the reading for one read) say nothing about which rank the GPU's time belongs to.
        """
        seen: dict[int, set[int]] = {}
        for process in self.processes:
            rank = process.labels.rank if process.labels is not None else None
            if rank is not None:
                seen.setdefault(process.gpu, set()).add(rank)
        return {gpu: next(iter(ranks)) for gpu, ranks in sorted(seen.items())
                if len(ranks) == 1}


def split_energy(delta: float, shares: Mapping[int, float]) -> tuple[dict[int, float], float]:
    """ΔE split by SM utilization share: (PID -> joules, the rest). Shares past a sum of
    1 (processes overlapping under MPS) are scaled down to 1; a negative or NaN share
    counts as 0."""
    clean = {pid: u if u > 0 else 0.0 for pid, u in shares.items()}
    total = sum(clean.values())
    scale = 1.0 / total if total > 1.0 else 1.0
    out = {pid: delta * u * scale for pid, u in clean.items()}
    return out, max(0.0, delta - sum(out.values()))


@dataclass
class _GpuAccount:
    """What the collector carries from one read of a GPU to the next."""

    last_seen_us: int = 0
    energy: float | None = None  # the GPU's sampled energy at the last read
    idle: float = 0.0
    per_pid: dict[int, float] = field(default_factory=dict)  # attributed joules


@dataclass(frozen=True)
class _Seen:
    """One GPU's processes as NVML gives them in one read."""

    memory: dict[int, float | None]  # PID -> bytes, for the processes listed now
    instance: dict[int, int | None]
    shares: dict[int, float] | None  # PID -> SM utilization 0-1; None: not supported


def _utilization_shares(samples: list) -> tuple[dict[int, float], int]:
    """PID -> mean SM utilization (0-1) over its samples; the newest timestamp (us)."""
    sums: dict[int, list[float]] = {}
    newest = 0
    for sample in samples:
        if sample.pid == 0:  # the driver's empty entries
            continue
        sums.setdefault(int(sample.pid), []).append(min(100.0, float(sample.smUtil)))
        newest = max(newest, int(sample.timeStamp))
    return {pid: sum(v) / len(v) / 100.0 for pid, v in sums.items()}, newest


class ProcessesCollector:
    name = "processes"

    def __init__(self, context: CollectorContext, max_processes: int,
                 procfs: str | None = None) -> None:
        self.context = context
        self.max_processes = max_processes
        self.proc = ProcReader(procfs) if procfs else None
        self._gpus: dict[int, _GpuAccount] = {}
        self._labels: dict[int, ProcLabels | None] = {}
        self._dropped = 0
        self._lock = threading.Lock()

    def read(self) -> ProcessesReading:
        with self._lock:
            seen = {gpu: s for gpu in range(self.context.gpu_count)
                    if (s := self._see(gpu)) is not None}
            kept = self._cap(seen)
            out: list[GpuProcess] = []
            idle: dict[int, float] = {}
            for gpu, now in seen.items():
                out += self._account(gpu, now, kept)
                if now.shares is not None:
                    idle[gpu] = self._gpus[gpu].idle
            self._forget_labels({p.pid for p in out})
            errors = dict(self.proc.errors) if self.proc else {}
        return ProcessesReading(tuple(out), MappingProxyType(idle), self._dropped,
                                MappingProxyType(errors))

    # -- one GPU -------------------------------------------------------------------------
    def _see(self, gpu: int) -> _Seen | None:
        """What NVML says about the GPU's processes; None when it cannot be read now
        (lost, hung, or the process list failed: its series are left out meanwhile)."""
        ctx = self.context
        backend = ctx.backend
        if backend is None or not ctx.readable(gpu):
            return None
        handle = backend.handle(gpu)
        if handle is None:
            return None
        listed = backend.call("nvmlDeviceGetComputeRunningProcesses_v3", handle, gpu=gpu)
        if listed is None:
            return None
        memory, instance = {}, {}
        for info in listed:
            pid = int(info.pid)
            used = getattr(info, "usedGpuMemory", None)
            memory[pid] = None if used in _NOT_AVAILABLE else float(used)
            gi = getattr(info, "gpuInstanceId", _NO_INSTANCE)
            instance[pid] = None if gi in (None, _NO_INSTANCE) else int(gi)
        account = self._gpus.setdefault(gpu, _GpuAccount())
        if not account.last_seen_us:
            account.last_seen_us = int(ctx.clock() * 1e6)  # nothing before the first read
        samples = backend.process_utilization(gpu, account.last_seen_us, handle)
        shares = None
        if samples is not None:
            shares, newest = _utilization_shares(samples)
            account.last_seen_us = newest or int(ctx.clock() * 1e6)
        return _Seen(memory, instance, shares)

    def _account(self, gpu: int, seen: _Seen, kept: set[tuple[int, int]]
                 ) -> list[GpuProcess]:
        """Split the GPU's energy since the last read; its processes' figures."""
        account = self._gpus[gpu]
        pids = sorted(pid for pid in set(seen.memory) | set(seen.shares or ())
                      if (gpu, pid) in kept)
        if seen.shares is not None:
            energy = self.context.energy_joules(gpu)
            if energy is not None and account.energy is not None and energy >= account.energy:
                per_pid, rest = split_energy(energy - account.energy, seen.shares)
                for pid, joules in per_pid.items():
                    if pid in pids:
                        account.per_pid[pid] = account.per_pid.get(pid, 0.0) + joules
                    else:
                        rest += joules  # a process past the cap: its share stays idle
                account.idle += rest
            account.energy = energy  # a first read, or a reset (the GPU came back): baseline
        account.per_pid = {pid: account.per_pid.get(pid, 0.0) for pid in pids}
        out = []
        for pid in pids:
            pid_share = None if seen.shares is None else seen.shares.get(pid, 0.0)
            pid_joules = None if seen.shares is None else account.per_pid[pid]
            out.append(GpuProcess(gpu, pid, seen.memory.get(pid), pid_share, pid_joules,
                                  seen.instance.get(pid), self._proc_labels(pid)))
        return out

    # -- bounds ----------------------------------------------------------------------------
    def _cap(self, seen: dict[int, _Seen]) -> set[tuple[int, int]]:
        """(GPU, PID) pairs exported this read: those already exported first, then new
        ones by memory; the rest counted as dropped."""
        known = {(gpu, pid) for gpu, account in self._gpus.items() for pid in account.per_pid}
        candidates = []
        for gpu, now in seen.items():
            for pid in set(now.memory) | set(now.shares or ()):
                memory = now.memory.get(pid) or 0.0
                candidates.append(((gpu, pid) not in known, -memory, gpu, pid))
        candidates.sort()
        kept = {(gpu, pid) for _, _, gpu, pid in candidates[:self.max_processes]}
        self._dropped += max(0, len(candidates) - self.max_processes)
        return kept

    def _proc_labels(self, pid: int) -> ProcLabels | None:
        if self.proc is None:
            return None
        if pid not in self._labels:
            self._labels[pid] = self.proc.labels(pid)
        return self._labels[pid]

    def _forget_labels(self, pids: set[int]) -> None:
        """A PID that left may be reused by another process: read it afresh then."""
        for pid in [p for p in self._labels if p not in pids]:
            del self._labels[pid]
