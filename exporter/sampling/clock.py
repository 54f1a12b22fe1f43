"""Time, as the sampler sees it: the system's, or a manual clock that tests move by hand.

Everything that stamps or schedules takes its time from a Clock, so the whole sampler
(loops, fake physics, analyses) can run synchronously in simulated time: see
Sampler.advance().
"""

from __future__ import annotations

import time as _time
from typing import Protocol


class Clock(Protocol):
    def time(self) -> float: ...  # seconds since the epoch

    def monotonic(self) -> float: ...  # seconds, for schedules


class SystemClock:
    time = staticmethod(_time.time)
    monotonic = staticmethod(_time.monotonic)

    def __call__(self) -> float:
        return _time.time()


class ManualClock:
    """A clock that only moves when told; monotonic and epoch time are the same number.
    Callable, so it also drives the fake NVML's physics."""

    def __init__(self, start: float = 1_790_000_000.0):
        self.now = start

    def __call__(self) -> float:
        return self.now

    def time(self) -> float:
        return self.now

    def monotonic(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds

    def set(self, now: float) -> None:
        self.now = max(self.now, now)


SYSTEM = SystemClock()
