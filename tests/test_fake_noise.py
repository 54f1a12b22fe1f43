"""The fake's noise tables (exporter/sim/physics.py: normal_table, uniform_table): fixed
by their key, shaped like the distributions they stand for, made without numpy.random."""

from __future__ import annotations

import numpy as np
import pytest

from exporter.sim.physics import normal_table, uniform_table
from tests.tools import fresh_python


def test_a_key_gives_the_same_tables_and_another_key_others():
    assert np.array_equal(normal_table(2000, 4096), normal_table(2000, 4096))
    assert np.array_equal(uniform_table(2001, 4096), uniform_table(2001, 4096))
    assert not np.array_equal(uniform_table(2001, 64), uniform_table(2003, 64))
    # a table's start is the longer table's start: the stream does not depend on n
    assert np.array_equal(uniform_table(7, 10), uniform_table(7, 100)[:10])


def test_the_first_words_are_splitmix64s():
    """SplitMix64 from seed mix(key): Vigna's reference, in Python integers."""
    mask = (1 << 64) - 1

    def mix(z: int) -> int:
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
        return z ^ (z >> 31)

    state, words = mix(12345), []
    for _ in range(5):
        state = (state + 0x9E3779B97F4A7C15) & mask
        words.append((mix(state) >> 11) / (1 << 53))
    assert uniform_table(12345, 5).tolist() == words


@pytest.mark.parametrize("key", [0, 1, 2000, 2**40 + 3])
def test_the_deviates_look_like_their_distributions(key):
    u = uniform_table(key, 4096)
    assert u.min() >= 0.0 and u.max() < 1.0 and abs(u.mean() - 0.5) < 0.03
    z = normal_table(key, 4097)
    assert z.shape == (4097,) and np.isfinite(z).all()
    assert abs(z.mean()) < 0.1 and abs(z.std() - 1.0) < 0.05
    assert abs(np.corrcoef(z[:-1], z[1:])[0, 1]) < 0.06  # successive deviates unrelated
    assert 0.6 < np.mean(np.abs(z) < 1.0) < 0.76  # ~68 % within one sigma


def test_a_fake_node_imports_no_numpy_random():
    code = ("import sys\nfrom exporter.sim.fake import FakeNvmlLibrary\n"
            "from exporter.sim.scenarios import load_scenario\n"
            "lib = FakeNvmlLibrary(load_scenario('training'), costs=None)\n"
            "print(len(lib.gpus), 'numpy.random' in sys.modules)")
    stdout = fresh_python(code, timeout=60)
    assert stdout.split() == ["8", "False"]
