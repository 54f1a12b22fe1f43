"""The program's entry (exporter/entry.py): numpy's BLAS in one thread, unless the user
says otherwise."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

# runs the program (its --help), then loads numpy and BLAS as an analysis would, and says
# how many threads the process has and what OPENBLAS_NUM_THREADS is
PROGRAM_THEN_NUMPY = """
import contextlib, io, os, runpy, sys
sys.argv = ['cluster-telemetry-exporter', '--help']
if PROGRAM:
    with contextlib.redirect_stdout(io.StringIO()):
        try:
            runpy.run_module('exporter.entry', run_name='__main__')
        except SystemExit:
            pass
import numpy as np
np.ones((64, 64)) @ np.ones((64, 64))
print(len(os.listdir('/proc/self/task')), os.environ.get('OPENBLAS_NUM_THREADS'))
"""


# what OpenBLAS reads for its thread count, in its order (none set unless the test says)
BLAS_THREAD_SETTINGS = ("OPENBLAS_DEFAULT_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                        "GOTO_NUM_THREADS", "OMP_NUM_THREADS")


def threads_after(program: bool, **env: str) -> tuple[int, str | None]:
    clean = {k: v for k, v in os.environ.items() if k not in BLAS_THREAD_SETTINGS}
    result = subprocess.run(
        [sys.executable, "-c", f"PROGRAM = {program}\n{PROGRAM_THEN_NUMPY}"],
        env={**clean, **env}, capture_output=True, text=True, timeout=60, check=True)
    count, value = result.stdout.split()
    return int(count), None if value == "None" else value


def numpy_blas() -> str:
    import numpy as np

    try:
        return str(np.show_config(mode="dicts")["Build Dependencies"]["blas"]["name"])
    except (KeyError, TypeError):  # a numpy that does not say
        return ""


needs_cpus = pytest.mark.skipif(
    len(os.sched_getaffinity(0)) < 2 or "openblas" not in numpy_blas().lower(),
    reason="numpy's OpenBLAS starts no worker on one CPU (and another BLAS reads other "
           "settings)")


@needs_cpus
def test_the_program_keeps_numpy_blas_to_its_own_thread():
    # numpy on its own starts BLAS workers, one per CPU it counts, up to its build's limit
    # (the reference: this test can fail) ...
    alone, _ = threads_after(program=False)
    assert alone > 1
    # ... the program's process has none: its own thread only
    assert threads_after(program=True) == (1, "1")


@needs_cpus
def test_a_blas_thread_count_the_user_set_is_kept():
    assert threads_after(program=True, OPENBLAS_NUM_THREADS="2") == (2, "2")


def test_nothing_loads_numpy_before_the_entry_sets_the_blas_threads():
    """The setting only counts if it comes before numpy's import: the console script's
    own imports (the package, its lazy imports, the entry) must not load numpy."""
    code = "import sys, exporter.entry; print('numpy' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=60, check=True)
    assert result.stdout.strip() == "False"
