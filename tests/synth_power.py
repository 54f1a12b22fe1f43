"""Synthetic GPU power traces with known truth, for the offline analysis tests.

A node's true power is built at 1 kHz (per GPU: a square or smooth step swing
between two levels, fast noise, pauses at an idle level, ~20 ms edges), read
by a sensor that either reports the instantaneous value (refreshed every
``sensor_update_s``) or a trailing 1 s boxcar average (as power.draw does on
Hopper and most Ampere boards), polled every ``interval_s`` with jitter, and
written as an nvidia-smi CSV log or a cte trace.  The :class:`Case` is the truth
the analysis must find.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from exporter.traces.trace import TraceWriter

FINE_HZ = 1000.0
T0 = 1_758_000_000.0


@dataclass(frozen=True)
class Case:
    label: str
    gpus: int = 8
    gpu_name: str | None = "NVIDIA A100-SXM4-80GB"  # None: no name column
    averaged: bool = False  # the sensor reports a 1 s average
    column: str = "power.draw"  # nvidia-smi column, or "cte"
    interval_s: float = 0.05  # poll interval
    jitter: float = 0.05  # poll jitter, a share of the interval (uniform +-)
    sensor_update_s: float = 0.02
    seconds: float = 180.0
    swing_hz: float | None = 0.625
    shape: str = "square"  # or "smooth" (raised cosine)
    low_w: float = 175.0
    high_w: float = 650.0
    noise_w: float = 8.0  # rms of the instantaneous reading's fluctuation
    pauses: tuple[tuple[float, float], ...] = ()  # (start, duration) in seconds
    pause_w: float = 160.0
    swing_from: float = 0.0  # the swing runs from here (before: idle at pause_w)
    swing_until: float | None = None
    tdp_w: float | None = None  # written as power.default_limit / cte tdp_watts
    seed: int = 0
    extra: dict[str, float] = field(default_factory=dict)

    @property
    def node_amplitude_w(self) -> float:
        """Peak-to-peak of the node's true (noise-free) swing."""
        return self.gpus * (self.high_w - self.low_w)

    @property
    def training_mean_w(self) -> float:
        return self.gpus * (self.low_w + self.high_w) / 2


def true_power(case: Case) -> tuple[np.ndarray, np.ndarray]:
    """(times relative to the start at 1 kHz, (gpus, n) watts)."""
    rng = np.random.default_rng(case.seed)
    n = int(case.seconds * FINE_HZ)
    t = np.arange(n) / FINE_HZ
    until = case.swing_until if case.swing_until is not None else case.seconds
    active = (t >= case.swing_from) & (t < until)
    paused = np.zeros(n, dtype=bool)
    for start, dur in case.pauses:
        paused |= (t >= start) & (t < start + dur)
    out = np.empty((case.gpus, n))
    # the swing's phase against the polls: arbitrary, as on a real node
    offset = rng.uniform(0, 1 / case.swing_hz) if case.swing_hz else 0.0
    for g in range(case.gpus):
        if case.swing_hz is None:
            level = np.full(n, case.high_w)
        else:
            lag = offset + rng.uniform(0, 0.01)  # nearly in phase: a few ms apart
            frac = (case.swing_hz * (t - lag)) % 1.0
            if case.shape == "square":
                up = (frac < 0.5).astype(float)
            else:
                up = 0.5 - 0.5 * np.cos(2 * np.pi * frac)
            level = case.low_w + (case.high_w - case.low_w) * up
        level = np.where(active & ~paused, level, case.pause_w)
        level = _smooth(level, int(0.02 * FINE_HZ))  # real edges take ~20 ms
        # fast fluctuation, correlated over ~5 ms so a point reading sees noise_w rms
        noise = _smooth(rng.normal(0, case.noise_w * math.sqrt(5), n), 5)
        out[g] = level + noise
    return t, out


def _smooth(x: np.ndarray, k: int) -> np.ndarray:
    if k <= 1:
        return x
    c = np.cumsum(np.concatenate([[0.0], x]))
    y = np.empty_like(x)
    y[k - 1:] = (c[k:] - c[:-k]) / k
    y[:k - 1] = x[:k - 1]
    return y


def sensor_readings(case: Case) -> tuple[np.ndarray, np.ndarray]:
    """(poll times relative to the start, (gpus, polls) watts as the sensor reports)."""
    rng = np.random.default_rng(case.seed + 1)
    t, p = true_power(case)
    if case.averaged:
        k = int(FINE_HZ)  # trailing 1 s boxcar
        c = np.cumsum(np.concatenate([np.zeros((p.shape[0], 1)), p], axis=1), axis=1)
        avg = np.empty_like(p)
        avg[:, k - 1:] = (c[:, k:] - c[:, :-k]) / k
        avg[:, :k - 1] = p[:, :k - 1]
        p = avg
    polls = np.arange(1.0, case.seconds - 1.0, case.interval_s)
    polls = polls + rng.uniform(-case.jitter, case.jitter, polls.size) * case.interval_s
    # the sensor refreshes every sensor_update_s; a poll reads the last refresh
    upd = np.floor(polls / case.sensor_update_s) * case.sensor_update_s
    idx = np.clip(np.round(upd * FINE_HZ).astype(int), 0, t.size - 1)
    return polls, p[:, idx]


def write_trace(case: Case, directory: Path) -> Path:
    polls, watts = sensor_readings(case)
    if case.column == "cte":
        path = directory / f"{case.label}.cte"
        tdp = {g: case.tdp_w for g in range(case.gpus)} if case.tdp_w else None
        names = {g: case.gpu_name for g in range(case.gpus)} if case.gpu_name else None
        with TraceWriter(path, range(case.gpus), tdp, ["power_watts"],
                         power_averaging_seconds=1.0 if case.averaged else None,
                         gpu_names=names) as w:
            for i, ti in enumerate(polls):
                for g in range(case.gpus):
                    w.write(T0 + float(ti), g, {"power_watts": round(float(watts[g, i]), 3)})
        if case.extra.get("old_header"):  # as written before power_averaging_seconds existed
            lines = path.read_text().splitlines(keepends=True)
            lines[0] = lines[0].replace(',"power_averaging_seconds":null', "")
            path.write_text("".join(lines))
        return path
    path = directory / f"{case.label}.csv"
    cols = ["timestamp", "index"]
    if case.gpu_name:
        cols.append("name")
    if case.tdp_w:
        cols.append("power.default_limit [W]")
    cols.append(f"{case.column} [W]")
    lines = [", ".join(cols)]
    for i, ti in enumerate(polls):
        stamp = _stamp(T0 + float(ti))
        for g in range(case.gpus):
            cells = [stamp, str(g)]
            if case.gpu_name:
                cells.append(case.gpu_name)
            if case.tdp_w:
                cells.append(f"{case.tdp_w:.2f} W")
            cells.append(f"{watts[g, i]:.2f} W")
            lines.append(", ".join(cells))
    path.write_text("\n".join(lines) + "\n")
    return path


def _stamp(t: float) -> str:
    import datetime as dt

    d = dt.datetime.fromtimestamp(t, tz=dt.UTC)
    return d.strftime("%Y/%m/%d %H:%M:%S.") + f"{d.microsecond // 1000:03d}"


# --------------------------------------------------------------------------- the matrix

H100 = "NVIDIA H100 80GB HBM3"
PAUSES = ((60.0, 16.0), (150.0, 16.0))

# What the analysis must report about the step swing:
RESOLVED = "resolved"  # its frequency (5 %) and amplitude (15 %)
UNRESOLVED = "unresolved"  # "above N Hz, unresolved": faster than the band (or at its edge)
FOLDED = "folded"  # unresolved, no frequency at all: samples far sparser than the swing
NONE = "none"  # nothing: a 1 s average removes swings at whole Hz entirely


@dataclass(frozen=True)
class Truth:
    case: Case
    kind: str  # "instantaneous", "averaged"
    swing: str  # RESOLVED, UNRESOLVED, FOLDED or NONE


_T = Truth
MATRIX: dict[str, Truth] = {t.case.label: t for t in (
    # instantaneous readings
    _T(Case("a100-20hz-square-0.625"), "instantaneous", RESOLVED),
    _T(Case("noname-20hz-square-0.625", gpu_name=None), "instantaneous", RESOLVED),
    _T(Case("v100-10hz-square-2.4", gpus=2, gpu_name="Tesla V100-SXM2-32GB", interval_s=0.1,
            swing_hz=2.4), "instantaneous", RESOLVED),
    _T(Case("noname-2gpu-10hz-square-2.4", gpus=2, gpu_name=None, interval_s=0.1,
            swing_hz=2.4), "instantaneous", RESOLVED),
    _T(Case("t4-5hz-smooth-1.2", gpus=4, gpu_name="Tesla T4", interval_s=0.2, swing_hz=1.2,
            shape="smooth", low_w=30, high_w=68, noise_w=1.5), "instantaneous", RESOLVED),
    _T(Case("instant-column-2hz-square-0.3", gpu_name="NVIDIA A30",
            column="power.draw.instant", interval_s=0.5, swing_hz=0.3),
       "instantaneous", RESOLVED),
    _T(Case("cte-1hz-smooth-0.2", column="cte", gpu_name=None, interval_s=1.0, swing_hz=0.2,
            shape="smooth"), "instantaneous", RESOLVED),
    _T(Case("cte-v0-20hz-square-0.5-pauses", column="cte", gpu_name=None, swing_hz=0.5,
            pauses=PAUSES, extra={"old_header": 1.0}), "instantaneous", RESOLVED),
    _T(Case("gv100-20hz-sensor-10hz-square-5", gpu_name="Quadro GV100", gpus=4,
            sensor_update_s=0.1, swing_hz=5.0), "instantaneous", UNRESOLVED),
    _T(Case("h100-instant-column-20hz-smooth-2.8", gpu_name=H100,
            column="power.draw.instant", swing_hz=2.8, shape="smooth"),
       "instantaneous", RESOLVED),
    _T(Case("noname-20hz-smooth-0.2", gpu_name=None, swing_hz=0.2, shape="smooth"),
       "instantaneous", RESOLVED),
    _T(Case("p100-0.1hz-square-2", gpu_name="Tesla P100-PCIE-16GB", interval_s=10.0,
            swing_hz=2.0, seconds=900), "instantaneous", FOLDED),
    _T(Case("a100-20hz-square-0.625-pauses", pauses=PAUSES), "instantaneous", RESOLVED),
    _T(Case("noname-1hz-square-0.2", gpu_name=None, interval_s=1.0, swing_hz=0.2),
       "instantaneous", RESOLVED),
    _T(Case("a100-20hz-steady-shallow-pause", swing_hz=None, high_w=500, pause_w=320,
            pauses=((80.0, 10.0),)), "instantaneous", NONE),
    # 1 s averages (power.draw on Hopper, Ada, Blackwell, most Ampere)
    _T(Case("h100-3hz-irregular-square-0.625", gpu_name=H100, averaged=True, interval_s=0.3,
            jitter=0.25), "averaged", UNRESOLVED),
    _T(Case("noname-avg-20hz-square-0.2", gpu_name=None, averaged=True, swing_hz=0.2),
       "averaged", RESOLVED),
    _T(Case("average-column-5hz-smooth-0.3", gpu_name=None, column="power.draw.average",
            averaged=True, interval_s=0.2, swing_hz=0.3, shape="smooth"), "averaged", RESOLVED),
    _T(Case("a10g-1hz-square-2", gpu_name="NVIDIA A10G", gpus=4, averaged=True,
            interval_s=1.0, swing_hz=2.0, low_w=60, high_w=290), "averaged", NONE),
    _T(Case("cte-avg-10hz-square-1.5", column="cte", gpu_name=None, averaged=True,
            interval_s=0.1, swing_hz=1.5), "averaged", UNRESOLVED),
    _T(Case("h100-0.1hz-pauses", gpu_name=H100, averaged=True, interval_s=10.0, swing_hz=2.0,
            seconds=1200, pauses=((300.0, 90.0), (800.0, 120.0))), "averaged", NONE),
    # the log: a run (start, end) with two checkpoint pauses, ~4.4 kW -> ~1.3 kW
    _T(Case("h100-2hz-run-with-checkpoint-pauses", gpu_name=H100, averaged=True,
            interval_s=0.5, swing_hz=2.0, low_w=420, high_w=680, seconds=260,
            swing_from=30.0, swing_until=220.0, pauses=((90.0, 16.0), (160.0, 16.0))),
       "averaged", NONE),
    _T(Case("noname-avg-2hz-checkpoint-pauses", gpu_name=None, averaged=True, interval_s=0.5,
            swing_hz=2.0, low_w=420, high_w=680, pauses=PAUSES), "averaged", NONE),
    _T(Case("b200-20hz-smooth-0.4", gpu_name="NVIDIA B200", averaged=True, swing_hz=0.4,
            shape="smooth", low_w=300, high_w=1000), "averaged", RESOLVED),
    _T(Case("l40s-5hz-square-5", gpu_name="NVIDIA L40S", gpus=4, averaged=True,
            interval_s=0.2, swing_hz=5.0, low_w=100, high_w=330), "averaged", NONE),
    _T(Case("noname-avg-20hz-square-0.2-pause", gpu_name=None, averaged=True, swing_hz=0.2,
            pauses=((100.0, 30.0),)), "averaged", RESOLVED),
)}
