"""Synthetic training jobs with known truth for the goodput account (docs/goodput.md).

A :class:`Story` is one job on a node of GPUs, seen by a sensor polled every
``interval_s`` (instant readings, 2 % noise, 5 % jitter), with utilization, in this
order: it starts (GPUs held near idle, loading); it steps (each step a compute phase near
its level and a communication phase lower down), checkpointing every
``steps_per_checkpoint`` steps as ``checkpoint_kind`` says: ``rank0`` (data-parallel code
saving from rank 0: GPU 0 near idle while the others spin in the collective at ~100 %
utilization and about a fifth of the power limit) or ``sharded`` (every rank writes its
shard: the GPUs together near idle); once, at ``stall_at`` of a cycle's steps (an
irregular time), a GPU (``culprit``) holds up its peers, who busy-wait in the collective
(high utilization at low power): hung (``stall_kind`` ``hung``: it stops) or slow
(``slow``: it still computes): a stall; later a GPU (``lost_gpu``) is lost (no
readings) while its peers hang in the collective, then are killed (near idle), the job
restarts (loading) and steps again, the lost GPU back after a reset; the logger may
stop for ``hole_s`` (no readings at all); after its last steps the job holds its GPUs,
idle, for ``tail_s``.

:func:`truth` gives each GPU's seconds per state as the story wrote them, and the
progress lost to the failure (the steps since the checkpoint before it, on every GPU).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from exporter.analysis.goodput import STATES
from exporter.traces.trace import TraceWriter

T0 = 1_758_000_000.0


@dataclass(frozen=True)
class Story:
    seed: int = 0
    gpus: int = 4
    interval_s: float = 0.25
    step_s: float = 2.0
    compute_fraction: float = 0.65
    steps_per_checkpoint: int = 60
    checkpoint_s: float = 30.0
    start_s: float = 60.0
    cycles_before: int = 3  # checkpoint cycles before the failure
    steps_before_failure: int = 40  # steps after the last checkpoint before it
    cycles_after: int = 3
    stall_s: float = 45.0  # 0: no stall (in the second cycle's steps)
    culprit: int = 1
    checkpoint_kind: str = "sharded"  # or "rank0"
    stall_kind: str = "hung"  # or "slow"
    stall_at: float = 0.5  # where in the second cycle's steps the stall comes
    lost_gpu: int | None = 2  # None: no failure
    hang_s: float = 60.0  # peers busy-wait on the lost GPU
    restart_s: float = 120.0  # killed, rescheduled, loading: until the first steps again
    lost_s: float = 150.0  # the lost GPU is gone this long (then reset, back)
    hole_s: float = 0.0  # the logger stops (in the first cycle after the restart)
    tail_s: float = 60.0
    noise: float = 0.02


def draw_story(seed: int) -> Story:
    """A story drawn from ``seed``: the shapes the truth tests and the evaluation use."""
    rng = np.random.default_rng(seed)
    step = float(np.exp(rng.uniform(np.log(0.5), np.log(4.0))))
    cycle = float(rng.uniform(150, 400))
    gpus = int(rng.choice([2, 4, 8]))
    return Story(
        seed=seed, gpus=gpus, interval_s=float(rng.choice([0.1, 0.25, 0.5, 1.0])),
        step_s=step, compute_fraction=float(rng.uniform(0.5, 0.8)),
        steps_per_checkpoint=max(5, int(cycle / step)),
        checkpoint_s=float(rng.uniform(20, 60)), start_s=float(rng.uniform(30, 120)),
        cycles_before=int(rng.integers(2, 4)),
        steps_before_failure=max(3, int(rng.uniform(30, 120) / step)),
        cycles_after=int(rng.integers(2, 4)), stall_s=float(rng.uniform(30, 90)),
        culprit=int(rng.integers(0, gpus)), lost_gpu=int(rng.integers(0, gpus)),
        hang_s=float(rng.uniform(30, 120)), restart_s=float(rng.uniform(60, 180)),
        lost_s=float(rng.uniform(60, 200)), hole_s=float(rng.choice([0.0, 30.0, 60.0])),
        tail_s=float(rng.uniform(30, 120)),
        # drawn last, so the draws above stay the ones earlier stories had
        checkpoint_kind=str(rng.choice(["rank0", "sharded"])),
        stall_kind=str(rng.choice(["hung", "slow"])), stall_at=float(rng.uniform(0.2, 0.8)))


# what a stretch of the story is, per GPU: a state of STATES and how the GPU looks
STEP, PAUSE, WAIT, STOPPED, GONE, LOADING, HOLE, SLOW = (
    "step", "pause", "wait", "stopped", "gone", "loading", "hole", "slow")


@dataclass(frozen=True)
class Stretch:
    start: float
    end: float
    looks: tuple[str, ...]  # per GPU
    states: tuple[str, ...]  # per GPU, the truth


def timeline(story: Story) -> list[Stretch]:
    """The story as stretches (seconds from the start)."""
    n, out, t = story.gpus, [], 0.0

    def add(seconds: float, looks: list[str] | str, states: list[str] | str) -> None:
        nonlocal t
        looks_ = [looks] * n if isinstance(looks, str) else looks
        states_ = [states] * n if isinstance(states, str) else states
        if seconds > 0:
            out.append(Stretch(t, t + seconds, tuple(looks_), tuple(states_)))
            t += seconds

    def steps(count: int, stall: bool = False, hole: bool = False) -> None:
        seconds = count * story.step_s
        if stall and story.stall_s > 0:
            add(seconds * story.stall_at, STEP, "productive")
            looks = [WAIT] * n
            looks[story.culprit] = SLOW if story.stall_kind == "slow" else PAUSE
            add(story.stall_s, looks, "stalled")
            add(seconds * (1 - story.stall_at), STEP, "productive")
        elif hole and story.hole_s > 0:
            add(seconds / 2, STEP, "productive")
            add(story.hole_s, HOLE, "unknown")
            add(seconds / 2, STEP, "productive")
        else:
            add(seconds, STEP, "productive")

    def checkpoint() -> None:
        looks = [PAUSE] * n
        if story.checkpoint_kind == "rank0":
            looks = [PAUSE] + [WAIT] * (n - 1)
        add(story.checkpoint_s, looks, "checkpoint")

    add(story.start_s, LOADING, "starting")
    for c in range(story.cycles_before):
        steps(story.steps_per_checkpoint, stall=c == 1)
        if story.lost_gpu is not None or c < story.cycles_before - 1:
            checkpoint()  # the last is followed by no steps
    if story.lost_gpu is not None:
        steps(story.steps_before_failure)
        k = story.lost_gpu
        looks, states = [WAIT] * n, ["stalled"] * n
        looks[k], states[k] = GONE, "failed"
        hang = min(story.hang_s, story.lost_s)
        add(hang, looks, states)
        rest = story.restart_s
        gone = story.lost_s - hang  # the lost GPU's time still gone, in the restart
        looks, states = [STOPPED] * n, ["starting"] * n
        looks[k], states[k] = GONE, "failed"
        add(min(gone, rest), looks, states)
        add(max(0.0, rest - gone), STOPPED, "starting")
        if gone > rest:  # the job waits for the GPU's reset, loading
            looks, states = [LOADING] * n, ["starting"] * n
            looks[k], states[k] = GONE, "failed"
            add(gone - rest, looks, states)
        for c in range(story.cycles_after):
            steps(story.steps_per_checkpoint, hole=c == 0)
            if c < story.cycles_after - 1:
                checkpoint()
    add(story.tail_s, STOPPED, "idle")
    return out


def _levels(story: Story) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(story.seed + 3)
    n = story.gpus
    level = rng.uniform(350, 680, n)
    comm = level * rng.uniform(0.25, 0.4, n)
    idle, loading = rng.uniform(60, 110, n), rng.uniform(100, 140, n)
    # NCCL spinning: ~150 W of an H100's 700 W (0.21) as measured, whatever the level; the
    # spread between boards around it (0.17-0.25) is assumed, not measured
    wait = 700.0 * rng.uniform(0.17, 0.25, n)
    # the communication phase runs NCCL's kernels, moving data: never below their spin
    return {"compute": level, "comm": np.maximum(comm, wait), "idle": idle,
            "loading": loading, "wait": wait}


def readings(story: Story) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(poll times, Unix seconds (m,); power (gpus, m) W; utilization (gpus, m)), NaN where
    a GPU gives no reading."""
    rng = np.random.default_rng(story.seed + 5)
    lv = _levels(story)
    stretches = timeline(story)
    end = stretches[-1].end
    polls = np.arange(0.0, end, story.interval_s)
    polls = np.clip(polls + rng.uniform(-0.05, 0.05, polls.size) * story.interval_s, 0, end)
    n = story.gpus
    power = np.full((n, polls.size), np.nan)
    util = np.full((n, polls.size), np.nan)
    starts = np.array([s.start for s in stretches])
    which = np.clip(np.searchsorted(starts, polls, side="right") - 1, 0, len(stretches) - 1)
    phase = (polls / story.step_s) % 1.0
    for i, s in enumerate(stretches):
        at = which == i
        for g in range(n):
            look = s.looks[g]
            if look in (GONE, HOLE):
                continue
            if look == STEP:
                hi = phase[at] < story.compute_fraction
                watts = np.where(hi, lv["compute"][g], lv["comm"][g])
                busy = 1.0
            elif look == SLOW:  # computing, slowly: its compute level, all the time
                watts, busy = np.full(at.sum(), lv["compute"][g]), 1.0
            elif look == WAIT:
                watts, busy = np.full(at.sum(), lv["wait"][g]), 1.0
            elif look == LOADING:
                watts, busy = np.full(at.sum(), lv["loading"][g]), 0.05
            else:  # PAUSE, STOPPED
                watts, busy = np.full(at.sum(), lv["idle"][g]), 0.0
            power[g, at] = watts * (1 + story.noise * rng.standard_normal(at.sum()))
            util[g, at] = busy
    return T0 + polls, power, util


def truth(story: Story) -> dict[str, object]:
    """What the account must find: each GPU's seconds per state over the readings' span
    (the first poll to the last), their mean over the GPUs, and the progress the failure
    lost (GPU-seconds)."""
    t, _, _ = readings(story)
    lo, hi = t[0] - T0, t[-1] - T0
    per_gpu = np.zeros((story.gpus, len(STATES)))
    for s in timeline(story):
        span = max(0.0, min(s.end, hi) - max(s.start, lo))
        for g, state in enumerate(s.states):
            per_gpu[g, STATES.index(state)] += span
    lost = 0.0
    if story.lost_gpu is not None:
        lost = story.steps_before_failure * story.step_s * story.gpus
    return {"per_gpu": per_gpu, "seconds": dict(zip(STATES, per_gpu.mean(axis=0), strict=True)),
            "lost_progress_gpu_seconds": lost, "duration": hi - lo}


def write_trace(story: Story, path: Path, tdp_w: float | None = 700.0) -> Path:
    """The story's readings as a cte trace (power and utilization)."""
    t, power, util = readings(story)
    tdp = {g: tdp_w for g in range(story.gpus)} if tdp_w else None
    with TraceWriter(path, range(story.gpus), tdp, ["power_watts", "utilization_gpu_ratio"],
                     power_averaging_seconds=0.0) as w:
        for i, ti in enumerate(t.tolist()):
            for g in range(story.gpus):
                if np.isfinite(power[g, i]):
                    w.write(ti, g, {"power_watts": round(float(power[g, i]), 3),
                                    "utilization_gpu_ratio": float(util[g, i])})
    return path


def checkpoint_every(steps: int, seconds: float = 2400.0, kind: str = "sharded") -> Story:
    """One job, checkpointing (``kind``) every ``steps`` 1 s steps for 10 s, nothing else
    going wrong: its goodput must fall as checkpoints come more often."""
    cycle = steps * 1.0 + 10.0
    return dataclasses.replace(
        Story(seed=11, gpus=4, interval_s=0.5, step_s=1.0, checkpoint_s=10.0, start_s=30.0,
              stall_s=0.0, lost_gpu=None, tail_s=10.0, checkpoint_kind=kind),
        steps_per_checkpoint=steps, cycles_before=max(1, int(seconds / cycle)))
