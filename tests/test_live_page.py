"""The live page in a real headless Chromium: under the straggler scenario, after
35 s (simulated: the sampler runs on a manual clock; the server is real), the page draws 8
GPU series, updates itself and names GPU 5 as a straggler; its screenshot has content.
Also behind TLS and basic auth, as Prometheus scrapes it."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest

from tests.certs import make_certs
from tests.png import decode_png
from tests.tools import http_get, require_binary, require_module

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--window-size=1280,900"]
# Virtual time runs the page's 1 s poll loop several times; it stands still while fetches
# are in flight, so each poll's answer is drawn before the next.
BUDGET_MS = 4000


def chromium(tmp_path: Path, url: str, *extra: str) -> subprocess.CompletedProcess:
    binary = require_binary("chromium")
    return subprocess.run(
        [binary, *FLAGS, f"--user-data-dir={tmp_path / 'profile'}",
         f"--virtual-time-budget={BUDGET_MS}", *extra, url],
        capture_output=True, text=True, timeout=120)


def _check_dom(dom: str) -> None:
    updates = re.search(r'<body[^>]* data-updates="(\d+)"', dom)
    assert updates and int(updates.group(1)) >= 2, dom[-3000:]  # it updated itself
    chart = re.search(r'<div id="gpu-chart"[^>]*>', dom)
    assert chart and 'data-series="8"' in chart.group(0), chart
    assert dom.count('class="uplot') == 2 and dom.count("<canvas") >= 2  # node and GPU charts
    assert len(re.findall(r'<tr data-gpu="\d+"', dom)) == 8
    straggler = re.search(r'<li class="finding sev-warning" data-kind="straggler" '
                          r'data-gpu="5"[^>]*>(.*?)</li>', dom)
    assert straggler, dom[-3000:]
    assert "GPU 5 is a straggler: SM clock" in straggler.group(1)
    # the step period read from the compute phases' power, in the summary and the findings
    assert re.search(r'<dt>step period</dt><dd>\d+ ms \(\d\.\d\d Hz\), from the power', dom)
    assert 'data-kind="step_period"' in dom
    # the goodput account since start: every GPU trains, a straggler's peers wait briefly
    assert re.search(r"<dt>goodput</dt><dd>\d+\.\d % of held GPU time productive since "
                     r"start", dom), dom[-3000:]
    assert re.search(r'<span id="gpus">8</span>', dom)
    assert re.search(r'<span id="readiness"[^>]*>ready(, degraded: [^<]+)?</span>', dom)
    # the straggler's clocks are held down (HW slowdown): the verdict warns of GPU 5
    assert re.search(r'<span id="verdict" data-state="warning">warning: GPU 5</span>', dom), (
        dom[:4000])


def test_live_page_under_the_straggler_scenario(running_exporter, tmp_path):
    require_binary("chromium")
    exp = running_exporter.start(manual=True, scenario="straggler",
                                 straggler_persistence_seconds=5)
    exp.sampler.advance(35)  # 35 s of simulated time; the server runs for real
    rendered = exp.current.snapshot
    assert rendered.time - rendered.started_at >= 35
    _, body = http_get(exp.port, "/api/v1/power?seconds=30")
    power = json.loads(body)
    assert len(power["gpus"]) == 8
    for series in power["gpus"].values():
        assert len(series["timestamps"]) >= 20 * 30
    _, body = http_get(exp.port, "/api/v1/findings")
    answer = json.loads(body)
    assert 5 in [f["gpu"] for f in answer["findings"] if f["kind"] == "straggler"]
    goodput = answer["summary"]["goodput"]
    accounted = sum(goodput["gpu_seconds"].values()) + goodput["pending_gpu_seconds"]
    assert accounted == pytest.approx(8 * (rendered.time - rendered.started_at), abs=1.0)
    assert goodput["ratio"] > 0.8

    url = f"http://127.0.0.1:{exp.port}/"
    result = chromium(tmp_path, url, "--dump-dom")
    assert result.returncode == 0, result.stderr[-2000:]
    _check_dom(result.stdout)

    shot = tmp_path / "live-page.png"
    result = chromium(tmp_path, url, f"--screenshot={shot}")
    assert result.returncode == 0 and shot.exists(), result.stderr[-2000:]
    _check_screenshot(decode_png(shot.read_bytes()))


def _check_screenshot(image: np.ndarray) -> None:
    assert image.shape[:2] == (900, 1280)
    rgb = image[..., :3].reshape(-1, 3).astype(np.int32)
    not_white = (rgb < 235).any(axis=1).mean()
    colours = len(np.unique(rgb @ np.array([65536, 256, 1])))
    assert not_white > 0.05 and colours > 1000, (not_white, colours)

    def pixels_near(hex_colour: str, tolerance: int = 12) -> int:
        want = np.array([int(hex_colour[i:i + 2], 16) for i in (1, 3, 5)])
        return int((np.abs(rgb - want).max(axis=1) <= tolerance).sum())

    assert pixels_near("#e69500") > 300  # the straggler finding's warning border
    assert pixels_near("#333333") > 1000  # the node's line
    assert sum(pixels_near(c) > 100 for c in ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728",
                                              "#9467bd", "#8c564b", "#e377c2", "#17becf")) >= 4


def test_the_page_says_who_writes_the_checkpoints(running_exporter, tmp_path):
    """checkpoint-stall inside its third checkpoint (160-180 s): the summary says who
    writes, how long and how often; the finding is information, and no stall is named."""
    require_binary("chromium")
    exp = running_exporter.start(manual=True, scenario="checkpoint-stall")
    exp.sampler.advance(170)
    _, body = http_get(exp.port, "/api/v1/findings")
    answer = json.loads(body)
    line = answer["summary"]["goodput"]["checkpoints"]["node"]
    assert re.fullmatch(r"GPU 0 writes a checkpoint for ~(19|20) s every ~60 s \(2 seen\); "
                        r"the others wait", line), line
    kinds = [(f["kind"], f["severity"]) for f in answer["findings"]]
    assert ("checkpoint", "info") in kinds and "stall" not in [k for k, _ in kinds]
    result = chromium(tmp_path, f"http://127.0.0.1:{exp.port}/", "--dump-dom")
    assert result.returncode == 0, result.stderr[-2000:]
    dom = result.stdout
    assert f"<dt>checkpoints</dt><dd>{line}</dd>" in dom, dom[-3000:]
    assert re.search(r'<li class="finding sev-info" data-kind="checkpoint" data-gpu="0"', dom)


USER, PASSWORD = "oncall", "a page behind the same door"


@pytest.fixture
def tls_auth_web_config(tmp_path):
    bcrypt = require_module("bcrypt")
    certs = make_certs(tmp_path / "certs")
    hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(4)).decode()
    web = tmp_path / "web.yml"
    web.write_text(f"tls_server_config:\n  cert_file: {certs.server_cert}\n"
                   f"  key_file: {certs.server_key}\n"
                   f"basic_auth_users:\n  {USER}: '{hashed}'\n")
    return web


def test_live_page_behind_tls_and_basic_auth(running_exporter, tmp_path, tls_auth_web_config):
    """The page's fetches are same-origin: the browser resends the credentials it used for
    the page, over the same TLS."""
    require_binary("chromium")
    exp = running_exporter.start(manual=True, web_config_file=str(tls_auth_web_config))
    exp.sampler.advance(10)
    assert exp.current.snapshot.power_analysis
    bare = chromium(tmp_path, f"https://127.0.0.1:{exp.port}/", "--ignore-certificate-errors",
                    "--dump-dom")
    assert 'id="gpu-chart"' not in bare.stdout  # no password: no page
    url = f"https://{USER}:{PASSWORD.replace(' ', '%20')}@127.0.0.1:{exp.port}/"
    result = chromium(tmp_path, url, "--ignore-certificate-errors", "--dump-dom")
    assert result.returncode == 0, result.stderr[-2000:]
    dom = result.stdout
    updates = re.search(r'<body[^>]* data-updates="(\d+)"', dom)
    assert updates and int(updates.group(1)) >= 2, dom[-3000:]
    assert 'data-series="8"' in dom


def test_live_page_health_panel_names_the_failed_gpu_and_its_action(running_exporter,
                                                                     tmp_path):
    """The page's health panel shows /api/v1/health: the node's verdict, and the lost GPU
    failed with the reboot it needs and its reasons; healthy GPUs are not listed."""
    require_binary("chromium")
    exp = running_exporter.start(manual=True, scenario="gpu-lost",
                                 gpu_recovery_interval_seconds=0.5)
    exp.sampler.advance(16)
    result = chromium(tmp_path, f"http://127.0.0.1:{exp.port}/", "--dump-dom")
    assert result.returncode == 0, result.stderr[-2000:]
    dom = result.stdout
    verdict = re.search(r'<span id="health-verdict" class="verdict" data-state="(\w+)">'
                        r'([^<]*)</span>', dom)
    assert verdict and verdict.groups() == ("failed", "failed: reboot the node"), dom[-3000:]
    items = re.findall(r'<li class="verdict-item verdict-(\w+)" data-state="\w+" '
                       r'data-action="(\w+)" data-gpu="(\d+)"[^>]*>(.*?)</li>', dom)
    assert [(state, action, gpu) for state, action, gpu, _ in items] == [
        ("failed", "reboot_node", "5")], items
    assert "GPU lost (fell off the bus)" in items[0][3]
    assert "XID 79" in items[0][3]


def test_live_page_health_panel_on_a_healthy_node(running_exporter, tmp_path):
    require_binary("chromium")
    exp = running_exporter.start(manual=True, scenario="training")
    exp.sampler.advance(16)  # two slow sweeps (15 s apart): every rate is known
    result = chromium(tmp_path, f"http://127.0.0.1:{exp.port}/", "--dump-dom")
    assert result.returncode == 0, result.stderr[-2000:]
    assert re.search(r'<span id="health-verdict" class="verdict" data-state="ok">ok</span>',
                     result.stdout), result.stdout[-3000:]
    assert '<ul id="health-list"><li class="muted">every check passes</li></ul>' in (
        result.stdout)


def _page(running_exporter, tmp_path: Path, scenario: str, seconds: float) -> tuple[str, dict]:
    exp = running_exporter.start(manual=True, scenario=scenario)
    exp.sampler.advance(seconds)
    _, body = http_get(exp.port, "/api/v1/findings")
    result = chromium(tmp_path, f"http://127.0.0.1:{exp.port}/", "--dump-dom")
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout, json.loads(body)


def test_the_header_tells_a_ready_exporter_from_a_failed_gpu(running_exporter, tmp_path):
    """ecc-dbe: the exporter serves well (ready) while GPU 2 has failed; the header says
    both, apart, and the action in the one set of words."""
    require_binary("chromium")
    dom, found = _page(running_exporter, tmp_path, "ecc-dbe", 16)
    assert re.search(r'<span id="readiness" data-status="ok">ready</span>', dom), dom[:3000]
    assert re.search(r'<span id="verdict" data-state="failed">failed: GPU 2 '
                     r'\(reset the GPU\)</span>', dom), dom[:3000]
    assert "gpu_reset" not in re.sub(r"<[^>]+>", " ", dom.split("<main>")[1])
    recovery = [f for f in found["findings"] if f["kind"] == "recovery_action"]
    # the verdict's words: its check's reason, its action in ACTION_WORDS' words
    assert [f["message"] for f in recovery] == ["GPU 2: driver asks to reset the GPU"]
    assert [(f["severity"], f["details"]["verdict"]["action_words"]) for f in recovery] == [
        ("critical", "reset the GPU")]
    assert found["summary"]["readiness"]["words"] == "ready"


def test_a_healthy_training_node_shows_nothing_above_information(running_exporter, tmp_path):
    """training: the node swings with its steps, as every synchronous job does; the page and
    /api/v1/findings say so as information, as the node's power alerts do."""
    require_binary("chromium")
    dom, found = _page(running_exporter, tmp_path, "training", 70)
    kinds = {f["kind"] for f in found["findings"]}
    assert "power_swing" in kinds or "step_period" in kinds, found
    assert {f["severity"] for f in found["findings"]} == {"info"}, found["findings"]
    assert 'class="finding sev-info"' in dom
    assert "sev-warning" not in dom and "sev-critical" not in dom
    assert re.search(r'<span id="verdict" data-state="ok">ok \(8 GPUs\)</span>', dom), dom[:4000]


def test_the_health_panel_names_the_port_of_a_port_check(running_exporter, tmp_path):
    """A check judged per InfiniBand port names its port on the page (from
    /api/v1/health's device and port): a DOWN port beside a healthy one."""
    from exporter.sim.ib_tree import down_hca, ndr_hca

    require_binary("chromium")
    sysfs = tmp_path / "sys"
    ndr_hca(sysfs)
    down_hca(sysfs)
    exp = running_exporter.start(manual=True, scenario="training", collector_infiniband=True,
                                 path_sysfs=str(sysfs))
    exp.sampler.advance(12)
    _, body = http_get(exp.port, "/api/v1/health")
    ports = {(c["device"], c["port"]): c["state"] for c in json.loads(body)["node"]["checks"]
             if c["name"] == "infiniband_ports"}
    assert ports == {("mlx5_0", "1"): "ok", ("mlx5_7", "1"): "failed"}
    result = chromium(tmp_path, f"http://127.0.0.1:{exp.port}/", "--dump-dom")
    assert result.returncode == 0, result.stderr[-2000:]
    items = re.findall(r'<li class="verdict-item verdict-(\w+)" data-state="\w+" '
                       r'data-action="(\w+)" data-port="([^"]+)"[^>]*>(.*?)</li>',
                       result.stdout)
    assert [(state, action, port) for state, action, port, _ in items] == [
        ("failed", "drain_and_service", "mlx5_7/1")], result.stdout[-3000:]
    assert "node infiniband ports (mlx5_7 port 1)" in items[0][3]
