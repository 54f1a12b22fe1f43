"""The simulated physics of one GPU: its power waveform, energy and the driver's
buffer of power samples. Pure functions of time (the scenario's clock), so a fake node is
deterministic for a given clock.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

from exporter.sim.scenarios import Scenario
from exporter.sim.tenants import uuid5_oid, uuid_text

HANDLE_BASE = 0x7E57_0000  # fake device handles are this plus the GPU's index
_PCI_BUSES = (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)
_NOISE_TABLE = 4096

try:  # np.interp's own compiled routine: on a scalar its Python wrapper costs ~2 us more
    from numpy._core.multiarray import interp as _interp
except ImportError:  # numpy 1.x
    _interp = np.interp


# The noise tables, made without numpy.random. numpy.random is ~3.4 MiB resident once
# imported, and it loads OpenSSL's libcrypto (~3.5 MiB more) through `secrets`; the fake
# node needs two tables of 4,096 numbers per GPU from it, made once. SplitMix64 (Steele,
# Lea and Flood, "Fast splittable pseudorandom number generators", OOPSLA 2014: the
# generator Java's SplittableRandom uses) makes their bits as a counter-based stream,
# one numpy expression over the whole table, and Box-Muller turns them into normal
# deviates. A fixed key gives the same tables on every machine (to the last bits of log
# and cos).
_GAMMA = np.uint64(0x9E3779B97F4A7C15)  # the golden ratio's odd 64-bit step
_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)
_S30, _S27, _S31, _S11 = (np.uint64(s) for s in (30, 27, 31, 11))


def _mix(z: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser (a bijection of 64-bit words)."""
    z = (z ^ (z >> _S30)) * _M1
    z = (z ^ (z >> _S27)) * _M2
    return z ^ (z >> _S31)


def uniform_table(key: int, n: int) -> np.ndarray:
    """`n` doubles in [0, 1): the stream of `key` (any int; its low 64 bits count)."""
    seed = _mix(np.array([key & 0xFFFF_FFFF_FFFF_FFFF], dtype=np.uint64))
    with np.errstate(over="ignore"):  # words wrap modulo 2**64, as the generator means
        words = _mix(seed + np.arange(1, n + 1, dtype=np.uint64) * _GAMMA)
    return (words >> _S11) * (1.0 / (1 << 53))


def normal_table(key: int, n: int) -> np.ndarray:
    """`n` standard normal deviates (Box-Muller), the stream of `key`."""
    pairs = (n + 1) // 2
    u = uniform_table(key, 2 * pairs)
    radius = np.sqrt(-2.0 * np.log1p(-u[:pairs]))  # 1 - u in (0, 1]: never log(0)
    angle = 2.0 * np.pi * u[pairs:]
    return np.concatenate([radius * np.cos(angle), radius * np.sin(angle)])[:n]


def gpu_uuid(seed: int, index: int) -> str:
    """A fake GPU's UUID: stable for a scenario's seed (a fake kubelet can name it)."""
    return "GPU-" + uuid_text(uuid5_oid(f"cte-{seed}-{index}"))


class Waveform:
    """One training step's power shape, repeated; with its exact running integral.
    Read-only once made: GPUs with the same shape share one (waveform())."""

    def __init__(self, period: float, fraction: float, ramp: float, high: float, low: float):
        self.period = period
        ramp = min(ramp, period * fraction / 2, period * (1 - fraction) / 2)
        grid = np.linspace(0.0, period, 2049)
        xp = [0.0, ramp, period * fraction, period * fraction + ramp, period]
        self.grid = grid
        self.breaks = xp
        self.levels = [low, high, high, low, low]
        self.low = low
        power = np.interp(grid, xp, self.levels)  # only for the integral: not kept
        steps = (power[1:] + power[:-1]) / 2 * np.diff(grid)
        self.cumulative = np.concatenate([[0.0], np.cumsum(steps)])
        self.energy_per_period = float(self.cumulative[-1])
        self.breaks_array, self.levels_array = np.array(xp), np.array(self.levels)

    def value(self, x: float) -> float:
        x %= self.period
        xs, ys = self.breaks, self.levels
        for i in range(1, len(xs)):  # piecewise linear; plain Python beats np.interp on scalars
            if x <= xs[i]:
                span = xs[i] - xs[i - 1]
                if span <= 0:
                    return ys[i]
                return ys[i - 1] + (ys[i] - ys[i - 1]) * (x - xs[i - 1]) / span
        return self.low

    def integral(self, x: float) -> float:
        """Integral of power from 0 to x (x >= 0), in joules."""
        whole, frac = divmod(x, self.period)
        return whole * self.energy_per_period + float(_interp(frac, self.grid, self.cumulative))


@lru_cache(maxsize=64)
def waveform(period: float, fraction: float, ramp: float, high: float, low: float
             ) -> Waveform:
    """The Waveform of these parameters, one for all the GPUs (and fake nodes) that share
    them: its grid and integral are 32 KiB, the same for every GPU in lockstep."""
    return Waveform(period, fraction, ramp, high, low)


class FakeGpu:
    """One simulated GPU."""

    def __init__(self, index: int, scenario: Scenario, start: float, period: float,
                 fraction: float):
        self.index = index
        dev, work = scenario.device, scenario.workload
        over = scenario.overrides.get(index)
        self.power_limit = over.power_limit_watts if over and over.power_limit_watts else (
            dev.power_limit_watts)
        self.temperature_offset = over.temperature_offset_celsius if over else 0.0
        self.clock_scale = over.clock_scale if over else 1.0
        scale = over.power_scale if over else 1.0
        self.training = work.type == "training"
        high = min(work.compute_watts * scale, self.power_limit)
        low = work.communication_watts * scale if self.training else work.idle_watts * scale
        if not self.training:
            high = low
        self.wave = waveform(period, fraction, work.ramp_seconds, high, low)
        self.high = high
        self.phase = work.phase_seconds + (over.phase_seconds if over else 0.0)
        self.start = start
        # x measures time along the waveform; x0 is where this GPU's run began.
        self.x0 = (start + self.phase) % self.wave.period
        self.every = work.checkpoint_every_seconds if self.training else 0.0
        self.ckpt_seconds = min(work.checkpoint_seconds, self.every)
        # no checkpoint begins before this (a job saves after its first steps)
        self.ckpt_from = (start + work.checkpoint_after_seconds
                          if work.checkpoint_after_seconds > 0 else -math.inf)
        self.writer = work.checkpoint_sharded or index == work.checkpoint_gpu
        self.ckpt_watts = work.idle_watts + 40 if self.writer else work.wait_watts
        self._ckpt_prefix = [0.0]  # energy corrections of completed checkpoints, summed
        self.energy0_mj = 1.2e9 + index * 3.7e7
        key = 2 * (scenario.seed * 1000 + index)  # two streams a GPU (normal_table, uniform_table)
        self.noise = normal_table(key, _NOISE_TABLE) * work.noise_watts
        # the driver's sample times jitter around their nominal interval (7-46 ms on an
        # H200 at a median of 20 ms): offsets of up to 0.9 of an interval, one per sample
        self.jitter = uniform_table(key + 1, _NOISE_TABLE) * 0.9 - 0.45
        self.sample_interval = dev.power_sample_interval_seconds
        # In lockstep, the part of the communication phase beyond the collective's own
        # length is spent waiting for a slower peer (spinning in the collective).
        independent = any(o.step_period_seconds for o in scenario.overrides.values())
        collective = work.step_period_seconds * (1 - work.compute_fraction)
        communication = period * (1 - fraction)
        self.wait_share = (0.0 if independent or communication <= collective
                           else 1 - collective / communication)
        self._compute_total = (start, 0.0)  # (t, compute seconds from start to t)
        self.uuid = gpu_uuid(scenario.seed, index)
        self.serial = f"16522210{index:05d}"
        self.bus = _PCI_BUSES[index % len(_PCI_BUSES)] + (index // len(_PCI_BUSES))
        # /dev/nvidiaN's N (the driver's minor number) follows the driver's probe order,
        # not NVML's PCI order: swapped in pairs here, so code that takes one for the
        # other fails on the fake as it would on such a node
        self.minor = index ^ 1
        # A replay (sim/replay.py) answers from its trace and lacks some keys; a GPU that
        # is all model lets the fake skip asking on every call.
        self.replays = (type(self).provides is not FakeGpu.provides
                        or type(self).recorded is not FakeGpu.recorded)
        # Memos of pure functions of time, asked several times per sweep (fake_model.py):
        # the instant power as of (held update, period), and recent energy readings.
        self._instant: tuple[float, float, float] | None = None
        self._energy: dict[float, float] = {}
        self._energy_x0 = self.wave.integral(self.x0)

    def recorded(self, name: str, t: float) -> float | None:
        """A replayed value (see sim/replay.py); None: use the model."""
        return None

    def provides(self, key: str) -> bool:
        """Whether this GPU has a value for a catalogue key (a replay has only its trace's)."""
        return True

    def in_checkpoint(self, t: float) -> bool:
        return self.every > 0 and t % self.every < self.ckpt_seconds and (
            t - t % self.every >= self.ckpt_from)

    def ideal_power(self, t: float) -> float:
        if self.in_checkpoint(t):
            return self.ckpt_watts
        return self.wave.value(t + self.phase)

    # -- phases over an interval (what GPM averages) --------------------------------------
    def _wave_compute(self, t0: float, t1: float) -> float:
        """Seconds of (t0, t1) in the waveform's compute phase (above its midpoint: from
        half-way up the rising ramp to half-way down the falling one), checkpoints aside."""
        if not self.training or self.high <= self.wave.low or t1 <= t0:
            return 0.0
        period = self.wave.period
        ramp, on = self.wave.breaks[1], self.wave.breaks[2]  # compute lasts `on` a period

        def since_zero(y: float) -> float:
            k = math.floor(y / period)
            return k * on + min(y - k * period, on)

        shift = self.phase - ramp / 2
        return since_zero(t1 + shift) - since_zero(t0 + shift)

    def checkpoints(self, t0: float, t1: float) -> list[tuple[float, float]]:
        """The parts of (t0, t1) spent in checkpoints."""
        if self.every <= 0 or t1 <= t0:
            return []
        out = []
        k = math.floor(t0 / self.every)
        while k * self.every < t1:
            a, b = max(t0, k * self.every), min(t1, k * self.every + self.ckpt_seconds)
            if b > a and k * self.every >= self.ckpt_from:
                out.append((a, b))
            k += 1
        return out

    def phase_seconds(self, t0: float, t1: float) -> dict[str, float]:
        """How (t0, t1) divides into compute, communication, waiting (in a collective for
        a slower peer, or for the checkpoint writer), writing (the writer's checkpoint)
        and idle, in seconds."""
        span = max(0.0, t1 - t0)
        if not self.training:
            return {"idle": span}
        pieces = self.checkpoints(t0, t1)
        in_checkpoint = sum(b - a for a, b in pieces)
        compute = self._compute_seconds(t0, t1, pieces)
        communication = span - in_checkpoint - compute
        return {"compute": compute,
                "communication": communication * (1 - self.wait_share),
                "waiting": communication * self.wait_share + (
                    0.0 if self.writer else in_checkpoint),
                "writing": in_checkpoint if self.writer else 0.0}

    def _compute_seconds(self, t0: float, t1: float, pieces: list[tuple[float, float]]
                         ) -> float:
        """phase_seconds' compute share, given the checkpoints in (t0, t1)."""
        return self._wave_compute(t0, t1) - sum(self._wave_compute(a, b) for a, b in pieces)

    def compute_seconds_total(self, t: float) -> float:
        """Seconds in the compute phase since the GPU started (for the driver's counters)."""
        last, total = self._compute_total
        if t < last:
            last, total = self.start, 0.0
        if self.training:  # phase_seconds(last, t)["compute"], without the other phases
            total += self._compute_seconds(last, t, self.checkpoints(last, t))
        self._compute_total = (t, total)
        return total

    # -- the driver's power samples -------------------------------------------------
    def sample_time(self, k: int) -> float:
        """When the driver took its k-th power sample (epoch seconds)."""
        return (k + self.jitter[k % _NOISE_TABLE]) * self.sample_interval

    def sample_watts(self, k: int) -> float:
        return max(0.0, self.ideal_power(self.sample_time(k))
                   + float(self.noise[k % _NOISE_TABLE]))

    def sample_times(self, ks: np.ndarray) -> np.ndarray:
        """sample_time for many samples at once."""
        return (ks + self.jitter[ks % _NOISE_TABLE]) * self.sample_interval

    def sample_stamp(self, k: int) -> int:
        """The k-th sample's time stamp as the driver reports it (whole microseconds):
        what np.round(sample_times(ks) * 1e6) makes of it, on a scalar."""
        return round(self.sample_time(k) * 1e6)

    def samples_watts(self, ks: np.ndarray) -> np.ndarray:
        """sample_watts for many samples at once."""
        return self._watts(self.sample_times(ks), self.noise[ks % _NOISE_TABLE])

    def samples_run(self, first: int, n: int) -> tuple[np.ndarray, np.ndarray]:
        """(sample_times, samples_watts) of the n samples from the first-th: what a drain
        returns, the tables read as slices where the run does not wrap (no gather)."""
        ks = np.arange(first, first + n)
        at = first % _NOISE_TABLE
        if at + n <= _NOISE_TABLE:
            jitter, noise = self.jitter[at:at + n], self.noise[at:at + n]
        else:
            jitter, noise = self.jitter[ks % _NOISE_TABLE], self.noise[ks % _NOISE_TABLE]
        times = (ks + jitter) * self.sample_interval
        return times, self._watts(times, noise)

    def _watts(self, t: np.ndarray, noise: np.ndarray) -> np.ndarray:
        """The samples' watts at times t, with their noise."""
        wave = self.wave
        power = _interp((t + self.phase) % wave.period, wave.breaks_array, wave.levels_array)
        if self.every > 0:
            phase = t % self.every
            power = np.where((phase < self.ckpt_seconds) & (t - phase >= self.ckpt_from),
                             self.ckpt_watts, power)
        return np.maximum(0.0, power + noise)

    def samples_between(self, t0: float, t1: float) -> range:
        """Indices of the driver's samples taken in (t0, t1] (sample times increase:
        consecutive samples are at least a tenth of an interval apart)."""
        lo = math.floor(t0 / self.sample_interval) - 1
        while self.sample_time(lo) <= t0:
            lo += 1
        hi = math.floor(t1 / self.sample_interval) + 1
        while self.sample_time(hi) > t1:
            hi -= 1
        return range(lo, hi + 1)

    def sample_watts_exact(self, k: int) -> float:
        """samples_watts([k])[0] to the last bit (the same numpy operations on scalars),
        without the cost of 1-element arrays."""
        t = (k + self.jitter[k % _NOISE_TABLE]) * self.sample_interval
        power = _interp((t + self.phase) % self.wave.period, self.wave.breaks_array,
                        self.wave.levels_array)
        if self.every > 0 and t % self.every < self.ckpt_seconds and (
                t - t % self.every >= self.ckpt_from):
            power = self.ckpt_watts
        watts = power + self.noise[k % _NOISE_TABLE]
        return 0.0 if watts <= 0.0 else float(watts)  # np.maximum(0.0, watts)

    def instant_power(self, t: float, update_period: float) -> float:
        """The instant-power field: the latest buffered sample as of the sensor's last
        update (it changes only every `update_period`, so it is kept until then)."""
        held = math.floor(t / update_period) * update_period
        memo = self._instant
        if memo is not None and memo[0] == held and memo[1] == update_period:
            return memo[2]
        k = math.floor(held / self.sample_interval) + 1
        while self.sample_time(k) > held:
            k -= 1
        watts = self.sample_watts_exact(k)  # exactly the buffer's value
        self._instant = (held, update_period, watts)
        return watts

    # -- energy ------------------------------------------------------------------------
    def _wave_energy(self, t: float) -> float:
        elapsed = max(0.0, t - self.start)
        return self.wave.integral(self.x0 + elapsed) - self._energy_x0

    def _checkpoint_correction(self, k: int, t: float) -> float:
        """Energy of checkpoint k up to t, minus the waveform's over the same time."""
        a = max(k * self.every, self.start)
        b = min(k * self.every + self.ckpt_seconds, t)
        if b <= a or k * self.every < self.ckpt_from:
            return 0.0
        return self.ckpt_watts * (b - a) - (self._wave_energy(b) - self._wave_energy(a))

    def energy_joules(self, t: float) -> float:
        """Energy since start at time t, in joules (kept for the last few t asked: a sweep
        asks the same t for the power average, the temperature and the HBM temperature)."""
        energy = self._energy.get(t)
        if energy is None:
            energy = self._energy_at(t)
            if len(self._energy) >= 8:
                self._energy.clear()
            self._energy[t] = energy
        return energy

    def _energy_at(self, t: float) -> float:
        energy = self._wave_energy(t)
        if self.every <= 0 or t <= self.start:
            return energy
        first = math.floor(self.start / self.every)
        current = math.floor(t / self.every)
        while len(self._ckpt_prefix) <= current - first:  # completed checkpoints, once
            k = first + len(self._ckpt_prefix) - 1
            self._ckpt_prefix.append(self._ckpt_prefix[-1] + self._checkpoint_correction(
                k, math.inf))
        return energy + self._ckpt_prefix[current - first] + self._checkpoint_correction(
            current, t)

    def average_power(self, t: float, window: float) -> float:
        window = max(1e-3, min(window, t - self.start))
        if t - self.start < 1e-3:
            return self.ideal_power(t)
        return (self.energy_joules(t) - self.energy_joules(t - window)) / window


def step_timing(scenario: Scenario) -> list[tuple[float, float]]:
    """(period, compute fraction) of each GPU. In lockstep training every GPU waits for the
    slowest one's compute phase, so a slow GPU stretches every peer's step."""
    work, overrides = scenario.workload, scenario.overrides
    n = scenario.gpus
    if any(o.step_period_seconds for o in overrides.values()):  # independent GPUs
        out = []
        for gpu in range(n):
            over = overrides.get(gpu)
            period = (over.step_period_seconds if over and over.step_period_seconds
                      else work.step_period_seconds)
            out.append((period, work.compute_fraction))
        return out
    compute = work.compute_fraction * work.step_period_seconds
    speeds = [overrides[g].clock_scale if g in overrides else 1.0 for g in range(n)]
    period = max(compute / s for s in speeds) + work.step_period_seconds - compute
    return [(period, min(0.98, compute / s / period)) for s in speeds]
