"""The sharded deployment at fleet scale: what each node costs the shards, store and rulers.

Starts `cluster-telemetry-exporter simulate --nodes N` (power at 2 Hz and a 5 s sweep, as
bench/fleet_prometheus.py, so a fleet fits on a small machine), the deployment of
deploy/scale on loopback (VictoriaMetrics, --shards vmagents, the node-local and the global
vmalert, Alertmanager) and, as the reference in the same run, one Prometheus that scrapes
every node and evaluates every rule file. After --seconds it prints, per node scraped:
samples per scrape and per second, the store's bytes per sample on disk, vmagent CPU and
memory, and the rulers' evaluation time per group, with Prometheus's figures beside them.

    PYTHONPATH=. python bench/fleet_scale.py --nodes 32 --seconds 300

Needs the Debian packages victoria-metrics, prometheus-alertmanager and prometheus.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import psutil
import yaml
from scale_stack import ScaleStack, binary, copy_rules, free_port, query, stop_process

REPO = Path(__file__).resolve().parent.parent


def text(url: str) -> str:
    with urllib.request.urlopen(url, timeout=30) as resp:
        return resp.read().decode()


def metric_sum(body: str, name: str, where: str = "") -> float:
    """Sum of a metric's samples whose labels match the regex `where`."""
    total = 0.0
    for line in body.splitlines():
        m = re.match(rf"{re.escape(name)}(\{{[^}}]*\}})? (\S+)$", line)
        if m and re.search(where, m.group(1) or ""):
            total += float(m.group(2))
    return total


def per_group(body: str, name: str) -> dict[str, float]:
    """{group: mean seconds} from a vmalert summary's _sum and _count."""
    sums, counts = {}, {}
    for line in body.splitlines():
        m = re.match(rf'{name}_(sum|count)\{{.*?group="([^"]+)".*\}} (\S+)$', line)
        if m:
            (sums if m.group(1) == "sum" else counts)[m.group(2)] = float(m.group(3))
    return {g: sums[g] / counts[g] for g in sums if counts.get(g)}


def cpu_seconds(pids: dict[str, int]) -> dict[str, float]:
    out = {}
    for name, pid in pids.items():
        try:
            out[name] = sum(psutil.Process(pid).cpu_times()[:2])
        except psutil.Error:
            out[name] = float("nan")
    return out


def rss(pid: int) -> float:
    return psutil.Process(pid).memory_info().rss


class Prometheus:
    """The reference: one Prometheus scraping every node and evaluating every rule file."""

    def __init__(self, work: Path, targets: list[str], labels: dict[str, str], rules: Path,
                 interval: str):
        self.port = free_port()
        config = {"global": {"scrape_interval": interval, "evaluation_interval": interval},
                  "rule_files": [str(p) for p in sorted(rules.glob("*.yml"))],
                  "scrape_configs": [{"job_name": "gpu-nodes", "static_configs": [
                      {"targets": targets, "labels": labels}]}]}
        (work / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.process = subprocess.Popen(
            [binary("prometheus"), f"--config.file={work}/prometheus.yml",
             f"--storage.tsdb.path={work}/prometheus",
             f"--web.listen-address=127.0.0.1:{self.port}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def api(self, path: str) -> dict:
        return json.loads(text(f"http://127.0.0.1:{self.port}/api/v1/{path}"))["data"]

    def stop(self) -> None:
        stop_process(self.process)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=32)
    ap.add_argument("--scenario", default="healthy", help="fleet scenario (default healthy)")
    ap.add_argument("--profile", default="standard", choices=("minimal", "standard", "full"),
                    help="--metrics.profile of the simulated nodes (default standard)")
    ap.add_argument("--shards", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=300, help="run time, at most 900")
    ap.add_argument("--warmup", type=float, default=60, help="seconds before CPU is counted")
    ap.add_argument("--interval", default="15s", help="scrape and evaluation interval")
    ap.add_argument("--base-port", type=int, default=21000)
    args = ap.parse_args()
    seconds = min(args.seconds, 900)
    interval = float(args.interval.rstrip("s"))
    work = Path(tempfile.mkdtemp(prefix="cte-bench-scale-"))
    rules = copy_rules(work / "rules")
    targets = [f"127.0.0.1:{args.base_port + i}" for i in range(args.nodes)]
    labels = {"cluster": "bench"}
    prom = Prometheus(work, targets, labels, rules, args.interval)
    stack = sim = None
    try:
        stack = ScaleStack(work, targets, labels, rules, shards=args.shards,
                           scrape_interval=args.interval, evaluation_interval=args.interval,
                           latency_offset=None)
        sim = subprocess.Popen(
            [sys.executable, "-m", "exporter", "simulate", "--scenario", args.scenario,
             "--nodes", str(args.nodes), "--base-port", str(args.base_port),
             "--power.sample-rate", "2", "--sweep.interval", "5", "--log.level", "error",
             "--metrics.profile", args.profile],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        line, deadline = "", time.monotonic() + 300
        while "127.0.0.1" not in line and time.monotonic() < deadline:
            line = sim.stdout.readline()
            if not line and sim.poll() is not None:
                raise SystemExit("simulate exited")
        pids = stack.pids | {"prometheus": prom.process.pid, "simulator": sim.pid}
        time.sleep(args.warmup)
        cpu0, t0 = cpu_seconds(pids), time.monotonic()
        vm_metrics = text(f"{stack.vm}/metrics")
        rows0 = metric_sum(vm_metrics, "vm_rows_inserted_total")
        time.sleep(max(1.0, seconds - args.warmup))
        wall = time.monotonic() - t0
        cpu = {k: (v - cpu0[k]) / wall for k, v in cpu_seconds(pids).items()}
        report(args, stack, prom, cpu, pids, rows0, wall, interval)
    finally:
        if sim is not None:
            stop_process(sim)
        if stack is not None:
            stack.stop()
        prom.stop()
    return 0


def disk(stack: ScaleStack, pids: dict[str, int], series: float, when: str) -> None:
    body = text(f"{stack.vm}/metrics")
    data = metric_sum(body, "vm_data_size_bytes", 'type="storage/')
    index = metric_sum(body, "vm_data_size_bytes", 'type="indexdb')
    rows = metric_sum(body, "vm_rows", 'type="storage/')
    print(f"VictoriaMetrics on disk, {when}: {rows:.0f} samples, {data / max(rows, 1):.2f} "
          f"bytes per sample; index {index / 2**20:.1f} MiB ({index / max(series, 1):.0f} bytes "
          f"per active series); RSS {rss(pids['victoria-metrics']) / 2**20:.0f} MiB")


def report(args, stack: ScaleStack, prom: Prometheus, cpu: dict[str, float],
           pids: dict[str, int], rows0: float, wall: float, interval: float) -> None:
    n = args.nodes
    scraped = float(query(stack.vm, 'sum(scrape_samples_scraped{cluster="bench"})')[0]["value"][1])
    per_node = scraped / n
    vm_metrics = text(f"{stack.vm}/metrics")
    inserted = (metric_sum(vm_metrics, "vm_rows_inserted_total") - rows0) / wall
    active = metric_sum(vm_metrics, "vm_cache_entries", 'type="storage/hour_metric_ids"')
    print(f"{n} nodes ({args.scenario}), {args.shards} vmagent shards, scrape and evaluation "
          f"every {args.interval}, {wall:.0f} s measured after {args.warmup:.0f} s; "
          f"{psutil.cpu_count()} CPUs here")
    print(f"samples per scrape per node: {per_node:.0f} "
          f"({per_node / interval:.0f} samples/s per node at {args.interval})")
    print(f"VictoriaMetrics: {inserted:.0f} rows/s inserted ({inserted / n:.0f} per node, rules "
          f"included); active series {active:.0f} ({active / n:.0f} per node)")
    # bytes per sample: flush what is in memory, then what the store holds on disk; then
    # merge the parts as the store does over hours, and again
    text(f"{stack.vm}/internal/force_flush")
    time.sleep(2)
    disk(stack, pids, active, "as written")
    text(f"{stack.vm}/internal/force_merge?partition_prefix={time.strftime('%Y_%m')}")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        time.sleep(2)
        if metric_sum(text(f"{stack.vm}/metrics"), "vm_active_merges") == 0:
            break
    disk(stack, pids, active, "merged")
    agent_cpu = sum(v for k, v in cpu.items() if k.startswith("vmagent"))
    agent_rss = sum(rss(p) for k, p in pids.items() if k.startswith("vmagent"))
    print(f"vmagent (all shards): {agent_cpu * 100:.1f} % of a core, "
          f"{agent_cpu * 100 / n:.3f} % per node scraped; RSS {agent_rss / 2**20:.0f} MiB "
          f"({agent_rss / n / 2**20:.2f} MiB per node)")
    print(f"reference, Prometheus scraping every node and evaluating every rule: "
          f"{cpu['prometheus'] * 100:.1f} % of a core ({cpu['prometheus'] * 100 / n:.3f} % per "
          f"node); vmagent / Prometheus CPU: {agent_cpu / cpu['prometheus']:.2f}")
    for name in ("victoria-metrics", "vmalert-node", "vmalert-global", "simulator"):
        print(f"{name} CPU: {cpu[name] * 100:.1f} % of a core")
    prom_groups = {g["name"]: g["evaluationTime"] for g in prom.api("rules")["groups"]}
    global_names = set()
    for ruler in ("vmalert-node", "vmalert-global"):
        base = stack.vmalert_node if ruler == "vmalert-node" else stack.vmalert_global
        groups = per_group(text(f"{base}/metrics"), "vmalert_iteration_duration_seconds")
        if ruler == "vmalert-global":
            global_names = set(groups)
        total = sum(groups.values())
        ref = sum(prom_groups.get(g, 0.0) for g in groups)
        print(f"{ruler}: {total * 1000:.1f} ms per round ({total * 1000 / n * 1000:.0f} ms per "
              f"1,000 nodes, linear); Prometheus, same groups: {ref * 1000:.1f} ms")
        for group, secs in sorted(groups.items()):
            print(f"  {group:<28} {secs * 1000:8.1f} ms   Prometheus "
                  f"{prom_groups.get(group, float('nan')) * 1000:8.1f} ms")
    assert global_names, "vmalert-global reported no group"


if __name__ == "__main__":
    sys.exit(main())
