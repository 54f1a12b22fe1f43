"""Rendering once per snapshot, and what the HTTP server does with it."""

from __future__ import annotations

import dataclasses
import gzip
import http.client
import socket
import subprocess
import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

from exporter.app import Exporter
from exporter.config import Config
from exporter.families import FULL
from exporter.gpu.backend import private_nvml_module
from exporter.gpu.device_read import DeviceRead, NvLink
from exporter.gpu.reading import GpuReading
from exporter.metrics.gpu_hardware import (
    link_memory_families,
    link_memory_key,
    nvlink_traffic_families,
)
from exporter.metrics.render import CachedFamilies, render
from exporter.metrics.selection import Selection
from exporter.web.probes import Probes
from exporter.web.server import accepts_gzip
from tests.tools import (
    http_get,
    make_snapshot,
    not_judged,
    require_binary,
    scenario_from_yaml,
    wait_for,
)


@pytest.fixture(scope="module")
def exporter(module_exporter):
    return module_exporter.start(scenario="training")


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
    assert resp.getheader("Vary") == "Accept-Encoding"
    assert b"gpu_power_watts" in gzip.decompress(body)


@pytest.mark.parametrize("header", ["gzip;q=0", "gzip; q=0.0, deflate", "identity", "",
                                    "*;q=0", "gzip;q=0, *", "br", "gzipx"])
def test_no_gzip_when_refused_or_not_asked_for(exporter, header):
    resp, body = get(exporter, "/metrics", {"Accept-Encoding": header})
    assert resp.getheader("Content-Encoding") is None, header
    assert resp.getheader("Vary") == "Accept-Encoding"
    assert body.startswith(b"# HELP")


@pytest.mark.parametrize("header, gzip_ok", [
    ("gzip", True), ("GZIP;Q=0.5", True), ("x-gzip", True), ("*", True),
    ("deflate, *;q=0.1", True), ("gzip;q=0", False), ("gzip;q=0.000", False),
    ("gzip;q=oops", False), ("*;q=0", False), ("gzip;q=0, *", False), ("", False)])
def test_accept_encoding_is_parsed_with_q_values(header, gzip_ok):
    assert accepts_gzip(header) is gzip_ok


def test_server_header_names_no_python_version(exporter):
    for path in ("/metrics", "/healthz", "/nope"):
        resp, _ = get(exporter, path)
        assert resp.getheader("Server") == "cluster-telemetry-exporter", path


def test_head_healthz_landing_and_404(exporter):
    resp, body = get(exporter, "/metrics", method="HEAD")
    assert resp.status == 200 and body == b""
    assert int(resp.getheader("Content-Length")) > 1000
    resp, body = get(exporter, "/healthz")
    assert (resp.status, body) == (200, b"ok\n")
    resp, body = get(exporter, "/readyz")
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
    monkeypatch.setattr(render_module, "render",
                        lambda snap, *args: calls.append(snap) or real(snap, *args))
    rendered = render_module.RenderedSnapshot(not_judged(make_snapshot()))
    assert calls == []  # published, not scraped: nothing rendered
    body, gz = rendered.body, rendered.gzipped
    assert rendered.body is body and rendered.gzipped is gz and len(calls) == 1
    assert gzip.decompress(gz) == body


def test_liveness_and_readiness_when_sampling_stalls(exporter):
    health = Probes(stale_after_seconds=5)
    rendered = exporter.current
    assert health.liveness(rendered) == []
    assert health.readiness(rendered).status == "ok"
    later = time.time() + 60
    assert any("publisher stalled" in p for p in health.liveness(rendered, now=later))
    readiness = health.readiness(rendered, now=later)
    assert not readiness.ready and readiness.status == "unavailable"
    assert health.liveness(None) == ["no snapshot published yet"]
    assert not health.readiness(None).ready


HANG = """
gpus: 2
events:
  - {kind: hang, at: 1, gpu: 0, call: nvmlDeviceGetUtilizationRates, seconds: 60}
"""


def test_a_hung_gpu_keeps_healthz_200_and_readyz_names_it(tmp_path):
    """A stuck GPU must not turn /healthz 503 (a liveness probe would restart the
    exporter, which cannot help): liveness stays 200; readiness stays 200 and says why
    it is degraded; scrapes stay fast."""
    path = tmp_path / "hang.yaml"
    path.write_text(HANG)
    scenario_from_yaml(HANG)  # valid
    # A private pynvml: the module's exporter must not be the one that meets the hang.
    # Declared hung after 1.2 s (not 2 s), sweeps every 0.5 s: the GPU is named sooner,
    # and it has been stuck over 1 s by the time it is.
    exp = Exporter(Config.of(listen_address="127.0.0.1:0", fake=True, scenario=str(path),
                          hang_timeout_seconds=1.2, sweep_interval_seconds=0.5),
                   nvml=private_nvml_module("hang_test"))
    exp.start()
    try:
        wait_for(lambda: b"GPU 0 stuck" in get(exp, "/readyz")[1], timeout=15)
        resp, body = get(exp, "/readyz")
        assert resp.status == 200 and body.startswith(b"degraded\n"), body
        resp, body = get(exp, "/healthz")
        assert (resp.status, body) == (200, b"ok\n")
        assert b"stuck" in get(exp, "/")[1]  # the landing page shows the detail too
        latencies = []
        for _ in range(20):
            t0 = time.perf_counter()
            resp, body = get(exp, "/metrics")
            latencies.append(time.perf_counter() - t0)
            assert resp.status == 200
        # never blocked by the 60 s hang: 5 s holds on a loaded 2-CPU machine, and a
        # scrape that waited on the hung call would take up to a minute
        assert max(latencies) < 5.0
        assert get(exp, "/healthz")[0].status == 200
        stuck = {s.labels["gpu"]: s.value
                 for s in families(body)["cte_gpu_stuck_seconds"].samples}
        assert stuck["0"] > 1
    finally:
        exp.stop()


def test_link_and_memory_text_is_reused_while_what_it_shows_holds_and_only_then():
    """NVLink state and error counters and the memory families are ~800 series that seldom
    change; their text is reused across readings while their values hold (a reading
    every 5 s, a scrape every 15 s: by reading it would never be), never once a value
    changes. NVLink traffic, which changes every reading, is rendered every time."""
    def device_read(time: float, tx: float, crc: float) -> DeviceRead:
        links = tuple(NvLink(i, True, tx + i, 2 * tx, {"crc_flit": crc if i == 3 else 0.0,
                                                       "replay": 0.0}) for i in range(4))
        return DeviceRead(time, {("corrected", "volatile"): 0.0}, {}, 0.0, {}, 0.0, 0.0,
                          "none", links)

    built = []

    def counted(snapshot):
        built.append(snapshot.time)
        return link_memory_families(snapshot)

    sources = [CachedFamilies(counted, link_memory_key), nvlink_traffic_families]
    def swept(time: float, ecc: float) -> GpuReading:  # the memory errors: the sweep's values
        return GpuReading(time, {"ecc_corrected_volatile": ecc, "row_remap_pending": 0.0})

    first = make_snapshot(2, time=5.0,
                          device_reads={g: device_read(5.0, 1e9, 0.0) for g in range(2)},
                          readings={g: swept(5.0, 0.0) for g in range(2)})
    later = dataclasses.replace(first, time=10.0,
                                device_reads={g: device_read(10.0, 2e9, 0.0) for g in range(2)},
                                readings={g: swept(10.0, 0.0) for g in range(2)})
    worse = dataclasses.replace(later, time=15.0,
                                device_reads={0: device_read(15.0, 3e9, 7.0),
                                              1: later.device_reads[1]})
    # the same device reads, a memory error more in the sweep's reading
    ecc = dataclasses.replace(worse, time=20.0,
                              readings={0: swept(20.0, 1.0), 1: later.readings[1]})
    per_link = Selection(FULL)  # the per-link series
    texts = [render(s, sources, selection=per_link).decode()
             for s in (first, later, worse, ecc)]
    assert built == [5.0, 15.0, 20.0]  # the second reading changed nothing they show
    corrected = ('gpu_ecc_errors_total{gpu="0",scope="volatile",type="corrected",'
                 'uuid="GPU-00000000"}')
    assert f"{corrected} 0.0" in texts[2] and f"{corrected} 1.0" in texts[3]
    assert 'gpu_nvlink_transmit_bytes_total{gpu="0",link="1",uuid="GPU-00000000"} 2.000000001e+09' \
        in texts[1]  # traffic: from each reading
    crc = 'gpu_nvlink_errors_total{gpu="0",link="3",type="crc_flit",uuid="GPU-00000000"}'
    assert f"{crc} 0.0" in texts[1] and f"{crc} 7.0" in texts[2]


def test_an_api_handler_that_fails_answers_500_and_logs_it(running_exporter, caplog):
    """A bug in an API handler is one 500 answer and one log line with the traceback, not
    a connection closed without a word; the exporter answers on."""
    exp = running_exporter.start(manual=True)

    def broken(*args, **kwargs):
        raise OverflowError("a bug")
    exp.server.api.answer = broken
    with caplog.at_level("ERROR", logger="exporter.web.api"):
        resp, body = http_get(exp.port, "/api/v1/findings")
    assert resp.status == 500 and b"internal error" in body
    assert any("/api/v1/findings failed" in r.getMessage() and r.exc_info
               for r in caplog.records)
    assert http_get(exp.port, "/metrics")[0].status == 200
