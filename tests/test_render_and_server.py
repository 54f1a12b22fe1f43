"""Rendering once per snapshot, and what the HTTP server does with it."""

from __future__ import annotations

import gzip
import http.client
import socket
import subprocess
import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

from exporter.app import Exporter
from exporter.config import Config
from exporter.metrics.render import render
from exporter.web.server import HealthCheck
from tests.tools import make_snapshot, require_binary, scenario_from_yaml, wait_for


@pytest.fixture(scope="module")
def exporter():
    exp = Exporter(Config(listen_address="127.0.0.1:0", fake=True, scenario="training"))
    exp.start()
    try:
        yield exp
    finally:
        exp.stop()


def get(exporter, path, headers=None, method="GET"):
    conn = http.client.HTTPConnection("127.0.0.1", exporter.port, timeout=5)
    conn.request(method, path, headers=headers or {})
    resp = conn.getresponse()
    body = resp.read()
    conn.close()
    return resp, body


def families(body: bytes) -> dict:
    return {f.name: f for f in text_string_to_metric_families(body.decode())}


def test_metrics_has_every_gpu_and_base_units(exporter):
    resp, body = get(exporter, "/metrics")
    assert resp.status == 200
    assert resp.getheader("Content-Type").startswith("text/plain; version=0.0.4")
    fams = families(body)
    power = fams["gpu_power_watts"]
    assert {s.labels["gpu"] for s in power.samples} == {str(i) for i in range(8)}
    assert all(s.labels["uuid"].startswith("GPU-") for s in power.samples)
    assert fams["gpu_energy_joules"].type == "counter"
    assert fams["gpu_pcie_transmit_bytes"].type == "counter"
    info = fams["gpu_info"].samples  # the 0.0.4 text format writes info metrics as gauges
    assert len(info) == 8 and all(s.value == 1 for s in info)
    assert info[0].labels["name"] == "NVIDIA H100 80GB HBM3"
    assert fams["cte_nvml_errors"].type == "counter"
    rate = {s.labels["loop"]: s.value for s in fams["cte_loop_target_hertz"].samples}
    assert rate == {"power": 1.0, "sweep": 1.0}  # the driver's power buffer, drained at 1 Hz


def test_scrapes_get_the_same_bytes_until_the_next_snapshot(exporter):
    current = exporter.current
    _, first = get(exporter, "/metrics")
    _, second = get(exporter, "/metrics")
    if exporter.current is current:
        assert first == second == current.body
    wait_for(lambda: exporter.current is not current, timeout=5)


def test_gzip_when_accepted(exporter):
    resp, body = get(exporter, "/metrics", {"Accept-Encoding": "gzip, deflate"})
    assert resp.getheader("Content-Encoding") == "gzip"
    assert b"gpu_power_watts" in gzip.decompress(body)


def test_head_healthz_landing_and_404(exporter):
    resp, body = get(exporter, "/metrics", method="HEAD")
    assert resp.status == 200 and body == b""
    assert int(resp.getheader("Content-Length")) > 1000
    resp, body = get(exporter, "/healthz")
    assert (resp.status, body) == (200, b"ok\n")
    resp, body = get(exporter, "/")
    assert resp.status == 200 and b'href="/metrics"' in body and b"fake" in body
    resp, _ = get(exporter, "/nope")
    assert resp.status == 404
    resp, _ = get(exporter, "/metrics", method="POST")
    assert resp.status == 501


def test_garbage_request_does_not_break_serving(exporter):
    with socket.create_connection(("127.0.0.1", exporter.port), timeout=5) as sock:
        sock.sendall(b"\x00\xff garbage \r\n\r\n")
        sock.recv(1024)
    resp, _ = get(exporter, "/metrics")
    assert resp.status == 200


def test_promtool_check_metrics_is_clean(exporter):
    promtool = require_binary("promtool")
    _, body = get(exporter, "/metrics")
    result = subprocess.run([promtool, "check", "metrics"], input=body, capture_output=True,
                            timeout=30)
    assert result.returncode == 0, result.stderr.decode() + result.stdout.decode()
    assert result.stdout == b"" and result.stderr == b""


def test_render_cost_is_paid_once_per_snapshot(exporter):
    snap = exporter.current.snapshot
    assert render(snap) == render(snap)  # deterministic for one snapshot


def test_a_snapshot_is_rendered_by_its_first_scrape_and_only_then(monkeypatch):
    from exporter.metrics import render as render_module

    calls = []
    real = render_module.render
    monkeypatch.setattr(render_module, "render", lambda snap: calls.append(snap) or real(snap))
    rendered = render_module.RenderedSnapshot(make_snapshot())
    assert calls == []  # published, not scraped: nothing rendered
    body, gz = rendered.body, rendered.gzipped
    assert rendered.body is body and rendered.gzipped is gz and len(calls) == 1
    assert gzip.decompress(gz) == body


def test_healthz_reports_stale_sampling(exporter):
    health = HealthCheck(stale_after_seconds=5)
    rendered = exporter.current
    assert health.problems(rendered) == []
    later = time.time() + 60
    problems = health.problems(rendered, now=later)
    assert any("publisher stalled" in p for p in problems)
    assert any("sweep loop stale" in p for p in problems)
    assert health.problems(None) == ["no snapshot published yet"]


HANG = """
gpus: 2
events:
  - {kind: hang, at: 3, gpu: 0, call: nvmlDeviceGetUtilizationRates, seconds: 60}
"""


def test_scrapes_stay_fast_and_healthz_turns_503_during_a_hang(tmp_path):
    path = tmp_path / "hang.yaml"
    path.write_text(HANG)
    scenario_from_yaml(HANG)  # valid
    exp = Exporter(Config(listen_address="127.0.0.1:0", fake=True, scenario=str(path),
                          stale_after_seconds=2))
    exp.start()
    try:
        wait_for(lambda: get(exp, "/healthz")[0].status == 503, timeout=15)
        resp, body = get(exp, "/healthz")
        assert b"sweep loop stale" in body and b"stuck in gpu 0" in body
        latencies = []
        for _ in range(20):
            t0 = time.perf_counter()
            resp, body = get(exp, "/metrics")
            latencies.append(time.perf_counter() - t0)
            assert resp.status == 200
        assert max(latencies) < 0.1
        ages = {s.labels["loop"]: s.value
                for s in families(body)["cte_loop_last_completed_age_seconds"].samples}
        assert ages["sweep"] > 1.5 and ages["power"] < 1.5
    finally:
        exp.stop()
