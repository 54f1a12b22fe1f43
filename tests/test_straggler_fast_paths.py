"""The straggler and stall checks' cheaper computations give exactly what the
straightforward numpy ones give (they run every second or every 10 s in the exporter)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from exporter.analysis.stalls import StallThresholds, detect_stall, stall_matrix
from exporter.analysis.straggler import group_index, row_medians
from exporter.sampling.live_stragglers import nan_row_means


@pytest.mark.parametrize("seed", range(6))
def test_row_medians_equal_nanmedian(seed: int) -> None:
    rng = np.random.default_rng(seed)
    for shape in ((9, 8), (9, 3), (1, 1), (4, 2), (3, 700), (5, 0)):
        x = rng.choice([0.0, 1.0, 2.5, -3.0], size=shape) if seed % 2 else rng.normal(
            size=shape) * 10.0 ** rng.integers(-3, 9)
        x[rng.random(shape) < 0.3] = np.nan
        x[rng.random(shape) < 0.05] = rng.choice([np.inf, -np.inf])
        if shape[0] > 2:
            x[1] = np.nan  # a row without values
        assert_rows_as(row_medians, np.nanmedian, x)


@pytest.mark.parametrize("seed", range(6))
def test_nan_row_means_equal_nanmean(seed: int) -> None:
    rng = np.random.default_rng(seed)
    for shape in ((8, 21), (8, 3), (8, 0), (1, 1), (3, 1201)):
        x = rng.normal(300.0, 100.0, shape)
        if seed % 2:
            x[rng.random(shape) < 0.2] = np.nan
            x[0] = np.nan  # a GPU without samples
        assert_rows_as(nan_row_means, np.nanmean, x)


def assert_rows_as(fast, reference, x: np.ndarray) -> None:
    """fast(x) equals numpy's reference(x, axis=1) bit for bit (all-NaN rows: NaN)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        want = reference(x, axis=1)
    assert np.array_equal(fast(x), want, equal_nan=True)


@pytest.mark.parametrize("seed", range(20))
def test_detect_stall_equals_the_stall_rule(seed: int) -> None:
    """detect_stall skips the rule when too few GPUs busy-wait; the rule itself
    (stall_matrix) must agree."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 9))
    groups = {g: "ab"[g % 2] for g in range(n)} if seed % 3 == 0 else None
    for _ in range(50):
        util = rng.choice([0.0, 0.3, 0.95, 1.0, np.nan], n)
        level = rng.choice([600.0, 0.0, np.nan], n, p=[0.9, 0.05, 0.05])
        power = level * rng.choice([0.2, 0.5, 0.7, 0.9, 1.0], n)
        th = StallThresholds(min_waiting=int(rng.integers(0, 3)))
        got = detect_stall(util, power, level, groups=groups, thresholds=th)
        gi = group_index(list(range(n)), groups)
        stalled, waiting, culprit = stall_matrix(util[:, None], power[:, None], level[:, None],
                                                 list(gi.values()), th)
        assert got.stalled == bool(stalled[0])
        assert got.waiting_gpus == tuple(np.flatnonzero(waiting[:, 0]))
        assert got.culprit_gpus == tuple(np.flatnonzero(culprit[:, 0]))
        assert got.groups == tuple(g for g, rows in gi.items() if waiting[rows, 0].any())
