"""A golden /metrics: the deterministic fake (training scenario, manual clock, 40 s of
simulated time) rendered and compared line by line with tests/golden/training.prom, so a
diff shows exactly what a change did to the output. Values that measure the exporter
itself (CPU, durations, versions) are masked.

Names, labels, comments and the order of lines are compared exactly; a value that is
not the same text is compared as a number, to 1e-9 relative: numpy's BLAS takes other
code paths (and so rounds differently in the last digits) on other CPUs, and a suite
must pass on every machine our users have. A real change moves a value by far more.

After an intended change:
`CTE_UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/test_golden_metrics.py`,
and review the diff of the golden file like code.
"""

from __future__ import annotations

import math
import os
import platform
import re

from exporter import __version__
from exporter.families import FULL
from exporter.gpu.backend import NvmlBackend
from exporter.metrics.render import render
from exporter.metrics.selection import Selection
from exporter.sampling.clock import ManualClock
from exporter.sampling.sampler import Sampler, SamplerSettings
from exporter.sim import fake
from exporter.sim.scenarios import load_scenario
from tests.tools import REPO

GOLDEN = REPO / "tests" / "golden" / "training.prom"
# Families whose values measure the exporter (or this machine), not the GPUs.
VOLATILE = re.compile(r"^(cte_loop_cpu_seconds_total|cte_loop_duration_seconds|"
                      r"cte_power_analysis_duration_seconds|"
                      r"cte_straggler_analysis_duration_seconds|"
                      r"cte_goodput_account_duration_seconds|cte_source_duration_seconds)"
                      r"[{ ]")


def exposition() -> str:
    clock = ManualClock(1_790_000_000.0)
    with fake.installed(load_scenario("training"), clock, costs=None):
        sampler = Sampler(NvmlBackend(), SamplerSettings(backend="fake", scenario="training"),
                          clock=clock)
        sampler.start(threads=False)
        try:
            sampler.advance(40)
            text = render(sampler.build_snapshot(), selection=Selection(FULL)).decode()
        finally:
            sampler.stop()
    text = text.replace(f'python_version="{platform.python_version()}"',
                        'python_version="<python>"')
    text = text.replace(f'version="{__version__}"', 'version="<version>"')
    lines = []
    for line in text.splitlines():
        if VOLATILE.match(line):
            line = line.rsplit(" ", 1)[0] + " <volatile>"
        lines.append(line)
    return "\n".join(lines) + "\n"


# Relative tolerance for a value whose text differs: BLAS kernels differ by a few ulps.
REL_TOLERANCE = 1e-9


def same_line(expected: str, actual: str) -> bool:
    """Equal text, or the same series with values equal to REL_TOLERANCE."""
    if expected == actual:
        return True
    if expected.startswith("#") or actual.startswith("#"):
        return False
    series_e, _, value_e = expected.rpartition(" ")
    series_a, _, value_a = actual.rpartition(" ")
    if series_e != series_a:
        return False
    try:
        e, a = float(value_e), float(value_a)
    except ValueError:
        return False
    return math.isclose(e, a, rel_tol=REL_TOLERANCE, abs_tol=1e-12)


def same_exposition(expected: str, actual: str) -> bool:
    lines_e, lines_a = expected.splitlines(), actual.splitlines()
    return len(lines_e) == len(lines_a) and all(map(same_line, lines_e, lines_a))


def test_same_line_tolerates_last_digits_only():
    series = 'gpu_power_swing_phase_radians{gpu="0"} '
    assert same_line(series + "0.9719757003421768", series + "0.9719757003421766")
    assert not same_line(series + "0.9719757003421768", series + "0.97198")
    assert not same_line(series + "1.0", 'gpu_power_swing_phase_radians{gpu="1"} 1.0')
    assert not same_line(series + "NaN", series + "1.0")
    assert same_line(series + "NaN", series + "NaN")
    assert not same_line("# HELP a b", "# HELP a c")


def test_metrics_match_the_golden_file():
    text = exposition()
    if os.environ.get("CTE_UPDATE_GOLDEN") == "1":
        GOLDEN.write_text(text)
    expected = GOLDEN.read_text()
    if not same_exposition(expected, text):
        import difflib

        diff = "".join(list(difflib.unified_diff(
            expected.splitlines(keepends=True), text.splitlines(keepends=True),
            "tests/golden/training.prom", "now", n=0))[:80])
        raise AssertionError("the exposition changed (if intended: CTE_UPDATE_GOLDEN=1):\n"
                             + diff)


def test_the_exposition_is_deterministic():
    assert exposition() == exposition()
