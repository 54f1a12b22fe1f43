"""HA pairs: with REPLICATION=2 two vmagents scrape every node, and VictoriaMetrics keeps one
sample per scrape interval of the identical pair (-dedup.minScrapeInterval).

Two simulated nodes, two shards that each scrape both, scrapes every 2 s; run from the
unit files of deploy/scale (bench/scale_stack.py).
"""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from bench.scale_stack import BINARIES, ScaleStack, copy_rules, get_json, query
from tests.tools import free_base_port, require_binary, stop_process, wait_for

INTERVAL = 2  # seconds


@pytest.mark.e2e
def test_both_replicas_scrape_every_node_and_the_store_keeps_one_sample(tmp_path):
    for name in BINARIES:
        require_binary(name)
    base = free_base_port(2)
    targets = [f"127.0.0.1:{base}", f"127.0.0.1:{base + 1}"]
    stack = ScaleStack(tmp_path, targets, {"cluster": "ha"}, copy_rules(tmp_path / "rules"),
                       shards=2, replication=2, scrape_interval=f"{INTERVAL}s",
                       evaluation_interval="5s")
    sim = subprocess.Popen(
        [sys.executable, "-m", "exporter", "simulate", "--nodes", "2", "--base-port", str(base),
         "--power.sample-rate", "2", "--sweep.interval", "5", "--log.level", "error"],
        stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        shards = wait_for(lambda: (s := stack.shard_targets()) == [set(targets)] * 2 and s, 60)
        assert shards == [set(targets)] * 2
        # both replicas scrape the node: each reports it up
        for port in stack.vmagent_ports:
            wait_for(lambda port=port: all(
                t["health"] == "up" for t in stack_targets(port)), 90, interval=1)
        time.sleep(8 * INTERVAL)
        window = 6 * INTERVAL
        got = {r["metric"]["instance"]: float(r["value"][1]) for r in query(
            stack.vm, f'count_over_time(scrape_samples_scraped{{cluster="ha"}}[{window}s])')}
        assert set(got) == set(targets), got
        for instance, samples in got.items():
            # one sample per interval (6, give or take one at each edge), not two
            assert 4 <= samples <= 8, (instance, samples)
        series = query(stack.vm, 'count(scrape_samples_scraped{cluster="ha"})')
        assert float(series[0]["value"][1]) == 2  # the pair's series are one series
    finally:
        stop_process(sim)
        stack.stop()


def stack_targets(port: int) -> list[dict]:
    return get_json(f"http://127.0.0.1:{port}/api/v1/targets")["data"]["activeTargets"]
