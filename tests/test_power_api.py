"""/api/v1/power and /api/v1/findings (exporter/web/api.py): shapes, validation, bounds,
one build per snapshot, and the static files, over a real HTTP server."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest

from exporter.metrics.render import RenderedSnapshot
from exporter.sampling.buffers import PowerBuffer, PowerRingView
from exporter.sampling.snapshot import PowerSamplingStats
from exporter.web import api, static
from exporter.web.jsonarrays import json_array
from exporter.web.probes import Readiness
from tests.tools import http_get, judged, make_snapshot, not_judged

T0 = 1_700_000_000.0


# -- numbers ---------------------------------------------------------------------------------

@pytest.mark.parametrize("decimals", [0, 1, 3])
def test_json_array_writes_the_rounded_numbers(decimals):
    rng = np.random.default_rng(decimals)
    cases = [rng.random(500) * 1000, rng.random(200) * 1e9, T0 + np.arange(300) * 0.02,
             np.array([0.0, 0.04, 0.05, 9.96, 10.0, 99.95, 9999.99996, 1e6, 123456789.5]),
             np.array([np.nan, 1.0, np.inf, 0.0, -np.inf]), np.array([np.nan]),
             np.array([-1.5, 2.0]), np.array([1e300, 1.0])]
    for values in cases:
        expected = [float(np.round(v, decimals)) if np.isfinite(v) else None for v in values]
        assert json.loads(json_array(values, decimals)) == expected, values
    assert json_array(np.zeros(0), 1) == b"[]"


# -- queries -------------------------------------------------------------------------------------

def _snapshot(gpus: int = 2, seconds: float = 100.0, rate: float = 50.0, **fields):
    """gpus x `seconds` of 50 Hz samples: GPU g swings between 200 + g and 700 + g W at 1 Hz;
    each GPU's timestamps are offset a little, as drivers' are."""
    buffer = PowerBuffer(gpus, int(64 * 660), 660.0)
    n = int(seconds * rate)
    for g in range(gpus):
        t = T0 + g * 0.003 + np.arange(n) / rate
        watts = np.where((t % 1.0) < 0.5, 700.0, 200.0) + g
        buffer.append(g, t, watts)
    sources = {g: PowerSamplingStats("buffer", 1 / rate, n, 0, 0.0, 0.0) for g in range(gpus)}
    values = {"time": T0 + seconds, "power_ring": PowerRingView(buffer),
              "power_sampling": sources, "observable_band_hz": (0.0, rate / 2), **fields}
    return make_snapshot(gpus, **values)


@pytest.mark.parametrize("query, error", [
    ("seconds=0", "seconds must be a whole number from 1 to 660"),
    ("seconds=661", "seconds must be a whole number from 1 to 660"),
    ("seconds=1.5", "seconds must be a whole number"),
    ("seconds=", "seconds must be a whole number"),
    ("seconds=-5", "seconds must be a whole number"),
    ("seconds=%36%30", "seconds must be a whole number"),
    ("seconds=１２", "seconds must be a whole number"),  # fullwidth digits: isdigit() is True
    ("gpu=2", "gpu must be a GPU index from 0 to 1"),
    ("gpu=x", "gpu must be a GPU index"),
    ("seconds=5&seconds=6", "parameter 'seconds' given twice"),
    ("window=5", "unknown parameter 'window'; allowed: seconds, gpu"),
    ("seconds=5&" + "x" * 100, "query string too long"),
])
def test_bad_power_queries_are_refused_with_one_line(query, error):
    with pytest.raises(api.BadRequest, match=error.replace("(", r"\(")):
        api.power_query(query, _snapshot())


def test_good_power_queries():
    snap = _snapshot()
    assert api.power_query("", snap) == api.PowerQuery(60, None)
    assert api.power_query("seconds=660&gpu=1", snap) == api.PowerQuery(660, 1)
    assert api.power_query("gpu=0&seconds=30", snap) == api.PowerQuery(30, 0)


# -- bodies --------------------------------------------------------------------------------------

def test_power_body_is_native_rate_per_gpu_and_the_node_summed():
    body = json.loads(api.power_body(_snapshot(), api.PowerQuery(30, None)))
    assert set(body) == {"time", "seconds", "sample_interval_seconds", "observable_band_hz",
                         "max_points_per_series", "gpus", "node"}
    assert body["sample_interval_seconds"] == 0.02 and body["observable_band_hz"] == [0, 25]
    assert set(body["gpus"]) == {"0", "1"}
    for g, series in body["gpus"].items():
        t, w = np.array(series["timestamps"]), np.array(series["watts"])
        assert len(t) == len(w) == 1500 and not series["decimated"]  # 30 s at 50 Hz
        assert np.all(np.diff(t) > 0) and t[-1] - t[0] == pytest.approx(29.98, abs=0.01)
        assert set(w) == {200.0 + int(g), 700.0 + int(g)}
    node = body["node"]
    t, w = np.array(node["timestamps"]), np.array(node["watts"], dtype=float)
    assert np.allclose(np.diff(t), 0.02, atol=0.0011)  # the grid, at ms resolution
    assert np.nanmax(w) == pytest.approx(1401.0) and np.nanmin(w) == pytest.approx(401.0)


def test_one_gpu_and_long_windows_are_bounded():
    snap = _snapshot(2, seconds=650)
    one = json.loads(api.power_body(snap, api.PowerQuery(30, 1)))
    assert set(one["gpus"]) == {"1"} and len(one["node"]["watts"]) > 1000
    full = api.power_body(snap, api.PowerQuery(660, None))
    body = json.loads(full)
    for series in [*body["gpus"].values(), body["node"]]:
        assert series["decimated"]
        assert len(series["timestamps"]) <= api.MAX_POINTS_PER_SERIES
        watts = [w for w in series["watts"] if w is not None]  # the node: none before data
        assert min(watts) in (200.0, 201.0, 401.0)  # dips survive decimation
    assert len(full) < 3 * 2 * 6000 * 16  # 3 series, 2 arrays, ~16 bytes a number


def test_decimation_keeps_each_buckets_extremes_in_time_order():
    t = np.arange(10_000.0)
    w = np.sin(t / 50.0)
    w[1234], w[8765] = 5.0, -5.0
    td, wd, decimated = api.decimate(t, w, 1000)
    assert decimated and len(td) <= 1000 and np.all(np.diff(td) > 0)
    assert wd.max() == 5.0 and wd.min() == -5.0
    assert api.decimate(t[:100], w[:100], 1000)[2] is False


@pytest.mark.parametrize("seed", range(4))
def test_decimation_keeps_what_unique_indices_keep(seed: int) -> None:
    """The kept indices, made unique by a sort: those np.unique gives (gaps as NaN)."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1001, 20_000))
    t = np.cumsum(rng.uniform(0.01, 0.03, n))
    w = rng.integers(0, 4, n).astype(float)  # ties: a bucket's lowest may be its highest
    w[rng.random(n) < 0.1] = np.nan
    w[:int(rng.integers(0, 50))] = np.nan  # a whole bucket without a value
    td, wd, decimated = api.decimate(t, w, 1000)
    per = -(-n // 500)
    padded = np.concatenate([w, np.full(-(-n // per) * per - n, np.nan)]).reshape(-1, per)
    base = np.arange(len(padded)) * per
    lo = np.argmin(np.where(np.isnan(padded), np.inf, padded), axis=1)
    hi = np.argmax(np.where(np.isnan(padded), -np.inf, padded), axis=1)
    keep = np.unique(np.concatenate([base + lo, base + hi]))
    keep = keep[keep < n]
    assert decimated and np.array_equal(td, t[keep])
    assert np.array_equal(wd, w[keep], equal_nan=True)


def test_a_snapshot_without_samples_answers_empty_series():
    body = json.loads(api.power_body(make_snapshot(2), api.PowerQuery(30, None)))
    assert body["gpus"] == {"0": {"timestamps": [], "watts": [], "decimated": False},
                            "1": {"timestamps": [], "watts": [], "decimated": False}}
    assert body["node"]["timestamps"] == [] and body["sample_interval_seconds"] is None


def test_findings_body_has_the_node_summary():
    from exporter.collectors.jobs.reading import JobsReading
    from exporter.sampling.snapshot import CollectorResult

    jobs = CollectorResult(JobsReading({0: ("job-7",), 1: ("job-7", "job-8")}, {}), 0.0, True, 0)
    snap = _snapshot(2, collectors={"jobs": jobs}, lost=frozenset({1}))
    body = json.loads(api.findings_body(judged(snap), Readiness(True, ("GPU 1 lost",)),
                                        "node-a"))
    assert [f["kind"] for f in body["findings"]] == ["gpu_lost"]
    s = body["summary"]
    assert (s["node"], s["gpus_up"], s["gpu_count"], s["expected_gpus"]) == ("node-a", 1, 2, 2)
    assert s["readiness"] == {"status": "degraded", "words": "ready, degraded: GPU 1 lost",
                              "problems": ["GPU 1 lost"]}
    assert [(g["gpu"], g["up"], g["lost"], g["jobs"]) for g in s["gpus"]] == [
        (0, True, False, ["job-7"]), (1, False, True, ["job-7", "job-8"])]


def test_answers_are_built_once_per_snapshot_and_query(monkeypatch):
    builds = []
    real = api.power_body
    monkeypatch.setattr(api, "power_body", lambda s, q: builds.append(q) or real(s, q))
    service = api.Api(lambda rendered: Readiness(True, ()), node="n")
    first = RenderedSnapshot(not_judged(_snapshot()))
    a = service.answer(first, api.POWER, "seconds=30")
    assert service.answer(first, api.POWER, "seconds=30") is a
    service.answer(first, api.POWER, "seconds=31")
    assert service.answer(RenderedSnapshot(not_judged(_snapshot())), api.POWER,
                          "seconds=30") is not a
    assert builds == [api.PowerQuery(30, None), api.PowerQuery(31, None),
                      api.PowerQuery(30, None)]
    assert gzip.decompress(a.gzipped) == a.body
    f = service.answer(first, api.FINDINGS, "")
    assert service.answer(first, api.FINDINGS, "") is f
    with pytest.raises(api.BadRequest, match="none allowed"):
        service.answer(first, api.FINDINGS, "gpu=1")


# -- over HTTP -------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def straggler_node(module_exporter):
    """The straggler scenario, 35 s of simulated time."""
    exp = module_exporter.start(manual=True, scenario="straggler",
                                straggler_persistence_seconds=5)
    exp.sampler.advance(35)
    return exp


def _json(port: int, path: str, **headers):
    resp, body = http_get(port, path, headers=headers)
    if resp.getheader("Content-Encoding") == "gzip":
        body = gzip.decompress(body)
    return resp, json.loads(body)


def test_power_over_http_after_35_s(straggler_node):
    resp, body = _json(straggler_node.port, "/api/v1/power?seconds=30")
    assert resp.status == 200 and resp.getheader("Content-Type") == "application/json"
    assert resp.getheader("Cache-Control") == "no-store"
    assert sorted(body["gpus"], key=int) == [str(g) for g in range(8)]
    for series in body["gpus"].values():
        assert len(series["timestamps"]) >= 20 * 30  # native rate: >= 20 points a second
    assert len(body["node"]["watts"]) >= 20 * 30
    zipped, same = _json(straggler_node.port, "/api/v1/power?seconds=30",
                         **{"Accept-Encoding": "gzip"})
    assert zipped.getheader("Content-Encoding") == "gzip" and same == body


def test_findings_over_http_name_the_straggler(straggler_node):
    resp, body = _json(straggler_node.port, "/api/v1/findings")
    assert resp.status == 200
    stragglers = [f for f in body["findings"] if f["kind"] == "straggler"]
    assert [f["gpu"] for f in stragglers] == [5]
    assert stragglers[0]["message"].startswith("GPU 5 is a straggler: SM clock 1")
    assert body["summary"]["gpus_up"] == 8


@pytest.mark.parametrize("path, status", [
    ("/api/v1/power?seconds=0", 400), ("/api/v1/power?gpu=8", 400),
    ("/api/v1/power?seconds=" + "9" * 70, 400),
    ("/api/v1/power?seconds=" + "9" * 9000, 414), ("/api/v1/findings?x", 400),
    ("/api/v1/nothing", 404), ("/api/v1/power/", 404)])
def test_bad_requests_over_http(straggler_node, path, status):
    resp, body = http_get(straggler_node.port, path)
    assert resp.status == status
    if status == 400:
        assert body.count(b"\n") == 1 and "error" in json.loads(body)


def test_static_files_from_memory_with_caching(straggler_node):
    port = straggler_node.port
    resp, body = http_get(port, "/static/uPlot.iife.min.js")
    assert resp.status == 200 and body.startswith(b"/*! https://github.com/leeoniya/uPlot")
    assert resp.getheader("Content-Type") == "text/javascript; charset=utf-8"
    assert resp.getheader("Cache-Control") == static.CACHE_CONTROL
    etag = resp.getheader("ETag")
    again, empty = http_get(port, "/static/uPlot.iife.min.js", {"If-None-Match": etag})
    assert again.status == 304 and empty == b""
    zipped, packed = http_get(port, "/static/page.js?v=old", {"Accept-Encoding": "gzip"})
    assert zipped.getheader("Content-Encoding") == "gzip" and b"uPlot.join" in gzip.decompress(
        packed)
    for path in ("/static/", "/static/../server.py", "/static/%2e%2e/api.py",
                 "/static/static.py", "/static//etc/passwd", "/static/page.js/"):
        assert http_get(port, path)[0].status == 404, path


def test_the_page_links_only_its_own_origin(straggler_node):
    resp, body = http_get(straggler_node.port, "/")
    assert resp.status == 200
    csp = resp.getheader("Content-Security-Policy")
    assert "default-src 'none'" in csp and "connect-src 'self'" in csp
    page = body.decode()
    assert "http://" not in page and "https://" not in page  # no CDN, nothing off the node
    for name in ("uPlot.iife.min.js", "uPlot.min.css", "page.js", "page.css"):
        assert static.url(name) in page


@pytest.mark.parametrize("state", ["failed", "warning", "ok", "unknown", "not_applicable"])
def test_the_api_says_the_published_verdict_in_each_state(state):
    """/api/v1/findings and /api/v1/health read one published value: a lost GPU's finding
    takes the severity of the verdict's gpu_answering check (no critical of the page's
    own), and both answers give the action in the verdict's words."""
    from exporter.health.model import (
        ACTION_WORDS,
        REBOOT_NODE,
        CheckResult,
        NodeHealth,
        verdict,
    )
    from exporter.health.monitor import Published

    action = REBOOT_NODE if state in ("failed", "warning") else "none"
    answering = CheckResult("gpu_answering", state, "lost", None, "test", 0.0, action,
                            "GPU lost (fell off the bus)")
    health = NodeHealth(T0, verdict(()), {0: verdict(()), 1: verdict((answering,))})
    rendered = RenderedSnapshot(Published(_snapshot(2, lost=frozenset({1})), health))
    service = api.Api(lambda rendered: Readiness(True, ()), node="n")
    found = json.loads(service.answer(rendered, api.FINDINGS, "").body)["findings"]
    (lost,) = [f for f in found if f["kind"] == "gpu_lost"]
    assert lost["severity"] == {"failed": "critical", "warning": "warning"}.get(state, "info")
    assert lost["details"]["verdict"] == {
        "check": "gpu_answering", "state": state, "action": action,
        "action_words": ACTION_WORDS[action], "reason": "GPU lost (fell off the bus)"}
    said = json.loads(service.answer(rendered, api.HEALTH, "").body)
    (check,) = said["gpus"]["1"]["checks"]
    assert (check["state"], check["action_words"], check["reason"]) == (
        state, ACTION_WORDS[action], "GPU lost (fell off the bus)")
    assert said["gpus"]["1"]["state"] == state


def test_before_the_first_judgement_the_api_says_unknown():
    """The explicit unknown verdict, not a missing one: /api/v1/health says unknown with
    its reason, and the findings are information."""
    rendered = RenderedSnapshot(not_judged(_snapshot(2, lost=frozenset({1}))))
    service = api.Api(lambda rendered: Readiness(True, ()), node="n")
    said = json.loads(service.answer(rendered, api.HEALTH, "").body)
    assert said["summary"] == "unknown (not judged yet)"
    assert said["node"]["state"] == "unknown" and said["node"]["reasons"] == "not judged yet"
    assert {v["state"] for v in said["gpus"].values()} == {"unknown"}
    found = json.loads(service.answer(rendered, api.FINDINGS, "").body)["findings"]
    assert [(f["kind"], f["severity"]) for f in found] == [("gpu_lost", "info")]
