"""Goodput: where each GPU's seconds go, read from the GPUs alone (docs/goodput.md).

Every second of every GPU gets one state (:data:`STATES`), from what the GPUs show:

- ``unallocated``: no job holds it (only where attribution is known: Slurm, Kubernetes);
- ``failed``: held while its verdict is failed, or it is lost (NVML: GpuIsLost; offline:
  its readings stopped for good while its peers went on);
- ``unknown``: no reading the account can bridge (a hole longer than ``bridge_seconds``);
- ``stalled``: in a pause of its job that is no checkpoint, it busy-waits or holds its
  peers up (a hung or slow GPU); busy-waiting while a GPU of its job has failed (a hung
  peer), at once; busy-waiting longer than ``fill_seconds`` while its job works;
- ``productive``: it works (power at its compute level; high utilization above the spin
  level; utilization where power is flat), and short dips (a step's communication phase,
  under ``fill_seconds``) are part of it, so are a pause's edges that look like that phase
  (every GPU of the job busy at low power: analysis.goodput_stretch) and the low seconds
  between a job's first seconds of work; busy-waiting never is;
- ``checkpoint``: a pause inside a running job, followed by work again within
  ``max_checkpoint_seconds``, that looks like a checkpoint and keeps the job's rhythm
  (analysis.checkpoints: sharded, or written by rank 0 while the others spin);
- ``starting``: held and low before the job's first steps, or after a failure until the
  job steps again (a restart), for at most ``max_start_seconds``;
- ``idle``: held and low otherwise (a GPU low alone, a pause too long for a checkpoint,
  the time after a job's last steps).

One mechanism serves the live exporter and ``analyze``: :class:`Ledger` takes one second
of evidence at a time.  A low stretch after steps is *pending* until it is decided: work
again (productive when short; else, in a pause judged a checkpoint, checkpoint; otherwise
stalled for the seconds it waited or held its peers up, checkpoint for those the job was
low together, idle for the rest), too long (idle), a failure (starting: the recovery), or
the end (idle); waiting is stalled in all three.  So the live counters lag by at most
``max_checkpoint_seconds`` while a pause lasts.

Pure numpy: no NVML, HTTP or Prometheus.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from exporter.analysis.checkpoints import (
    CHECKPOINT_LOOKS,
    CULPRIT,
    SPIN_CEILING_SHARE,
    TOGETHER,
    WRITER,
    Pause,
    Rhythm,
    pause_look,
)
from exporter.analysis.goodput_stretch import ALONE, AT, WAITS, Stretch
from exporter.analysis.stalls import StallThresholds

PRODUCTIVE, CHECKPOINT, STALLED, STARTING, IDLE, FAILED, UNALLOCATED, UNKNOWN = range(8)
STATES = ("productive", "checkpoint", "stalled", "starting", "idle", "failed", "unallocated",
          "unknown")
NOT_HELD = ("unallocated", "unknown")  # left out of the goodput ratio's denominator

# The seam with the trace's gap rule: a hole in a GPU's readings up to this long (or
# BRIDGE_INTERVALS of its sampling interval, whichever is longer) holds the GPU's last
# state; a longer one is `unknown`.  Reasoned, not tuned: a checkpoint pause lasts longer
# than this, so a bridged hole cannot hide one.
BRIDGE_SECONDS = 5.0
BRIDGE_INTERVALS = 3.0


def bridge_limit(sample_interval_seconds: float) -> float:
    """The longest hole in a GPU's readings the account bridges (see BRIDGE_SECONDS)."""
    return max(BRIDGE_SECONDS, BRIDGE_INTERVALS * sample_interval_seconds)


@dataclass(frozen=True)
class GoodputThresholds:
    """The rules' numbers (docs/goodput.md says where each comes from: the busy-wait pair is
    the stall check's; the rest are reasoned, not measured on hardware)."""

    # halfway from idle to the compute level: a step's low phase sits below, its compute
    # phase above (the midpoint the power-swing analyses split phases at)
    busy_share: float = 0.5  # working: power past floor + this share of (level - floor) ...
    # a range under 30 % of the level is no swing to split (an idle or a flat GPU)
    min_range_share: float = 0.3  # ... where the GPU's range (level - floor) is >= this * level
    # an idle H100 draws about a tenth of its 700 W limit (the nanoGPT log's 1st percentile:
    # 72-82 W per GPU): three times that is work, a floor past a quarter never idled
    working_tdp_share: float = 0.3  # flat power: working at >= this share of the power limit
    idle_tdp_share: float = 0.25  # a floor above this share of the limit was never idle
    working_utilization: float = 0.5  # flat power, no limit known: working at this utilization
    working_watts: float = 100.0  # flat power, neither known: working above this (idle H100)
    job_working_share: float = 0.5  # a job works while most of its live GPUs do
    # busy-waiting: utilization >= this at power <= wait_level * its compute level (the
    # stall check's signature and numbers)
    wait_utilization: float = StallThresholds().busy_utilization
    wait_level: float = StallThresholds().wait_level
    # ... or, the power limit known, at power <= this share of it (analysis.checkpoints)
    spin_ceiling_share: float = SPIN_CEILING_SHARE
    fill_seconds: float = 3.0  # a low stretch shorter than this inside work is work
    step_seconds: float = 3.0  # a job steps once it has worked this long
    max_checkpoint_seconds: float = 900.0  # a longer pause is idle, not a checkpoint
    max_start_seconds: float = 1800.0  # a longer start (or recovery) is idle
    bridge_seconds: float = BRIDGE_SECONDS


# of a GPU's power: near idle, and computing (the stall check's compute level is its p95 too)
FLOOR_PERCENTILE, LEVEL_PERCENTILE = 1.0, 95.0


def working(power: np.ndarray, floor: np.ndarray, level: np.ndarray,
            utilization: np.ndarray | None = None, tdp: np.ndarray | None = None,
            th: GoodputThresholds = GoodputThresholds()) -> np.ndarray:
    """Whether each GPU works, from its power (N,) or (N, T) against its own floor and
    compute level (N,) (:data:`FLOOR_PERCENTILE`, :data:`LEVEL_PERCENTILE` of its power):
    past the midpoint where the range is wide enough to split (and, the power limit
    known, the floor near idle); otherwise its power against the power limit, else the
    utilization, else ``working_watts``."""
    p = np.asarray(power, dtype=np.float64)
    lo = np.asarray(floor, dtype=np.float64)
    hi = np.asarray(level, dtype=np.float64)
    if p.ndim == 2:
        lo, hi = lo[:, None], hi[:, None]
    with np.errstate(invalid="ignore"):
        split = (hi - lo) >= th.min_range_share * hi
        by_power = p >= lo + th.busy_share * (hi - lo)
        flat = np.broadcast_to(hi >= th.working_watts, p.shape).copy()
        if utilization is not None:
            u = np.asarray(utilization, dtype=np.float64)
            flat = np.where(np.isfinite(u), u >= th.working_utilization, flat)
        if tdp is not None:
            limit = np.asarray(tdp, dtype=np.float64)
            limit = limit[:, None] if p.ndim == 2 else limit
            by_limit = p >= th.working_tdp_share * limit
            flat = np.where(np.isfinite(limit), by_limit, flat)
            split &= ~(lo > th.idle_tdp_share * limit)
        return np.where(split, by_power, flat) & np.isfinite(p)


def busy_waiting(power: np.ndarray, level: np.ndarray, utilization: np.ndarray | None,
                 th: GoodputThresholds = GoodputThresholds(),
                 tdp: np.ndarray | None = None) -> np.ndarray:
    """Waiting in a collective: high utilization at low power. Low: under
    ``spin_ceiling_share`` of the power limit where it is known (NCCL's busy-wait sits near
    a fifth of it whatever the job computes: analysis.checkpoints), else under
    ``wait_level`` of the GPU's own compute level (the stall check's rule)."""
    p = np.asarray(power, dtype=np.float64)
    if utilization is None:
        return np.zeros(p.shape, dtype=bool)
    lv = np.asarray(level, dtype=np.float64)
    lv = lv[:, None] if p.ndim == 2 else lv
    with np.errstate(invalid="ignore"):
        ceiling = th.wait_level * lv
        if tdp is not None:
            limit = np.asarray(tdp, dtype=np.float64)
            limit = limit[:, None] if p.ndim == 2 else limit
            ceiling = np.where(np.isfinite(limit), th.spin_ceiling_share * limit, ceiling)
        return (np.asarray(utilization) >= th.wait_utilization) & (p <= ceiling)


def work_and_waiting(power: np.ndarray, floor: np.ndarray, level: np.ndarray,
                     utilization: np.ndarray | None, tdp: np.ndarray | None,
                     limit: np.ndarray | None,
                     th: GoodputThresholds = GoodputThresholds()
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Whether each GPU works, whether it busy-waits, and whether it is busy at low power:
    :func:`working`, or busy (high utilization) above the spin level, which is a kernel
    that computes (so a compute level set high by minutes at the power cap does not make
    later, lighter steps idle); :func:`busy_waiting` against ``limit`` (the power limit,
    or a stand-in for it); and busy without the power :func:`working` asks (waiting, or a
    step's communication phase: NCCL's kernels moving data)."""
    computes = working(power, floor, level, utilization, tdp, th)
    waits = busy_waiting(power, level, utilization, th, limit)
    if utilization is None:
        return computes & ~waits, waits, np.zeros(computes.shape, dtype=bool)
    with np.errstate(invalid="ignore"):
        busy = (np.asarray(utilization) >= th.wait_utilization) & (
            np.isfinite(np.asarray(power, dtype=np.float64)))
    return (computes | busy) & ~waits, waits, busy & (waits | ~computes)


@dataclass(frozen=True)
class Second:
    """One second (or ``dt``) of evidence, each array (N,) over the node's GPUs."""

    dt: float
    has: np.ndarray  # a reading (power) this second
    power: np.ndarray  # watts (NaN without a reading)
    working: np.ndarray
    waiting: np.ndarray  # busy-waiting (see busy_waiting)
    stalled: np.ndarray  # named by the stall check (waiting or culprit)
    failed: np.ndarray  # lost, or its verdict is failed
    held: np.ndarray | None = None  # a job holds it (None: attribution unknown: all held)
    jobs: Sequence[str] | None = None  # which job, by GPU (None: one job holds every GPU)
    # each GPU's global rank where the processes say (NaN: not known); a job none of whose
    # GPUs here has a known rank takes its lowest-numbered GPU for rank 0 (the launchers'
    # usual order)
    ranks: np.ndarray | None = None
    # busy at low power (work_and_waiting): what a step's communication phase shows (None:
    # not known)
    busy_low: np.ndarray | None = None


@dataclass
class _JobPause:
    """A job's pause under way: when it began, the work before it, seconds by look."""

    serial: int
    start: float
    work_before: float
    work_since_look: float
    writer: int | None = None
    seconds_by: dict[str, float] = field(default_factory=dict)

    def look(self) -> str:
        return max(self.seconds_by, key=self.seconds_by.__getitem__)


@dataclass
class _Job:
    stepped: bool = False  # has stepped since it began (or since its last failure)
    starting_seconds: float = 0.0
    working_seconds: float = 0.0  # it steps once this reaches fill_seconds
    worked: float = 0.0  # seconds it stepped since its last checkpoint (or first steps)
    worked_since_look: float = 0.0  # ... since its last pause that looked like one
    checkpointed: bool = False  # a checkpoint since it began (or restarted)
    pause: _JobPause | None = None
    serials: int = 0
    verdicts: dict[int, bool] = field(default_factory=dict)  # closed pauses: checkpoint?
    rhythm: Rhythm = field(default_factory=Rhythm)

    def is_checkpoint(self, in_pause: dict[int, float]) -> bool:
        """Whether a GPU's stretch, by its seconds in each of the job's pauses, was mostly
        checkpoint: each pause as decided when it closed, else (a GPU back at work before
        its job) as its look and length so far say."""
        def verdict(serial: int) -> bool:
            if serial in self.verdicts:
                return self.verdicts[serial]
            p = self.pause
            return p is not None and p.serial == serial and self.judge(
                p, sum(p.seconds_by.values()))
        yes = sum(s for serial, s in in_pause.items() if verdict(serial))
        return yes > 0 and yes >= 0.5 * sum(in_pause.values())

    def judge(self, p: _JobPause, seconds: float, ongoing: bool = False) -> bool:
        """A checkpoint: every GPU low together, or a look a checkpoint can have that keeps
        the job's rhythm (analysis.checkpoints; ``ongoing``: still under way)."""
        look = p.look()
        return look == TOGETHER or (look in CHECKPOINT_LOOKS and self.rhythm.admits(
            look, (p.work_before, p.work_since_look), seconds, ongoing))


@dataclass(frozen=True)
class _Evidence:
    """A second's evidence by GPU (N,): with a reading and held and not failed (live),
    working, busy-waiting, named by the stall check, failed."""

    live: np.ndarray
    works: np.ndarray
    waits: np.ndarray
    named: np.ndarray
    failed: np.ndarray


@dataclass
class LostProgress:
    """Progress a job likely lost to failures: the seconds it stepped since its last
    checkpoint before each failure, on each of its GPUs. An estimate: power cannot see
    what a job actually rolls back to."""

    failures: int = 0
    gpu_seconds: float = 0.0


@dataclass
class Ledger:
    """The account of N GPUs: seconds and joules per state, one second at a time."""

    gpus: int
    thresholds: GoodputThresholds = field(default_factory=GoodputThresholds)

    def __post_init__(self) -> None:
        n = self.gpus
        self.seconds = np.zeros((n, len(STATES)))
        self.joules = np.zeros((n, len(STATES)))
        self.lost = LostProgress()
        self.clock = 0.0  # seconds since the account began
        self.pauses: list[Pause] = []  # every job's pauses as decided, the last MAX_PAUSES
        self.pauses_decided = 0  # ever (the list keeps the last MAX_PAUSES)
        self._jobs: dict[str, _Job] = {}
        self._pending: list[Stretch | None] = [None] * n
        self._long_low = [False] * n  # low past max_checkpoint: idle until it works again
        self._last: list[int | None] = [None] * n  # last state (None: pending), to bridge
        self._hole = [0.0] * n  # seconds without a reading so far
        self._since_checkpoint = np.zeros(n)  # productive seconds since the last checkpoint

    # ------------------------------------------------------------------ bookkeeping
    def _add(self, gpu: int, state: int, seconds: float, joules: float) -> None:
        self.seconds[gpu, state] += seconds
        self.joules[gpu, state] += joules
        if state == PRODUCTIVE:
            self._since_checkpoint[gpu] += seconds
        elif state == CHECKPOINT and seconds > 0:
            self._since_checkpoint[gpu] = 0.0  # the job saved its progress here

    def _resolve(self, gpu: int, how: str, job: _Job | None = None) -> None:
        """Decide a GPU's pending stretch: ``work`` (steps again), ``failure``, ``idle``.
        A stretch shorter than fill_seconds that ends in work was work (a step's low
        phase). Otherwise, ending in work, a pause its job's verdict calls a checkpoint is
        checkpoint (its seconds low alone too: the writer starts before its peers wait),
        else its waiting seconds were a stall, the job's together a checkpoint, its own
        idle; ending in a failure, waiting was a stall and low a recovery (starting);
        else waiting was a stall and low idle."""
        p = self._pending[gpu]
        if p is None:
            return
        self._pending[gpu] = None
        th = self.thresholds
        if how == "work" and p.seconds < th.fill_seconds:
            self._add(gpu, PRODUCTIVE, p.seconds, float(p.joules_by.sum()))
            return
        # a pause's edges that show what the steps' communication phase shows (every GPU
        # of the job busy at low power) are the steps': the pause begins where its own
        # look does (a GPU near idle, or one holding its peers up)
        edge = p.trim(trail=how == "work")
        self._add(gpu, PRODUCTIVE, *edge)
        sec, jou = p.seconds_by, p.joules_by
        if how == "work" and p.seconds + edge[0] <= th.max_checkpoint_seconds and (
                job is not None and job.is_checkpoint(p.in_pause)):
            self._add(gpu, CHECKPOINT, float(sec.sum()), float(jou.sum()))
            return
        waits = sec[WAITS].sum(), jou[WAITS].sum()
        self._add(gpu, STALLED, float(waits[0]), float(waits[1]))
        together, alone = AT[TOGETHER], AT[ALONE]
        if how == "failure":
            low = STARTING, STARTING
        elif how == "work" and p.seconds + edge[0] <= th.max_checkpoint_seconds:
            low = CHECKPOINT, IDLE
        else:
            low = IDLE, IDLE
        self._add(gpu, low[0], float(sec[together]), float(jou[together]))
        self._add(gpu, low[1], float(sec[alone]), float(jou[alone]))

    def stall_cause(self, job: str, culprits: Sequence[int], first: int | None) -> str:
        """The cause of a stall the stall check sees now (live): ``checkpoint`` when its
        one culprit is the job's first rank and the pause keeps the job's rhythm so far
        (not yet twice as long as its checkpoints), else ``stall``."""
        j = self._jobs.get(job)
        if j is None or not j.stepped or list(culprits) != [first]:
            return "stall"
        p = j.pause
        length = sum(p.seconds_by.values()) if p is not None else 0.0
        gaps = (p.work_before, p.work_since_look) if p is not None else (
            j.worked, j.worked_since_look)
        ckpt = j.rhythm.admits(WRITER, gaps, length, ongoing=True)
        return "checkpoint" if ckpt else "stall"

    def checkpoint_within(self, seconds: float) -> bool:
        """Whether a job checkpointed in the last ``seconds``: a pause decided a checkpoint
        that ended then, or one under way that looks like one and keeps its job's rhythm."""
        since = self.clock - seconds
        for p in reversed(self.pauses):
            if p.start + p.seconds < since:
                break
            if p.cause == "checkpoint":
                return True
        return any(j.pause is not None and j.judge(
            j.pause, sum(j.pause.seconds_by.values()), ongoing=True)
            for j in self._jobs.values())

    def job_pauses(self, job: str) -> list[Pause]:
        return [p for p in self.pauses if p.job == job]

    def pending_seconds(self) -> np.ndarray:
        """Each GPU's seconds not yet decided (a pause under way)."""
        return np.array([p.seconds if p else 0.0 for p in self._pending])

    def close(self) -> None:
        """The end of the account (offline): every pause still open is idle."""
        for gpu in range(self.gpus):
            self._resolve(gpu, "idle")

    # ------------------------------------------------------------------ one second
    def step(self, s: Second) -> None:
        n, dt = self.gpus, s.dt
        held = np.ones(n, dtype=bool) if s.held is None else np.asarray(s.held, dtype=bool)
        jobs = [str(j) for j in s.jobs] if s.jobs is not None else ["node"] * n
        joules = np.where(np.isfinite(s.power), s.power, 0.0) * dt
        failed = np.asarray(s.failed, dtype=bool) & held
        live = held & ~failed & np.asarray(s.has, dtype=bool)
        # busy-waiting is never work, whatever the power says
        waits = live & np.asarray(s.waiting, dtype=bool)
        works = live & np.asarray(s.working, dtype=bool) & ~waits
        named = live & np.asarray(s.stalled, dtype=bool)
        rows_of: dict[str, list[int]] = {}
        for gpu in range(n):
            if held[gpu]:
                rows_of.setdefault(jobs[gpu], []).append(gpu)
        for name in [j for j in self._jobs if j not in rows_of]:
            del self._jobs[name]
        stalled = np.zeros(n, dtype=bool)  # stalled at once
        look: list[str | None] = [None] * n  # a pending second's look
        for name, rows in rows_of.items():
            self._job_second(name, rows, dt, _Evidence(live, works, waits, named, failed),
                             s.ranks, stalled, look)
        comm: dict[str, bool] = {}  # jobs showing the steps' communication phase
        for gpu in range(n):
            job = self._jobs.get(jobs[gpu]) if held[gpu] else None
            state = self._state(gpu, s, held, failed, works, stalled, look, job)
            if state is None:
                name = jobs[gpu]
                if name not in comm:  # only for a job with a GPU pending (seldom)
                    comm[name] = _communicates(rows_of[name], live, s.busy_low)
                self._hold_back(gpu, look[gpu] or ALONE, dt, joules[gpu], job, comm[name])
            else:
                self._add(gpu, state, dt, joules[gpu])
            self._last[gpu] = state
        self.clock += dt

    def _job_second(self, name: str, rows: list[int], dt: float, e: _Evidence,
                    ranks: np.ndarray | None, stalled: np.ndarray,
                    look: list[str | None]) -> None:
        """One job's second: whether it works (and so steps), and, paused after steps,
        how its pause looks; marks the GPUs stalled at once and each pending GPU's look."""
        job = self._job(name, rows, e.failed)
        # a job works while most of its live GPUs do and no more than a few wait
        mine, share = e.live[rows], self.thresholds.job_working_share
        job_works = bool(mine.any()) and e.works[rows].sum() >= share * mine.sum() and (
            e.waits[rows].sum() < share * mine.sum())
        if job_works:
            job.working_seconds += dt
            job.stepped |= job.working_seconds >= self.thresholds.step_seconds
        elif not job.stepped:
            job.starting_seconds += dt
        if e.failed[rows].any():  # busy-waiting on a hung (failed) peer: a stall at once
            stalled[rows] |= e.waits[rows]
            return
        if not job.stepped:
            return
        if job_works:
            self._close_pause(name, job)
            job.worked += dt
            job.worked_since_look += dt
            for g in rows:  # the job works: a GPU low or waiting is so alone
                if e.live[g] and (not e.works[g] or e.named[g]):
                    look[g] = CULPRIT if e.waits[g] or e.named[g] else ALONE
            return
        first = first_rank(rows, ranks)
        live_rows = [g for g in rows if e.live[g]]
        seen = pause_look([not e.works[g] and not e.waits[g] for g in live_rows],
                          [bool(e.waits[g]) for g in live_rows],
                          live_rows.index(first) if first in live_rows else None)
        if seen is None:  # still computing while it does not count as working
            return
        self._open_pause(job, seen, dt, first if seen == WRITER else None)
        for g in live_rows:
            # a GPU that holds up its peers while still computing is stalled with them
            if not e.works[g] or seen == CULPRIT or e.named[g]:
                look[g] = seen

    def _open_pause(self, job: _Job, seen: str, dt: float, writer: int | None) -> None:
        if job.pause is None:
            job.serials += 1
            job.pause = _JobPause(job.serials, self.clock, job.worked, job.worked_since_look)
        job.pause.seconds_by[seen] = job.pause.seconds_by.get(seen, 0.0) + dt
        if writer is not None:
            job.pause.writer = writer

    def _close_pause(self, name: str, job: _Job) -> None:
        """The job works again: its pause, if one was under way, is decided. A pause shorter
        than fill_seconds was a step's low phase; a longer one is a checkpoint by its look
        and the job's rhythm (analysis.checkpoints), else a stall."""
        p, job.pause = job.pause, None
        if p is None:
            return
        seconds = sum(p.seconds_by.values())
        if seconds < self.thresholds.fill_seconds:
            # a step's low phase: the job stepped, and its period counts it (else a period
            # read while the sensor catches a step's low phase more or less often, readings
            # beating with the steps, would stray from the job's own)
            job.worked += seconds
            job.worked_since_look += seconds
            return
        look = p.look()
        ckpt = seconds <= self.thresholds.max_checkpoint_seconds and job.judge(p, seconds)
        if look in CHECKPOINT_LOOKS:
            job.worked_since_look = 0.0
        job.verdicts[p.serial] = ckpt
        job.verdicts.pop(p.serial - MAX_PAUSES, None)  # no stretch lasts that many pauses
        if ckpt:
            job.rhythm.add(look, p.work_before if job.checkpointed else None, seconds,
                           lead=None if job.checkpointed else p.work_before,
                           since_look=p.work_since_look)
            job.checkpointed = True
            job.worked = 0.0
        elif look in CHECKPOINT_LOOKS:
            job.rhythm.breaks(look, p.work_since_look, seconds)
        self.pauses.append(Pause(name, p.start, seconds, look,
                                 "checkpoint" if ckpt else "stall", p.writer, p.work_before))
        self.pauses_decided += 1
        del self.pauses[:-MAX_PAUSES]

    def _job(self, name: str, rows: list[int], failed: np.ndarray) -> _Job:
        """The job's state this second: a new name is a new job (starting); a GPU newly
        failed restarts it, and the progress since its checkpoint counts as lost."""
        job = self._jobs.setdefault(name, _Job())
        if any(failed[g] and self._last[g] != FAILED for g in rows):
            for g in rows:
                self._resolve(g, "failure")
                self._long_low[g] = False
            if job.stepped:
                self.lost.failures += 1
                self.lost.gpu_seconds += float(self._since_checkpoint[rows].sum())
            self._since_checkpoint[rows] = 0.0
            job.stepped, job.starting_seconds, job.working_seconds = False, 0.0, 0.0
            # the restart counts its period anew
            job.worked, job.worked_since_look, job.pause = 0.0, 0.0, None
            job.checkpointed = False
        return job

    def _hold_back(self, gpu: int, look: str, dt: float, joules: float,
                   job: _Job | None, comm: bool = False) -> None:
        """A second after steps that is not work: pending until its stretch is decided;
        ``comm``: its job showed the steps' communication phase."""
        p = self._pending[gpu] or Stretch()
        self._pending[gpu] = p
        p.add(AT[look], dt, joules, comm)
        if job is not None and job.pause is not None and look != ALONE:
            serial = job.pause.serial
            p.in_pause[serial] = p.in_pause.get(serial, 0.0) + dt
        if p.seconds > self.thresholds.max_checkpoint_seconds:
            self._resolve(gpu, "idle")
            self._long_low[gpu] = True

    def _state(self, gpu: int, s: Second, held: np.ndarray, failed: np.ndarray,
               works: np.ndarray, stalled: np.ndarray, look: list[str | None],
               job: _Job | None) -> int | None:
        """This second's state of one GPU; None: low after steps, pending."""
        th = self.thresholds
        if not held[gpu] or job is None:
            self._resolve(gpu, "idle")
            return UNALLOCATED
        if failed[gpu]:
            self._hole[gpu] = 0.0
            return FAILED
        if not s.has[gpu]:
            self._hole[gpu] += s.dt
            if self._hole[gpu] <= th.bridge_seconds and (
                    self._last[gpu] is not None or self._pending[gpu] is not None):
                return self._last[gpu]  # bridged: the state it was in
            self._resolve(gpu, "idle")
            return UNKNOWN
        self._hole[gpu] = 0.0
        if stalled[gpu]:
            self._resolve(gpu, "work" if job.stepped else "failure", job)
            return STALLED
        if works[gpu] and look[gpu] is None:
            self._resolve(gpu, "work", job)
            self._long_low[gpu] = False
            return PRODUCTIVE
        if not job.stepped:
            # low between the job's first seconds of work: a step's low phase if the steps
            # go on, its start if it stays low as long as a pause must last
            p = self._pending[gpu]
            if job.working_seconds > 0 and (p.seconds if p else 0.0) + s.dt < th.fill_seconds:
                return None
            self._resolve(gpu, "failure")
            return STARTING if job.starting_seconds <= th.max_start_seconds else IDLE
        if self._long_low[gpu] and look[gpu] in (None, ALONE, TOGETHER):
            return IDLE
        return None


def _communicates(rows: list[int], live: np.ndarray, busy_low: np.ndarray | None) -> bool:
    """Whether a job shows what its steps' communication phase shows: every live GPU of
    it busy at low power (False where that is not known)."""
    if busy_low is None:
        return False
    mine = [g for g in rows if live[g]]
    return bool(mine) and all(busy_low[g] for g in mine)


def first_rank(rows: Sequence[int], ranks: np.ndarray | None) -> int | None:
    """The GPU of a job's rank 0 among its GPUs here (``rows``): as the processes say
    where they know a rank of the job (None: rank 0 is on another node), else its
    lowest-numbered GPU."""
    known = [g for g in rows if ranks is not None and np.isfinite(ranks[g])]
    if not known:
        return rows[0] if rows else None
    return next((g for g in known if ranks is not None and ranks[g] == 0), None)


# the pauses the ledger keeps for its reports (a day of one checkpoint a minute is more)
MAX_PAUSES = 2000


def goodput_ratio(seconds: np.ndarray) -> float | None:
    """Productive over held time (every state but unallocated and unknown), from seconds
    by state (len(STATES),) or (N, len(STATES)); None when nothing was held."""
    s = np.asarray(seconds, dtype=np.float64).reshape(-1, len(STATES)).sum(axis=0)
    held = s[[STATES.index(x) for x in STATES if x not in NOT_HELD]].sum()
    return float(s[PRODUCTIVE] / held) if held > 0 else None
