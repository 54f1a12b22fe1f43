"""The live goodput account (analysis/goodput.py): as each snapshot is published (every
second), each GPU's state from what the stall check last read (its means over the stall
window, each GPU's compute level and floor), the stall it found, the GPUs lost or failed
by the verdict published with that snapshot, and who holds each GPU (the job
collectors' grouping). docs/goodput.md.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np

from exporter.analysis.checkpoints import describe_checkpoints
from exporter.analysis.goodput import Ledger, Second, first_rank, work_and_waiting
from exporter.analysis.stalls import StallResult

UNASSIGNED = "unassigned"  # the grouping's name for a GPU no job holds (Sampler.job_groups)


@dataclass(frozen=True)
class GoodputAnalysis:
    """The account as of one second: seconds and joules by GPU and state (N, len(STATES)),
    and each GPU's seconds not yet decided (a pause under way)."""

    time: float
    seconds: np.ndarray
    joules: np.ndarray
    pending: np.ndarray
    failures: int
    lost_progress_gpu_seconds: float  # an estimate (docs/goodput.md)
    duration_seconds: float = 0.0
    # each job's checkpoints in a line ("GPU 0 writes a checkpoint for ~20 s every ~60 s;
    # the others wait"), for the jobs that had one
    checkpoints: dict[str, str] = dataclasses.field(default_factory=dict)


class GoodputMonitor:
    def __init__(self, gpus: int, started_at: float | None = None):
        """`started_at`: when the account begins (the sampler's start): its states add up
        to the time since."""
        self.ledger = Ledger(gpus)
        self._ranks: np.ndarray | None = None  # by GPU, NaN where not known
        self._described: tuple[int, dict[str, str]] = (0, {})  # (pauses decided, lines)
        self._last = started_at
        self.cpu_seconds = 0.0  # spent in update(), for bench/bench_cpu.py

    def update(self, now: float, means: tuple[np.ndarray, np.ndarray] | None,
               floor: np.ndarray | None, level: np.ndarray | None,
               stall: StallResult | None, failed: Iterable[int],
               groups: Mapping[int, str] | None, tdp: np.ndarray | None,
               ranks: Mapping[int, int] | None = None) -> GoodputAnalysis:
        """One tick: the time since the last one goes to each GPU's state now. Without
        means (the stall check not yet running) every GPU's second has no reading.
        `ranks`: GPU -> the global rank working on it, where the processes say."""
        self._ranks = self._rank_array(ranks)
        t0, cpu0 = time.perf_counter(), time.thread_time()
        dt = 0.0 if self._last is None else max(0.0, now - self._last)
        self._last = now
        if dt > 0:
            self.ledger.step(self._second(dt, means, floor, level, stall, set(failed),
                                          groups, tdp))
        lg = self.ledger
        out = GoodputAnalysis(now, lg.seconds.copy(), lg.joules.copy(), lg.pending_seconds(),
                              lg.lost.failures, lg.lost.gpu_seconds, time.perf_counter() - t0,
                              self._checkpoint_lines())
        self.cpu_seconds += time.thread_time() - cpu0
        return out

    def _checkpoint_lines(self) -> dict[str, str]:
        """Each job's checkpoints in a line, worked out again only when a pause was
        decided (a few times an hour, not every second)."""
        lg = self.ledger
        if self._described[0] != lg.pauses_decided:
            lines = {job: describe_checkpoints(lg.job_pauses(job))
                     for job in sorted({p.job for p in lg.pauses})}
            self._described = (lg.pauses_decided,
                               {job: line for job, line in lines.items() if line})
        return self._described[1]

    def judge(self, stall: StallResult, groups: Mapping[int, str] | None) -> StallResult:
        """The stall as the account sees it: a checkpoint of the culprit's job (its first
        rank writing, in the job's rhythm) is no stall (analysis.checkpoints)."""
        if not stall.stalled or not stall.culprit_gpus:
            return stall
        culprit = stall.culprit_gpus[0]
        job = "node" if groups is None else groups.get(culprit, UNASSIGNED)
        rows = [g for g in range(self.ledger.gpus)
                if groups is None or groups.get(g, UNASSIGNED) == job]
        first = first_rank(rows, self._ranks)
        if self.ledger.stall_cause(job, stall.culprit_gpus, first) != "checkpoint":
            return stall
        return dataclasses.replace(stall, stalled=False, cause="checkpoint")

    def _rank_array(self, ranks: Mapping[int, int] | None) -> np.ndarray | None:
        if not ranks:
            return None
        out = np.full(self.ledger.gpus, np.nan)
        for gpu, rank in ranks.items():
            if 0 <= gpu < out.size:
                out[gpu] = rank
        return out

    def _second(self, dt: float, means: tuple[np.ndarray, np.ndarray] | None,
                floor: np.ndarray | None, level: np.ndarray | None,
                stall: StallResult | None, failed: set[int],
                groups: Mapping[int, str] | None, tdp: np.ndarray | None) -> Second:
        n = self.ledger.gpus
        lost = np.array([g in failed for g in range(n)])
        if means is None or floor is None or level is None:
            nothing = np.zeros(n, dtype=bool)
            power = np.full(n, np.nan)
            return Second(dt, nothing, power, nothing, nothing, nothing, lost,
                          *_holders(groups, n), ranks=self._ranks)
        power, util = means
        works, waits, busy_low = work_and_waiting(power, floor, level, util, tdp, tdp)
        named = np.zeros(n, dtype=bool)
        if stall is not None and stall.stalled:
            for g in (*stall.waiting_gpus, *stall.culprit_gpus):
                if 0 <= g < n:
                    named[g] = True
        return Second(dt, np.isfinite(power), power, works, waits, named, lost,
                      *_holders(groups, n), ranks=self._ranks, busy_low=busy_low)


def _holders(groups: Mapping[int, str] | None, n: int
             ) -> tuple[np.ndarray | None, list[str] | None]:
    """(held, job by GPU) from the grouping; (None, None) where no collector says: every
    GPU taken as held by one job."""
    if groups is None:
        return None, None
    jobs = [groups.get(g, UNASSIGNED) for g in range(n)]
    return np.array([j != UNASSIGNED for j in jobs]), jobs
