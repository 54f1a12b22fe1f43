"""analyze's peak memory on a generated nvidia-smi log (bench/bench_analyze_memory.py's
trace, 40 MB), above a bare interpreter importing analyze, measured as the bench does
(the child's own VmHWM): the trace's arrays, one power grid, each stage's blocks (a
fixed few MB, much of the figure at this size) and the modules the analyses load, with
the stages' freed memory handed back between them: ~1.2x the file's size; 1.5x when
the stages held whole arrays. On 1 GB it is ~0.3x (docs/performance.md)."""

from __future__ import annotations

from pathlib import Path

from bench.bench_analyze_memory import analyze_peak, bare_peak, generate


def test_analyze_peaks_below_the_files_size_above_the_interpreter(tmp_path: Path) -> None:
    path = tmp_path / "trace.csv"
    generate(str(path), 40.0, 0.1)
    size = path.stat().st_size
    _, bare = bare_peak()
    _, peak = analyze_peak(str(path))
    assert peak - bare < 1.35 * size, (peak - bare) / size
