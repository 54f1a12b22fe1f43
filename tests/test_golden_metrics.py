"""A golden /metrics: the deterministic fake (training scenario, manual clock, 40 s of
simulated time) rendered and compared line by line with tests/golden/training.prom, so a
diff shows exactly what a change did to the output. Values that measure the exporter
itself (CPU, durations, versions) are masked.

After an intended change: CTE_UPDATE_GOLDEN=1 python -m pytest tests/test_golden_metrics.py
and review the diff of the golden file like code.
"""

from __future__ import annotations

import os
import platform
import re

from exporter import __version__
from exporter.gpu.backend import NvmlBackend
from exporter.metrics.render import render
from exporter.sampling.clock import ManualClock
from exporter.sampling.sampler import Sampler, SamplerSettings
from exporter.sim import fake
from exporter.sim.scenarios import load_scenario
from tests.tools import REPO

GOLDEN = REPO / "tests" / "golden" / "training.prom"
# Families whose values measure the exporter (or this machine), not the GPUs.
VOLATILE = re.compile(r"^(cte_loop_cpu_seconds_total|cte_loop_duration_seconds|"
                      r"cte_power_analysis_duration_seconds|"
                      r"cte_straggler_analysis_duration_seconds|cte_source_duration_seconds)"
                      r"[{ ]")


def exposition() -> str:
    clock = ManualClock(1_790_000_000.0)
    with fake.installed(load_scenario("training"), clock, costs=None):
        sampler = Sampler(NvmlBackend(), SamplerSettings(backend="fake", scenario="training"),
                          clock=clock)
        sampler.start(threads=False)
        try:
            sampler.advance(40)
            text = render(sampler.build_snapshot()).decode()
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


def test_metrics_match_the_golden_file():
    text = exposition()
    if os.environ.get("CTE_UPDATE_GOLDEN") == "1":
        GOLDEN.write_text(text)
    expected = GOLDEN.read_text()
    if text != expected:
        import difflib

        diff = "".join(list(difflib.unified_diff(
            expected.splitlines(keepends=True), text.splitlines(keepends=True),
            "tests/golden/training.prom", "now", n=0))[:80])
        raise AssertionError("the exposition changed (if intended: CTE_UPDATE_GOLDEN=1):\n"
                             + diff)


def test_the_exposition_is_deterministic():
    assert exposition() == exposition()
