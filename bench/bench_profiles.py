"""Metric profiles side by side, in one run on the 8-GPU fake node (H200 call costs on):
series, render time of a snapshot, the NVLink part of the device read, and the
exporter's CPU while it samples and is scraped. Each figure is printed with its ratio
to `full` (today's output) measured in the same run; not a pass/fail test.

    python bench/bench_profiles.py [--seconds 8] [--renders 50] [--reads 40]
                                   [--scenario training]

Series are also split into those with a `gpu` label and the node's, against the targets
tests/test_selection.py holds (`standard`: 100 per GPU plus 200 for the node, 1,000 in
all; `minimal`: 30 per GPU); `--scenario mig` shows them with MIG instances' activity
and energy.

With each profile it also measures dcgm-exporter compatibility (`--metrics.compat
dcgm-exporter`): the series it adds, its render against the profile's own (the same
snapshot, with the collectors `run --fake` has) and the exporter's CPU with it on.

"nvlink-per-gpu.yml" is `full` with a selection file that sums the NVLink families
over the links (and leaves the per-link state out): what it saves in the device read
is what dropping the per-link series saves.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np

from exporter.app import Exporter
from exporter.config import Config
from exporter.gpu.backend import NvmlBackend
from exporter.gpu.device_read import read_device
from exporter.gpu.reading import read_identity
from exporter.metrics.render import FAMILY_FUNCTIONS, CachedFamilies, render
from exporter.metrics.selection import Selection, load_selection
from exporter.metrics.settings import DCGM_EXPORTER, NONE
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


SCENARIO = ["training"]  # --scenario
TARGETS = {"minimal": (30, None, None), "standard": (100, 200, 1000)}  # per GPU, node, all
GPUS = 8
COMPAT_PROFILES = ("minimal", "standard", "full")


def snapshot_of(selection: Selection):
    """The node after 40 s of its scenario, read as the selection reads it."""
    clock = ManualClock(1_790_000_000.0)
    settings = SamplerSettings(backend="fake", scenario=SCENARIO[0],
                               nvlink_reads=selection.nvlink_reads())
    with fake.installed(load_scenario(SCENARIO[0]), clock, costs=None):
        sampler = Sampler(NvmlBackend(), settings, clock=clock)
        sampler.start(threads=False)
        try:
            sampler.advance(40)
            return sampler.build_snapshot()
        finally:
            sampler.stop()


def series_and_render(chosen: dict[str, Selection], renders: int) -> dict[str, tuple]:
    """(series, median render seconds) per selection, taken in turns so that a busy
    machine slows each alike. Each render is of a new snapshot with the same values, as
    a scrape finds between device reads: the NVLink state and error text is reused
    (each selection keeps its own cache of it), the rest is rendered anew."""
    snapshots = {name: snapshot_of(selection) for name, selection in chosen.items()}
    sources = {name: [CachedFamilies(s.families, s.key) if isinstance(s, CachedFamilies)
                      else s for s in FAMILY_FUNCTIONS] for name in chosen}
    times: dict[str, list[float]] = {name: [] for name in chosen}
    lines = {}
    for i in range(renders + 1):
        for name, selection in chosen.items():
            fresh = dataclasses.replace(snapshots[name], time=snapshots[name].time + i)
            t = time.perf_counter()
            body = render(fresh, sources[name], selection=selection)
            if i:
                times[name].append(time.perf_counter() - t)
            else:  # the first fills the cache
                series = [line for line in body.splitlines()
                          if line and not line.startswith(b"#")]
                per_gpu = sum(1 for line in series if b'{gpu="' in line or b',gpu="' in line)
                lines[name] = (len(series), per_gpu)
    return {name: (*lines[name], float(np.median(times[name]))) for name in chosen}


def device_reads(chosen: dict[str, Selection], reads: int) -> dict[str, tuple]:
    """(median wall, median CPU) of one device read of all 8 GPUs, per selection, taken
    in turns."""
    plans = {name: selection.nvlink_reads() for name, selection in chosen.items()}
    walls: dict[str, list[float]] = {name: [] for name in chosen}
    cpus: dict[str, list[float]] = {name: [] for name in chosen}
    clock = ManualClock(1_790_000_000.0)
    with fake.installed(load_scenario(SCENARIO[0]), clock, costs=costs.H200):
        backend = NvmlBackend()
        gpus = range(backend.open())
        links = [ident.nvlinks if (ident := read_identity(backend, g)) else 0 for g in gpus]
        for i in range(reads + 1):
            clock.advance(5)
            for name, plan in plans.items():
                w, c = time.perf_counter(), time.thread_time()
                for gpu in gpus:  # the device read alone: the memory errors are the sweep's
                    read_device(backend, gpu, links[gpu], clock.time(), {}, plan)
                if i:  # the first read of a plan finds out which fields are supported
                    walls[name].append(time.perf_counter() - w)
                    cpus[name].append(time.thread_time() - c)
        backend.close()
    return {name: (float(np.median(walls[name])), float(np.median(cpus[name])))
            for name in chosen}


def exporter_cpu(profile: str, selection_file: str, seconds: float, compat: bool = False,
                 renders: int = 50) -> dict[str, float]:
    """CPU seconds per second of a running exporter (fake, H200 costs), scraped each
    second so that every snapshot is rendered; with `compat`, also the series compat
    mode adds and the median render of its part and of ours, of the last snapshot."""
    exp = Exporter(Config.of(listen_address="127.0.0.1:0", fake=True, collector_host=True,
                          collector_infiniband=False, metrics_profile=profile,
                          metrics_file=selection_file, scenario=SCENARIO[0],
                          metrics_compat=DCGM_EXPORTER if compat else NONE))
    exp.start()
    try:
        url = f"http://127.0.0.1:{exp.port}/metrics"
        time.sleep(3)  # past start-up
        start, cpu = time.perf_counter(), time.process_time()
        while time.perf_counter() - start < seconds:
            urllib.request.urlopen(url, timeout=10).read()
            time.sleep(1)
        out = {"cpu": (time.process_time() - cpu) / (time.perf_counter() - start)}
        current = exp.current
        if compat and exp.compat is not None and current is not None:
            snapshot, health = current.snapshot, current.verdict
            body = exp.compat.render(snapshot, health)
            out["series"] = sum(1 for line in body.splitlines() if not line.startswith(b"#"))
            ours, theirs = [], []
            for i in range(renders):  # in turns, on snapshots a second apart
                fresh = dataclasses.replace(snapshot, time=snapshot.time + i + 1)
                t = time.perf_counter()
                render(fresh, selection=exp.selection)
                ours.append(time.perf_counter() - t)
                t = time.perf_counter()
                exp.compat.render(fresh, health)
                theirs.append(time.perf_counter() - t)
            out["ours_render"] = float(np.median(ours))
            out["compat_render"] = float(np.median(theirs))
        return out
    finally:
        exp.stop()


def exporters_cpu(runs: dict[str, tuple[str, str, bool]], seconds: float
                  ) -> dict[str, dict[str, float]]:
    """exporter_cpu of every (profile, selection file, compat), each in a child process,
    all at once (a busy machine then slows each alike)."""
    children = {name: subprocess.Popen(
        [sys.executable, __file__, "--child", profile, "--file", path,
         "--seconds", str(seconds), "--scenario", SCENARIO[0],
         *(["--compat"] if compat else [])], stdout=subprocess.PIPE, text=True)
        for name, (profile, path, compat) in runs.items()}
    out = {}
    for name, child in children.items():
        stdout, _ = child.communicate(timeout=seconds + 120)
        if child.returncode != 0:
            raise SystemExit(f"{name}: child exited {child.returncode}")
        out[name] = json.loads(stdout.strip().splitlines()[-1])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=8.0, help="exporter run per profile")
    parser.add_argument("--renders", type=int, default=50)
    parser.add_argument("--reads", type=int, default=40)
    parser.add_argument("--child", metavar="PROFILE", help=argparse.SUPPRESS)
    parser.add_argument("--file", default="", help=argparse.SUPPRESS)
    parser.add_argument("--compat", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--scenario", default="training", help="the fake node's scenario")
    args = parser.parse_args()
    SCENARIO[0] = args.scenario
    if args.child:
        print(json.dumps(exporter_cpu(args.child, args.file, args.seconds, args.compat)))
        return
    with tempfile.TemporaryDirectory() as folder:
        chosen = selections(Path(folder))
        rendered = series_and_render(chosen, args.renders)
        reads = device_reads(chosen, args.reads)
        runs = {name: (sel.profile, sel.source, False) for name, sel in chosen.items()}
        runs.update({f"{p} + compat": (p, "", True) for p in COMPAT_PROFILES})
        figures = exporters_cpu(runs, args.seconds)
    cpu = {name: figures[name]["cpu"] for name in chosen}
    ref_lines, _, ref_render = rendered["full"]
    ref_wall, ref_cpu = reads["full"]
    print(f"{'selection':28} {'series':>7} {'render ms':>10} {'device read ms (wall/CPU)':>27}"
          f" {'exporter CPU %':>15}")
    for name in chosen:
        lines, _, render_s = rendered[name]
        wall, read_cpu = reads[name]
        share = cpu[name]
        print(f"{name:28} {lines:7d} {render_s * 1e3:6.2f} x{render_s / ref_render:4.2f}"
              f" {wall * 1e3:7.2f}/{read_cpu * 1e3:5.2f} x{wall / ref_wall:4.2f}/"
              f"x{read_cpu / ref_cpu:4.2f}"
              f" {share * 100:6.2f} x{share / cpu['full']:4.2f}")
    print(f"(ratios against full in this run; full serves {ref_lines} series; scenario "
          f"{SCENARIO[0]})")
    print(f"{'profile':28} {'per GPU':>8} {'node':>6} {'total':>6}  target (per GPU, node, all)")
    for name, (per_gpu_limit, node_limit, total_limit) in TARGETS.items():
        lines, per_gpu, _ = rendered[name]
        node = lines - per_gpu
        within = (per_gpu <= per_gpu_limit * GPUS and (node_limit is None or node <= node_limit)
                  and (total_limit is None or lines <= total_limit))
        print(f"{name:28} {per_gpu / GPUS:8.1f} {node:6d} {lines:6d}  ({per_gpu_limit}, "
              f"{node_limit or '-'}, {total_limit or '-'}): {'within' if within else 'PAST'}")

    print(f"{'dcgm-exporter compat':28} {'series added':>13} {'render ms, ours + compat':>26}"
          f" {'exporter CPU % with it':>23}")
    for profile in COMPAT_PROFILES:
        got = figures[f"{profile} + compat"]
        ours_ms, compat_ms = got["ours_render"] * 1e3, got["compat_render"] * 1e3
        print(f"{profile:28} {int(got['series']):13d} {ours_ms:8.2f} + {compat_ms:5.2f} "
              f"(x{compat_ms / ours_ms:4.2f}) {got['cpu'] * 100:10.2f} "
              f"x{got['cpu'] / cpu[profile]:4.2f}")
    print("(compat render as a share of the profile's own, on the same snapshot; CPU "
          "against the same profile without compat, in this run)")


if __name__ == "__main__":
    main()
