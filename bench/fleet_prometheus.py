"""Prometheus at fleet scale: memory, series and rule-evaluation time for N simulated nodes.

Starts `cluster-telemetry-exporter simulate --nodes N` and a real Prometheus (loopback)
that scrapes every node and loads alerts/*.yml, runs for --seconds (bounded), then prints
what Prometheus says about itself (/metrics, /api/v1/rules) and the simulator's CPU use.

    PYTHONPATH=. python bench/fleet_prometheus.py --nodes 64 --seconds 150
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import psutil
import yaml

REPO = Path(__file__).resolve().parent.parent


def get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return resp.read()


def prom_metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return float("nan")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=64)
    ap.add_argument("--gpus-per-node", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=150, help="run time, at most 600")
    ap.add_argument("--base-port", type=int, default=21000)
    ap.add_argument("--power-rate", type=float, default=2.0)
    ap.add_argument("--sweep-interval", type=float, default=5.0)
    ap.add_argument("--interval", default="15s", help="scrape and evaluation interval")
    args = ap.parse_args()
    seconds = min(args.seconds, 600)
    work = Path(tempfile.mkdtemp(prefix="cte-bench-"))
    sim = subprocess.Popen(
        [sys.executable, "-m", "exporter", "simulate", "--nodes", str(args.nodes),
         "--gpus-per-node", str(args.gpus_per_node), "--base-port", str(args.base_port),
         "--power.sample-rate", str(args.power_rate),
         "--sweep.interval", str(args.sweep_interval), "--log.level", "error"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    prom = None
    try:
        deadline = time.monotonic() + 300
        line = ""
        while "127.0.0.1" not in line and time.monotonic() < deadline:
            line = sim.stdout.readline()
            if not line and sim.poll() is not None:
                raise SystemExit("simulator exited")
        targets = line.split()
        body = get(f"http://{targets[0]}/metrics").decode()
        series_per_node = sum(1 for x in body.splitlines() if x and not x.startswith("#"))
        port = args.base_port - 1
        config = {"global": {"scrape_interval": args.interval,
                             "evaluation_interval": args.interval},
                  "rule_files": [str(p) for p in sorted((REPO / "alerts").glob("*.yml"))],
                  "scrape_configs": [{"job_name": "gpu", "static_configs": [
                      {"targets": targets, "labels": {"cluster": "bench"}}]}]}
        (work / "prometheus.yml").write_text(yaml.safe_dump(config))
        prom = subprocess.Popen(
            [shutil.which("prometheus") or "prometheus", f"--config.file={work}/prometheus.yml",
             f"--storage.tsdb.path={work}/data", f"--web.listen-address=127.0.0.1:{port}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        sim_ps = psutil.Process(sim.pid)
        time.sleep(min(20.0, seconds / 4))
        cpu0, t0 = sum(sim_ps.cpu_times()[:2]), time.monotonic()
        time.sleep(max(1.0, seconds - min(20.0, seconds / 4)))
        sim_cpu = (sum(sim_ps.cpu_times()[:2]) - cpu0) / (time.monotonic() - t0)
        base = f"http://127.0.0.1:{port}"
        pm = get(f"{base}/metrics").decode()
        rules = json.loads(get(f"{base}/api/v1/rules"))["data"]["groups"]
        samples = json.loads(get(f"{base}/api/v1/query?query=sum(scrape_samples_scraped)"))
        scraped = float(samples["data"]["result"][0]["value"][1])
        print(f"nodes {args.nodes} x {args.gpus_per_node} GPUs, scrape/eval every "
              f"{args.interval}, ran {seconds:.0f} s")
        print(f"series per node (exposition lines, defaults + IB 2 HCAs + jobs): "
              f"{series_per_node}; samples per scrape round: {scraped:.0f}")
        print(f"prometheus head series: {prom_metric(pm, 'prometheus_tsdb_head_series'):.0f}")
        print(f"prometheus RSS: {prom_metric(pm, 'process_resident_memory_bytes') / 2**20:.0f} "
              f"MiB, Go heap in use: {prom_metric(pm, 'go_memstats_heap_inuse_bytes') / 2**20:.0f}"
              " MiB")
        total = 0.0
        for group in rules:
            total += group["evaluationTime"]
            print(f"  rule group {group['name']:<24} {group['evaluationTime'] * 1000:8.2f} ms "
                  f"({len(group['rules'])} rules)")
        print(f"rule evaluation, all groups: {total * 1000:.1f} ms per round")
        print(f"simulator CPU: {sim_cpu * 100:.0f} % of one core "
              f"({sim_cpu * 100 / args.nodes:.1f} % per node; {psutil.cpu_count()} CPUs here)")
    finally:
        for proc in (prom, sim):
            if proc is not None:
                proc.terminate()
                try:
                    proc.wait(20)
                except subprocess.TimeoutExpired:
                    proc.kill()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
