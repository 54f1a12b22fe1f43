"""Shared timing helper for the bench scripts (run as `python bench/NAME.py`)."""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np


def median_seconds(fn: Callable[[], object], repeat: int = 200) -> float:
    """Median wall time of fn() over `repeat` calls, after one warm-up call."""
    fn()
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return float(np.median(times))
