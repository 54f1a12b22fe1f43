"""Checkpoints against fault stalls: what a job's pause looks like from its GPUs, and
whether it keeps the job's rhythm (docs/goodput.md, "Checkpoints and stalls").

A pause inside a running job has one of four looks, second by second:

- ``TOGETHER``: every GPU of the job near idle at once: a sharded checkpoint (every rank
  writes its shard), or an evaluation or data wait of the whole job;
- ``WRITER``: the job's first rank near idle while every other GPU busy-waits in a
  collective: a checkpoint saved by rank 0 (``if rank == 0: torch.save(...)``), the others
  spinning in NCCL until it joins them;
- ``ELSEWHERE``: every GPU busy-waits, none here holds them up: they wait on a GPU of
  another node (its rank 0 writing, or a fault there);
- ``CULPRIT``: a GPU other than the first rank is low or still computing while its
  peers busy-wait: a fault stall (a hung or slow GPU).

A checkpoint recurs every N steps and lasts about as long as the last one (its size over
the disk's speed); a fault comes at irregular times with irregular lengths. So a
``WRITER`` or ``ELSEWHERE`` pause is a checkpoint while it keeps the job's rhythm
(:class:`Rhythm`), a stall when it breaks it; a ``TOGETHER`` pause is a checkpoint (no
fault stops every GPU of a job at once and lets it go on); a ``CULPRIT`` pause is a stall.

Pure Python: no NVML, HTTP or Prometheus.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

TOGETHER, WRITER, ELSEWHERE, CULPRIT = "together", "writer", "elsewhere", "culprit"
CHECKPOINT_LOOKS = (TOGETHER, WRITER, ELSEWHERE)  # the looks a checkpoint can have


def _median(values: Iterable[float]) -> float:
    """statistics.median of a non-empty iterable, which imports decimal and fractions
    (~0.5 MiB resident) for the middle of the sorted values or the mean of the middle two."""
    data = sorted(values)
    half = len(data) // 2
    return data[half] if len(data) % 2 else (data[half - 1] + data[half]) / 2


@dataclass(frozen=True)
class PowerLevels:
    """A GPU model's power levels as shares of its power limit (TDP), each with its source."""

    idle: float
    spin: float  # busy-waiting in a NCCL collective: ~100 % utilization at this power
    compute: float  # a training step's compute phase
    sources: str


# The levels the rules below rest on (docs/goodput.md, "Checkpoints and stalls").
MODEL_LEVELS: dict[str, PowerLevels] = {
    # Hopper parts share them (the H200 has the same 700 W limit and the same chip); other
    # models are judged with them too until measured
    "H100": PowerLevels(
        idle=0.11, spin=0.21, compute=0.78,
        sources="idle: the 1st percentile of the 8x H100 nanoGPT log, 72-82 W of 700 W; "
                "spin: NCCL's busy-wait on H100 at ~150 W of 700 W while rank 0 writes a "
                "checkpoint (real 8x H100 data-parallel runs); compute: 75-80 % of the "
                "limit training an 8B model on H100"),
}
# the lightest compute level seen on real hardware: the nanoGPT log's 124M-parameter steps
# at ~390 W of 700 W
LIGHTEST_COMPUTE_SHARE = 0.56

# Busy-waiting is high utilization at power under this share of the power limit: the spin
# level plus the spread between boards and noise (0.17-0.25), well under the lightest
# compute level and under what a light job's steps average to (a compute phase with a
# communication phase at a quarter of it). Against the limit, not the GPU's own compute
# level: a level set high by minutes at the power cap must not make later, lighter steps
# look like waiting, and a job that never shows its level (a checkpoint every step) must
# still be seen waiting.
SPIN_CEILING_SHARE = 0.3


@dataclass(frozen=True)
class RhythmThresholds:
    """How far a checkpoint may stray from the job's last ones (reasoned, not tuned: a
    checkpoint's length follows its size over the disk's speed, which varies with the
    file system's load; its period is N steps, which varies with the step time)."""

    length_factor: float = 2.0  # length within [median / 2, median * 2]
    gap_share: float = 0.3  # work since the last checkpoint within +-30 % of the median ...
    gap_slack_seconds: float = 5.0  # ... or this much, whichever is larger (short periods)
    memory: int = 8  # the last checkpoints the rhythm is taken from


@dataclass
class Rhythm:
    """One job's checkpoints so far: the look of each, its length, and the work between
    checkpoints (seconds the job stepped from one to the next, a step's low phase too; not
    the work before its first, nor the first after a restart: a job warms up, or resumes
    mid-period from the checkpoint it loaded; that work is a floor to the period while
    there is none)."""

    thresholds: RhythmThresholds = field(default_factory=RhythmThresholds)
    looks: list[str] = field(default_factory=list)
    gaps: list[float] = field(default_factory=list)
    lengths: list[float] = field(default_factory=list)
    # the work before the job's first checkpoint (or its first after a restart): no period,
    # but a floor to it while there is none (see admits)
    lead: float | None = None
    # the last pause that had the checkpoints' look and length but broke their period: the
    # work since the look-alike pause before it (None: none, or the last kept the rhythm)
    stray: float | None = None

    def admits(self, look: str, gaps: tuple[float, ...], length: float,
               ongoing: bool = False) -> bool:
        """Whether a pause of ``look``, ``length`` long, keeps the rhythm: the look its
        checkpoints had, a length near theirs, and work before it near their period, from
        one of ``gaps`` (since the last checkpoint, or, the last of them, since the last
        pause that looked like one: a checkpoint taken for a stall does not throw the next
        one off); ``ongoing``: the pause is still under way, only too long breaks it. With
        no checkpoint yet there is nothing it could break: it does (the commonest pause
        of rank 0 is its checkpoint; docs/goodput.md says the limit)."""
        if not self.lengths:
            return True
        return self._fits(look, length, ongoing) and (
            self._keeps_period(gaps) or (bool(gaps) and self._steady(gaps[-1])))

    def _fits(self, look: str, length: float, ongoing: bool = False) -> bool:
        """The checkpoints' look and a length near theirs."""
        if look not in self.looks:
            return False
        typical = _median(self.lengths)
        shortest = 0.0 if ongoing else typical / self.thresholds.length_factor
        return shortest <= length <= typical * self.thresholds.length_factor

    def _keeps_period(self, gaps: tuple[float, ...]) -> bool:
        if not self.gaps:
            # no period seen yet: work near the lead's or more. A job checkpoints every N
            # steps, its first after N steps too (warm-up or a stall only lengthen it; a
            # restart mid-period shortens it, so it holds the floor lower), so a pause
            # after much less work than that is early: a fault of rank 0, which would else
            # set the period and break every checkpoint after it
            return self.lead is None or any(
                gap >= self.lead - self._slack(self.lead) for gap in gaps)
        period = _median(self.gaps)
        return any(abs(gap - period) <= self._slack(period) for gap in gaps)

    def _steady(self, since_look: float) -> bool:
        """A rhythm of its own: the last two pauses with the checkpoints' look and length
        came after the same work, each since the look-alike pause before it, though off
        the period the rhythm holds (a fault taken for a checkpoint set it, or the job
        checkpoints at another period now, after a restart): a fault does not recur at a
        steady period with a checkpoint's length, so the rhythm follows."""
        return self.stray is not None and abs(since_look - self.stray) <= self._slack(
            self.stray)

    def _slack(self, period: float) -> float:
        return max(self.thresholds.gap_share * period, self.thresholds.gap_slack_seconds)

    def add(self, look: str, gap: float | None, length: float,
            lead: float | None = None, since_look: float | None = None) -> None:
        """A checkpoint; ``gap``: the work since the previous one (None: since the job's
        start or restart); ``lead``: the work since the job's start or restart, for its
        first checkpoint then; ``since_look``: the work since the last pause that looked
        like one (where it kept a rhythm of its own, the period starts anew from it)."""
        keep = -self.thresholds.memory
        if lead is not None:
            self.lead = lead
        if gap is not None and since_look is not None and not self._keeps_period(
                (gap, since_look)) and self._steady(since_look) and self.stray is not None:
            self.gaps, gap = [self.stray], since_look
        self.stray = None
        self.looks = (self.looks + [look])[keep:]
        self.lengths = (self.lengths + [length])[keep:]
        if gap is not None:
            self.gaps = (self.gaps + [gap])[keep:]

    def breaks(self, look: str, since_look: float, length: float) -> None:
        """A pause of a look a checkpoint can have, taken for a stall: remembered where it
        had the checkpoints' look and length (see _steady)."""
        self.stray = since_look if self.lengths and self._fits(look, length) else None


def pause_look(low: list[bool], waits: list[bool], first: int | None) -> str | None:
    """How a second of a paused job looks, from its live GPUs: each GPU ``low`` (not
    working, not busy-waiting) or busy-waiting (``waits``); a GPU neither is still
    computing. ``first``: the position of the job's first rank among them (None: not on
    this node). None: not a pause (no GPU low or waiting)."""
    if not any(waits):
        return TOGETHER if low and all(low) else None
    others = [i for i, w in enumerate(waits) if not w]
    if not others:
        return ELSEWHERE
    if first is not None and others == [first] and low[first]:
        return WRITER
    return CULPRIT


@dataclass(frozen=True)
class Pause:
    """A job's pause as the account decided it (seconds since the account began)."""

    job: str
    start: float
    seconds: float
    look: str  # the look it had most seconds
    cause: str  # "checkpoint" or "stall"
    writer: int | None  # the GPU that wrote (a WRITER pause), by position in the node
    work_before: float  # seconds the job stepped since its previous checkpoint


# the recent checkpoints a description is taken from (their rhythm now, not a day's)
DESCRIBED = 8


def describe_checkpoints(pauses: list[Pause]) -> str | None:
    """One line on a job's checkpoints: who writes, for how long, how often (its last
    DESCRIBED), how many there were; None when there was none."""
    every_ckpt = [p for p in pauses if p.cause == "checkpoint"]
    if not every_ckpt:
        return None
    ckpt = every_ckpt[-DESCRIBED:]
    length = _median(p.seconds for p in ckpt)
    starts = [p.start for p in ckpt]
    periods = [b - a for a, b in zip(starts, starts[1:], strict=False)]
    every = f" every ~{_median(periods):.0f} s" if periods else ""
    writers = {p.writer for p in ckpt if p.look == WRITER}
    looks = {p.look for p in ckpt}
    if looks == {WRITER} and len(writers) == 1:
        who = f"GPU {writers.pop()} writes a checkpoint"
        rest = "; the others wait"
    elif looks == {TOGETHER}:
        who, rest = "all GPUs pause together (a sharded checkpoint)", ""
    elif looks == {ELSEWHERE}:
        who, rest = "all GPUs wait on another node's checkpoint", ""
    else:
        who, rest = "the job checkpoints", ""
    return f"{who} for ~{length:.0f} s{every} ({len(every_ckpt)} seen){rest}"
