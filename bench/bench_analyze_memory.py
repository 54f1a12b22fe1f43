"""Peak memory and wall time of `analyze` on a large nvidia-smi CSV trace.

Generates, in a temporary directory, an nvidia-smi CSV log of 8 GPUs polled every
``--interval`` seconds (training steps, a checkpoint pause every 10 minutes, one GPU
hotter than its peers; the columns of a typical ``nvidia-smi --query-gpu=... -lms``
logging command), of about ``--size-mb`` MB, and a reference trace of ``--reference-mb``
MB made the same way. Then runs ``analyze FILE --format json`` on each in a child
process and prints its peak RSS (the child's own ``VmHWM``, reported at its exit) and
wall time, with ratios: RSS per MB of trace, the large run against the reference run,
and both against a bare interpreter importing what analyze imports. Not a pass/fail
test.

    PYTHONPATH=. python bench/bench_analyze_memory.py [--size-mb 1024] [--reference-mb 100]

Generating is fast and bounded in memory: the rows are made a block of polls at a
time with numpy and written as they are made.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

T0 = 1_758_000_000.0
GPUS = 8
NAME = "NVIDIA H100 80GB HBM3"
HEADER = ("timestamp, index, name, power.draw [W], power.limit [W], temperature.gpu, "
          "utilization.gpu [%], utilization.memory [%], clocks.sm [MHz], clocks.mem [MHz], "
          "memory.used [MiB]")
BLOCK_POLLS = 20_000  # polls made and written at a time (160,000 rows: ~20 MB of text)
MB = 1_000_000


def _timestamps(t: np.ndarray) -> list[str]:
    """nvidia-smi's stamp (local time, milliseconds) of each poll, read as UTC."""
    ms = np.round(t * 1000).astype(np.int64)
    secs = (ms // 1000).astype("datetime64[s]").astype(str)  # 2025-09-16T05:20:00
    frac = ms % 1000
    return [f"{s[:4]}/{s[5:7]}/{s[8:10]} {s[11:]}.{f:03d}" for s, f in zip(secs, frac,
                                                                           strict=True)]


def _block(first_poll: int, polls: int, interval: float, rng: np.random.Generator
           ) -> str:
    """The CSV text of ``polls`` polls of every GPU, from poll number ``first_poll``."""
    rel = (first_poll + np.arange(polls)) * interval
    stamps = _timestamps(T0 + rel)
    step = (rel % 2.5) < 1.7  # a 2.5 s training step: compute, then communication
    paused = (rel % 600.0) < 20.0  # a checkpoint every 10 minutes
    lines = []
    for g in range(GPUS):
        power = np.where(step, 640.0, 260.0) + rng.normal(0.0, 12.0, polls)
        power = np.where(paused, 95.0 + rng.normal(0.0, 3.0, polls), power)
        util = np.where(paused, 0, np.where(step, 100, 35))
        temp = np.round(62 + 8 * (g == 5) + 6 * step - 10 * paused
                        + rng.normal(0.0, 0.7, polls)).astype(int)
        sm = np.where(paused, 345, 1980 - 15 * rng.integers(0, 3, polls))
        memutil = np.where(paused, 0, np.where(step, 41, 12))
        used = np.where(paused, 61234, 74211)
        lines += [f"{s}, {g}, {NAME}, {p:.2f} W, 700.00 W, {tc}, {u} %, {mu} %, {c} MHz, "
                  f"2619 MHz, {m} MiB"
                  for s, p, tc, u, mu, c, m in zip(stamps, power, temp, util, memutil, sm,
                                                    used, strict=True)]
    # nvidia-smi writes one poll's GPUs together
    order = np.arange(len(lines)).reshape(GPUS, polls).T.ravel()
    return "\n".join(lines[i] for i in order) + "\n"


def generate(path: str, size_mb: float, interval: float, seed: int = 0) -> int:
    """Write the trace, about ``size_mb`` MB of it; the number of data rows written."""
    rng = np.random.default_rng(seed)
    target = int(size_mb * MB)
    written = rows = polls = 0
    with open(path, "w", encoding="ascii") as fh:
        written += fh.write(HEADER + "\n")
        while written < target:
            text = _block(polls, BLOCK_POLLS, interval, rng)
            per_row = len(text) / (BLOCK_POLLS * GPUS)
            keep = min(BLOCK_POLLS, max(1, int((target - written) / per_row / GPUS) + 1))
            if keep < BLOCK_POLLS:  # the last block: whole polls up to the size asked
                text = "".join(text.splitlines(keepends=True)[:keep * GPUS])
            written += fh.write(text)
            rows += keep * GPUS
            polls += keep
    return rows


# Run in the child: its own peak RSS (VmHWM: this process image's, from exec on) on
# stderr at exit. ru_maxrss from wait4 would also count the parent's pages the child had
# before exec (fork and vfork alike): the generator's, or a test runner's.
_PEAK = """
import atexit, sys
def _peak():
    try:
        with open("/proc/self/status") as f:
            kb = next(line for line in f if line.startswith("VmHWM")).split()[1]
    except (OSError, StopIteration):
        return
    sys.stderr.write(f"\\nVmHWM {kb}\\n")
    sys.stderr.flush()
atexit.register(_peak)
"""
RUN_ANALYZE = _PEAK + """
import runpy
sys.argv = ["exporter", *sys.argv[1:]]
runpy.run_module("exporter", run_name="__main__", alter_sys=True)
"""
IMPORT_ONLY = _PEAK + "import exporter.commands.analyze\n"


def _child(argv: list[str]) -> tuple[int, float, int, str]:
    """(exit status, wall seconds, peak RSS in bytes, stderr) of one child process: its
    VmHWM where it reports one, else ru_maxrss."""
    start = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert proc.stderr is not None
    err = proc.stderr.read().decode(errors="replace")
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - start
    peak = usage.ru_maxrss * 1024  # ru_maxrss: KiB on Linux
    said = [line.split()[1] for line in err.splitlines() if line.startswith("VmHWM ")]
    if said:
        peak = int(said[-1]) * 1024
        err = "\n".join(line for line in err.splitlines() if not line.startswith("VmHWM "))
    return proc.returncode, wall, peak, err


def analyze_peak(path: str) -> tuple[float, int]:
    """(wall seconds, peak RSS in bytes) of ``analyze path --format json`` in a child."""
    rc, wall, rss, err = _child([sys.executable, "-c", RUN_ANALYZE, "analyze", path,
                                 "--format", "json"])
    if rc != 0:
        raise SystemExit(f"analyze {path} failed ({rc}): {err.strip()[-500:]}")
    return wall, rss


def bare_peak() -> tuple[float, int]:
    """(wall seconds, peak RSS in bytes) of an interpreter that imports analyze."""
    rc, wall, rss, err = _child([sys.executable, "-c", IMPORT_ONLY])
    if rc != 0:
        raise SystemExit(f"import failed: {err.strip()[-500:]}")
    return wall, rss


def _analyze(path: str) -> dict[str, float]:
    wall, rss = analyze_peak(path)
    return {"bytes": os.path.getsize(path), "wall": wall, "rss": rss}


def _bare() -> dict[str, float]:
    """An interpreter that imports analyze and stops: the floor under every figure."""
    wall, rss = bare_peak()
    return {"bytes": 0, "wall": wall, "rss": rss}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size-mb", type=float, default=1024.0, help="the large trace (MB)")
    ap.add_argument("--reference-mb", type=float, default=100.0, help="the reference trace")
    ap.add_argument("--interval", type=float, default=0.1, help="seconds between polls")
    ap.add_argument("--dir", help="keep the traces here (default: a temporary directory)")
    ap.add_argument("--json", action="store_true", help="also print the figures as JSON")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-analyze-") as tmp:
        where = args.dir or tmp
        os.makedirs(where, exist_ok=True)
        results: dict[str, dict[str, float]] = {"bare": _bare()}
        for label, size in (("reference", args.reference_mb), ("large", args.size_mb)):
            path = os.path.join(where, f"trace-{size:g}MB.nvidia-smi.csv")
            start = time.perf_counter()
            rows = generate(path, size, args.interval)
            gen = time.perf_counter() - start
            results[label] = dict(_analyze(path), rows=rows, generate=gen)
            if not args.dir:
                os.remove(path)
    bare, ref, big = results["bare"], results["reference"], results["large"]
    print(f"{GPUS} GPUs, a poll every {args.interval:g} s; analyze --format json in a child "
          "process; peak RSS = the child's VmHWM")
    print(f"{'trace':<10} {'MB':>8} {'rows':>11} {'gen s':>7} {'wall s':>8} {'peak RSS MB':>12}"
          f" {'RSS/file':>9} {'(RSS-bare)/file':>16} {'us/row':>7}")
    print(f"{'bare':<10} {'':>8} {'':>11} {'':>7} {bare['wall']:8.2f} {bare['rss'] / MB:12.0f}")
    for label, r in (("reference", ref), ("large", big)):
        print(f"{label:<10} {r['bytes'] / MB:8.0f} {r['rows']:11,d} {r['generate']:7.1f} "
              f"{r['wall']:8.1f} {r['rss'] / MB:12.0f} {r['rss'] / r['bytes']:9.2f} "
              f"{(r['rss'] - bare['rss']) / r['bytes']:16.2f} "
              f"{1e6 * r['wall'] / r['rows']:7.1f}")
    size_x = big["bytes"] / ref["bytes"]
    print(f"large / reference: size {size_x:.1f}x, wall {big['wall'] / ref['wall']:.1f}x, "
          f"peak RSS {big['rss'] / ref['rss']:.2f}x, peak RSS above bare "
          f"{(big['rss'] - bare['rss']) / max(1, ref['rss'] - bare['rss']):.2f}x")
    if args.json:
        print(json.dumps(results))


if __name__ == "__main__":
    main()
