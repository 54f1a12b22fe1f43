"""Metric profiles side by side, in one run on the 8-GPU fake node (H200 call costs on):
series, render time of a snapshot, the NVLink part of the health read, and the
exporter's CPU while it samples and is scraped. Each figure is printed with its ratio
to `full` (today's output) measured in the same run; not a pass/fail test.

    python bench/bench_profiles.py [--seconds 8] [--renders 50] [--reads 40]

"nvlink-per-gpu.yml" is `full` with a selection file that sums the NVLink families
over the links (and leaves the per-link state out): what it saves in the health read
is what dropping the per-link series saves.
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np

from exporter.app import Exporter
from exporter.config import Config
from exporter.gpu.backend import NvmlBackend
from exporter.gpu.health import read_health
from exporter.gpu.state import read_identity
from exporter.metrics.render import render
from exporter.metrics.selection import Selection, load_selection
from exporter.sampling.clock import ManualClock
from exporter.sampling.sampler import Sampler, SamplerSettings
from exporter.sim import costs, fake
from exporter.sim.scenarios import load_scenario

PER_GPU_FILE = """\
exclude: [gpu_nvlink_link_up]
aggregate:
  - families: "gpu_nvlink_*_total"
    without: [link]
"""


def selections(folder: Path) -> dict[str, Selection]:
    path = folder / "nvlink-per-gpu.yml"
    path.write_text(PER_GPU_FILE)
    return {"minimal": Selection("minimal"), "standard": Selection("standard"),
            "full": Selection("full"), "full + nvlink-per-gpu.yml": load_selection("full",
                                                                                  str(path))}


def series_and_render(chosen: dict[str, Selection], renders: int) -> dict[str, tuple]:
    """(series, median render seconds) per selection, from one snapshot of 40 s."""
    clock = ManualClock(1_790_000_000.0)
    with fake.installed(load_scenario("training"), clock, costs=None):
        sampler = Sampler(NvmlBackend(), SamplerSettings(backend="fake", scenario="training"),
                          clock=clock)
        sampler.start(threads=False)
        try:
            sampler.advance(40)
            snapshot = sampler.build_snapshot()
        finally:
            sampler.stop()
    out = {}
    for name, selection in chosen.items():
        body = render(snapshot, selection=selection)
        lines = sum(1 for line in body.splitlines() if line and not line.startswith(b"#"))
        times = []
        for _ in range(renders):  # a new snapshot each time: nothing cached holds
            fresh = dataclasses.replace(snapshot, time=snapshot.time + 1)
            t = time.perf_counter()
            render(fresh, selection=selection)
            times.append(time.perf_counter() - t)
        out[name] = (lines, float(np.median(times)))
    return out


def health_reads(chosen: dict[str, Selection], reads: int) -> dict[str, tuple]:
    """(median wall, median CPU) of one health read of all 8 GPUs, per selection."""
    out = {}
    clock = ManualClock(1_790_000_000.0)
    with fake.installed(load_scenario("training"), clock, costs=costs.H200):
        backend = NvmlBackend()
        gpus = range(backend.open())
        links = [ident.nvlinks if (ident := read_identity(backend, g)) else 0 for g in gpus]
        for name, selection in chosen.items():
            plan = selection.nvlink_reads()
            walls, cpus = [], []
            for i in range(reads + 1):
                clock.advance(5)
                w, c = time.perf_counter(), time.thread_time()
                for gpu in gpus:
                    read_health(backend, gpu, links[gpu], clock.time(), plan)
                if i:  # the first read of a plan finds out which fields are supported
                    walls.append(time.perf_counter() - w)
                    cpus.append(time.thread_time() - c)
            out[name] = (float(np.median(walls)), float(np.median(cpus)))
        backend.close()
    return out


def exporter_cpu(profile: str, selection_file: str, seconds: float) -> float:
    """CPU seconds per second of a running exporter (fake, H200 costs), scraped each
    second so that every snapshot is rendered."""
    exp = Exporter(Config(listen_address="127.0.0.1:0", fake=True, collector_host=True,
                          collector_infiniband=False, metrics_profile=profile,
                          metrics_file=selection_file))
    exp.start()
    try:
        url = f"http://127.0.0.1:{exp.port}/metrics"
        time.sleep(3)  # past start-up
        start, cpu = time.perf_counter(), time.process_time()
        while time.perf_counter() - start < seconds:
            urllib.request.urlopen(url, timeout=10).read()
            time.sleep(1)
        return (time.process_time() - cpu) / (time.perf_counter() - start)
    finally:
        exp.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=8.0, help="exporter run per profile")
    parser.add_argument("--renders", type=int, default=50)
    parser.add_argument("--reads", type=int, default=40)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        chosen = selections(Path(folder))
        rendered = series_and_render(chosen, args.renders)
        health = health_reads(chosen, args.reads)
        cpu = {name: exporter_cpu(sel.profile, sel.source, args.seconds)
               for name, sel in chosen.items()}
    ref_lines, ref_render = rendered["full"][:2]
    ref_wall, ref_cpu = health["full"]
    print(f"{'selection':28} {'series':>7} {'render ms':>10} {'health read ms (wall/CPU)':>27}"
          f" {'exporter CPU %':>15}")
    for name in chosen:
        lines, render_s = rendered[name]
        wall, read_cpu = health[name]
        share = cpu[name]
        print(f"{name:28} {lines:7d} {render_s * 1e3:6.2f} x{render_s / ref_render:4.2f}"
              f" {wall * 1e3:7.2f}/{read_cpu * 1e3:5.2f} x{wall / ref_wall:4.2f}/"
              f"x{read_cpu / ref_cpu:4.2f}"
              f" {share * 100:6.2f} x{share / cpu['full']:4.2f}")
    print(f"(ratios against full in this run; full serves {ref_lines} series)")


if __name__ == "__main__":
    main()
