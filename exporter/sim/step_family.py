"""A synthetic family of nodes whose step swing hides inside compute phases between pauses.

Each :class:`StepCase` is a node of 2, 4 or 8 GPUs over a window: compute
phases and pauses (the pause taking 20-60 % of a 25-60 s cycle), and inside every
compute phase a step swing (square or smooth, 3-30 % of the compute power
peak-to-peak, 0.3 Hz up to 85 % of the observable band's top) whose rhythm
restarts after each pause; the GPUs swing nearly in phase (within 15 degrees).
Silent cases must report nothing: healthy (steady compute, with or without
pauses), idle, and independent GPUs (each its own phase, and its own frequency 20 % or more
apart where the band holds enough).

Noise follows the real traces documented in docs/power.md: every GPU's true
power fluctuates white over 5 ms by 1-3 % of its level, part of it common to the
node's GPUs (correlation 0-0.5).  The sensor either reads the instant value
(polls every 0.05 or 0.1 s) or a trailing 1 s average (polls every ~0.3 s, as
nvidia-smi's power.draw on H100).  Poll times jitter by 5 % of the interval.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from exporter.traces.trace import TraceWriter

FINE_HZ = 200.0  # the true power's grid: 5 ms, the noise's correlation time
T0 = 1_758_000_000.0
KINDS_SILENT = ("healthy", "idle", "independent")


@dataclass(frozen=True)
class StepCase:
    kind: str  # "swing", or one of KINDS_SILENT
    seed: int
    gpus: int
    averaged: bool  # the sensor reports a 1 s average
    interval_s: float
    seconds: float
    swing_hz: float | None
    amplitude: float  # swing peak-to-peak / compute level
    shape: str
    cycle_s: float  # compute + pause
    pause_fraction: float  # 0: no pauses
    noise: float  # rms of each GPU's 5 ms fluctuation / its level
    common: float  # correlation of the noise between GPUs

    @property
    def observable_hz(self) -> float:
        top = 0.5 / self.interval_s
        return min(top, 0.5) if self.averaged else top


def draw_case(kind: str, seed: int, seconds: float = 120.0) -> StepCase:
    """One member of the family, drawn from ``seed``."""
    rng = np.random.default_rng(seed)
    averaged = bool(rng.random() < 0.3)
    interval = float(rng.uniform(0.25, 0.35)) if averaged else float(rng.choice([0.05, 0.1]))
    top = min(0.5 / interval, 0.5) if averaged else 0.5 / interval
    swing = kind in ("swing", "independent")
    f = float(np.exp(rng.uniform(np.log(0.3), np.log(0.85 * top)))) if swing else None
    paused = kind == "swing" or (kind != "idle" and rng.random() < 0.5)
    return StepCase(
        kind=kind, seed=seed, gpus=int(rng.choice([2, 4, 8])), averaged=averaged,
        interval_s=interval, seconds=seconds, swing_hz=f,
        amplitude=float(rng.uniform(0.03, 0.30)) if swing else 0.0,
        shape=str(rng.choice(["square", "smooth"])), cycle_s=float(rng.uniform(25, 60)),
        pause_fraction=float(rng.uniform(0.2, 0.6)) if paused else 0.0,
        noise=float(rng.uniform(0.01, 0.03)), common=float(rng.uniform(0.0, 0.5)))


def family(n_swing: int, n_silent_each: int, seed: int = 0, seconds: float = 120.0
           ) -> list[StepCase]:
    """``n_swing`` swing cases and ``n_silent_each`` of each silent kind."""
    out = [draw_case("swing", seed * 100_000 + i, seconds) for i in range(n_swing)]
    for j, kind in enumerate(KINDS_SILENT):
        out += [draw_case(kind, seed * 100_000 + 10_000 * (j + 1) + i, seconds)
                for i in range(n_silent_each)]
    return out


def _wave(frac: np.ndarray, shape: str) -> np.ndarray:
    if shape == "square":
        return (frac < 0.5).astype(float)
    return 0.5 - 0.5 * np.cos(2 * np.pi * frac)


def _layout(case: StepCase) -> tuple[np.random.Generator, np.ndarray, np.ndarray, float]:
    """The case's random layout: (its generator, compute and idle levels, cycle offset)."""
    rng = np.random.default_rng(case.seed + 7)
    level = rng.uniform(300, 650, case.gpus)
    idle = rng.uniform(60, 120, case.gpus)
    return rng, level, idle, float(rng.uniform(0, case.cycle_s))


def true_power(case: StepCase, noise: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """(times from the start on the 5 ms grid, (gpus, n) watts)."""
    rng, level, idle, phase0 = _layout(case)
    n = int(case.seconds * FINE_HZ)
    t = np.arange(n) / FINE_HZ
    if case.kind == "idle":
        level = idle
    in_cycle = (t + phase0) % case.cycle_s
    compute = in_cycle >= case.pause_fraction * case.cycle_s
    # the rhythm restarts after every pause: time since the compute phase began
    since = in_cycle - case.pause_fraction * case.cycle_s
    restart = rng.uniform(0, 1, 64)
    cycle_no = np.floor((t + phase0) / case.cycle_s).astype(int) % 64
    out = np.empty((case.gpus, n))
    freqs = np.full(case.gpus, case.swing_hz or 0.0)
    if case.kind == "independent" and case.swing_hz:
        # each GPU its own rhythm and phase, 20 % apart or more, 0.3 Hz up to 85 % of the
        # band (GPUs share a frequency, not a phase, when the band holds too few)
        top = 0.85 * case.observable_hz
        grid = 0.3 * 1.2 ** np.arange(int(np.log(top / 0.3) / np.log(1.2)) + 1)
        freqs = rng.choice(grid, size=case.gpus, replace=grid.size < case.gpus)
    for g in range(case.gpus):
        x = np.full(n, level[g])
        if freqs[g] > 0:
            if case.kind == "independent":
                frac = (freqs[g] * t + rng.uniform()) % 1.0
            else:
                lag = rng.uniform(0, 15 / 360)  # cycles
                frac = (freqs[g] * since + restart[cycle_no] - lag) % 1.0
            low = level[g] * (1 - case.amplitude)
            x = low + (level[g] - low) * _wave(frac, case.shape)
        x = np.where(compute, x, idle[g])
        k = 4  # real edges take ~20 ms
        x = np.convolve(np.pad(x, (k - 1, 0), mode="edge"), np.ones(k) / k, mode="valid")
        out[g] = x
    if noise:
        common = rng.normal(0, 1, n)
        for g in range(case.gpus):
            own = rng.normal(0, 1, n)
            z = np.sqrt(case.common) * common + np.sqrt(1 - case.common) * own
            out[g] += case.noise * level[g] * z
    return t, out


def readings(case: StepCase, noise: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """(poll times in Unix seconds, (gpus, polls) watts as the sensor reports them)."""
    rng = np.random.default_rng(case.seed + 11)
    t, p = true_power(case, noise)
    if case.averaged:
        k = int(FINE_HZ)
        c = np.cumsum(np.pad(p, ((0, 0), (1, 0))), axis=1)
        avg = p.copy()
        avg[:, k - 1:] = (c[:, k:] - c[:, :-k]) / k
        p = avg
    polls = np.arange(1.0, case.seconds, case.interval_s)
    polls = polls + rng.uniform(-0.05, 0.05, polls.size) * case.interval_s
    idx = np.clip(np.floor(polls * FINE_HZ).astype(int), 0, t.size - 1)
    return T0 + polls, p[:, idx]


def true_amplitude(case: StepCase) -> float:
    """Peak-to-peak of the node's noise-free readings inside the compute phases (clear
    of their edges by 2.5 s): the swing as the sensor shows it."""
    t, p = readings(case, noise=False)
    node = p.sum(axis=0)
    rel = t - T0
    phase0 = _layout(case)[3]
    in_cycle = (rel + phase0) % case.cycle_s
    start = case.pause_fraction * case.cycle_s
    inside = (in_cycle >= start + 2.5) & (in_cycle <= case.cycle_s - 2.5)
    if not inside.any():
        return 0.0
    lo, hi = np.percentile(node[inside], [1, 99])
    return float(hi - lo)


def write_trace(case: StepCase, path: Path, tdp_w: float | None = 700.0) -> Path:
    """The case's readings as a cte trace (its header says how the sensor reads)."""
    t, p = readings(case)
    tdp = {g: tdp_w for g in range(case.gpus)} if tdp_w else None
    with TraceWriter(path, range(case.gpus), tdp, ["power_watts"],
                     power_averaging_seconds=1.0 if case.averaged else 0.0) as w:
        for i, ti in enumerate(t.tolist()):
            for g in range(case.gpus):
                w.write(ti, g, {"power_watts": round(float(p[g, i]), 3)})
    return path


def held_out_like(seed: int = 0, seconds: float = 180.0) -> StepCase:
    """The shape of the case that motivated the segments: two GPUs at ~10 Hz, ~20 s of
    compute and ~15 s pauses, a 2.4 Hz swing of ~10 % around ~150 W per GPU."""
    return StepCase(kind="swing", seed=seed, gpus=2, averaged=False, interval_s=0.1,
                    seconds=seconds, swing_hz=2.4, amplitude=0.10, shape="smooth",
                    cycle_s=36.0, pause_fraction=15 / 36, noise=0.02, common=0.3)
