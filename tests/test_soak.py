"""A fault soak, CI-sized: a real `run` process on the fake, under the fault mix of a
30-minute soak compressed into two minutes (tests/data/soak/soak-ci.yaml), served over
TLS with basic auth to five scrapers at 1/s and a live-page client, and reloaded every
10 s, valid and broken configs in turn. What it promises (docs/performance.md):

- not one request fails: no scrape, no API request, across hangs, lost GPUs and reloads;
- every broken reload is refused (the old config serves on), every valid one applies;
- an XID from a GPU that is lost is labelled with its gpu and uuid, and its finding
  names the GPU;
- a GPU that is neither hung nor lost never loses a power sample, while another hangs;
- each hang and each loss of the scenario is seen, and the lost GPU comes back.

The expectations come from the scenario file, so `CTE_SOAK=30min` runs the 30-minute
soak (tests/data/soak/soak-30min.yaml) with the same checks and a reload a minute.
"""

from __future__ import annotations

import base64
import gzip
import http.client
import json
import os
import re
import signal
import ssl
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from exporter.sim.scenarios import load_scenario
from tests.certs import make_certs
from tests.tools import REPO, free_port, require_module, stop_process, wait_for

SOAKS = {"ci": ("soak-ci.yaml", 120.0, 10.0), "30min": ("soak-30min.yaml", 1800.0, 60.0)}
SCENARIO, DURATION, RELOAD_EVERY = SOAKS[os.environ.get("CTE_SOAK", "ci")]
USER, PASSWORD = "prometheus", "soak-password"
RECOVERY_INTERVAL = 5.0  # gpu_recovery_interval_seconds, so that a lost GPU is back soon
HANG_TIMEOUT = 2.0  # the default

_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$')
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')
_WATCHED = ("gpu_up{", "gpu_power_samples_lost_total{", "cte_gpu_stuck_seconds{",
            "cte_config_reloads_total{", "cte_snapshot_time_seconds ", "cte_start_time_seconds ")


def parse(text: str, prefixes: tuple[str, ...] | None = None) -> dict[str, list]:
    """Samples by name, as (labels, value); only lines starting with `prefixes`."""
    out: dict[str, list] = {}
    for line in text.splitlines():
        if line.startswith("#") or (prefixes and not line.startswith(prefixes)):
            continue
        found = _SAMPLE.match(line)
        if found:
            name, labels, value = found.groups()
            out.setdefault(name, []).append((dict(_LABEL.findall(labels or "")),
                                             float(value)))
    return out


def by_gpu(samples: dict[str, list], name: str) -> dict[int, float]:
    return {int(labels["gpu"]): value for labels, value in samples.get(name, [])}


@dataclass
class Observation:
    """What one scrape showed of the GPUs' state."""

    t: float  # scenario time: the snapshot's, from the exporter's start
    up: dict[int, float]
    lost: dict[int, float]
    stuck: set[int]
    reloads: dict[str, float]


@dataclass
class Client:
    """Requests on one kept-alive TLS connection, as Prometheus and a browser make them;
    any answer but 200 (or an exception) is a failure."""

    port: int
    context: ssl.SSLContext
    statuses: list = field(default_factory=list)
    conn: http.client.HTTPSConnection | None = None

    def get(self, path: str, gzipped: bool = False) -> bytes:
        headers = {"Authorization": "Basic " + base64.b64encode(
            f"{USER}:{PASSWORD}".encode()).decode()}
        if gzipped:
            headers["Accept-Encoding"] = "gzip"
        try:
            if self.conn is None:
                self.conn = http.client.HTTPSConnection("127.0.0.1", self.port, timeout=10,
                                                        context=self.context)
            self.conn.request("GET", path, headers=headers)
            resp = self.conn.getresponse()
            body = resp.read()
            if resp.getheader("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            self.statuses.append((path, resp.status))
            return body if resp.status == 200 else b""
        except (OSError, http.client.HTTPException) as exc:
            self.statuses.append((path, type(exc).__name__))
            if self.conn is not None:
                self.conn.close()
            self.conn = None
            return b""

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()


class Soak:
    def __init__(self, tmp: Path):
        bcrypt = require_module("bcrypt")
        self.tmp = tmp
        self.certs = make_certs(tmp / "certs")
        hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(4)).decode()
        self.users = f"basic_auth_users:\n  {USER}: '{hashed}'\n"
        self.web = tmp / "web.yml"
        self.config = tmp / "config.yaml"
        self.port = free_port()
        self.scenario = REPO / "tests" / "data" / "soak" / SCENARIO
        self.write_web()
        self.write_config()
        self.context = ssl.create_default_context(cafile=str(self.certs.ca))
        self.stop = threading.Event()
        self.observations: list[Observation] = []
        self.findings: list[dict] = []
        self.clients: list[Client] = []
        self.threads: list[threading.Thread] = []

    def write_web(self, key: Path | None = None, text: str | None = None) -> None:
        if text is None:
            text = (f"tls_server_config:\n  cert_file: {self.certs.server_cert}\n"
                    f"  key_file: {key or self.certs.server_key}\n" + self.users)
        tmp = self.web.with_name("web.yml.tmp")
        tmp.write_text(text)
        os.replace(tmp, self.web)

    def write_config(self, extra: str = "", log_level: str = "info",
                     web: Path | None = None) -> None:
        text = (f"listen_address: 127.0.0.1:{self.port}\nfake: true\n"
                f"scenario: {self.scenario}\nweb_config_file: {web or self.web}\n"
                f"log_level: {log_level}\ngpu_recovery_interval_seconds: {RECOVERY_INTERVAL}\n"
                "collector_infiniband: false\n" + extra)
        tmp = self.config.with_name("config.yaml.tmp")
        tmp.write_text(text)
        os.replace(tmp, self.config)

    # -- the clients ----------------------------------------------------------------
    def client(self) -> Client:
        self.clients.append(Client(self.port, self.context))
        return self.clients[-1]

    def every_second(self, work) -> None:
        def run() -> None:
            deadline = time.monotonic() + DURATION + 60  # bounded whatever happens
            while not self.stop.is_set() and time.monotonic() < deadline:
                started = time.monotonic()
                work()
                self.stop.wait(max(0.0, 1.0 - (time.monotonic() - started)))

        self.threads.append(threading.Thread(target=run, daemon=True))

    def scraper(self, gzipped: bool, observe: bool = False) -> None:
        client = self.client()

        def scrape() -> None:
            body = client.get("/metrics", gzipped)
            if observe and body:
                self.observe(body.decode())

        self.every_second(scrape)

    def observe(self, text: str) -> None:
        m = parse(text, _WATCHED)
        start = m["cte_start_time_seconds"][0][1]
        self.observations.append(Observation(
            m["cte_snapshot_time_seconds"][0][1] - start, by_gpu(m, "gpu_up"),
            by_gpu(m, "gpu_power_samples_lost_total"), set(by_gpu(m, "cte_gpu_stuck_seconds")),
            {labels["result"]: v for labels, v in m.get("cte_config_reloads_total", [])}))

    def live_page(self) -> None:
        client = self.client()
        client.get("/")

        def poll() -> None:  # as page.js does: both endpoints, about once a second
            client.get("/api/v1/power?seconds=60", gzipped=True)
            body = client.get("/api/v1/findings", gzipped=True)
            if body:
                self.findings = json.loads(body)["findings"]

        self.every_second(poll)

    def scenario_time(self) -> float:
        return self.observations[-1].t if self.observations else 0.0


# Reloads, in turn: a valid one (both files as at start, the log level changed), then a
# broken one of the next kind, which the next valid one writes over.
def _broken_kinds(soak: Soak) -> list:
    mismatched = soak.certs.client_key  # a key that is not the certificate's
    return [
        ("unknown key", lambda: soak.write_config("listen_adress: 127.0.0.1:1\n")),
        ("emptied web config", lambda: soak.write_web(text="")),
        ("key of another certificate", lambda: soak.write_web(key=mismatched)),
        ("out of range", lambda: soak.write_config("power_sample_rate_hz: 5000\n")),
        ("TLS without users", lambda: soak.write_web(text=(
            f"tls_server_config:\n  cert_file: {soak.certs.server_cert}\n"
            f"  key_file: {soak.certs.server_key}\nbasic_auth_users: {{}}\n"))),
        ("bad YAML", lambda: soak.write_config("metrics_profile: [standard\n")),
        ("unknown profile", lambda: soak.write_config("metrics_profile: everything\n")),
        ("missing web config", lambda: soak.write_config(web=soak.tmp / "nosuch.yml")),
    ]


def _valid(soak: Soak, n: int) -> None:
    soak.write_web()
    soak.write_config(log_level="warning" if n % 2 else "info")


@pytest.mark.e2e
def test_a_fault_soak_fails_no_request_and_loses_no_healthy_sample(tmp_path):
    scenario = load_scenario(str(REPO / "tests" / "data" / "soak" / SCENARIO))
    soak = Soak(tmp_path)
    log = tmp_path / "exporter.log"
    with log.open("w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "exporter", "run", "--config",
                                 str(soak.config)], stdout=out, stderr=subprocess.STDOUT)
    watcher = soak.client()
    try:
        wait_for(lambda: proc.poll() is not None or watcher.get("/healthz"), timeout=60)
        assert proc.poll() is None, log.read_text()
        watcher.statuses.clear()  # refused connections while it started are not failures
        for n in range(5):
            soak.scraper(gzipped=n < 3, observe=n == 4)
        soak.live_page()
        for thread in soak.threads:
            thread.start()
        wait_for(lambda: soak.observations, timeout=30)
        reloads, broken = _run_reloads(soak, proc, _broken_kinds(soak))
        wait_for(lambda: soak.scenario_time() >= DURATION, timeout=DURATION + 60,
                 interval=0.5)
    finally:
        soak.stop.set()
        for thread in soak.threads:
            thread.join(15)
        alive = proc.poll() is None
        final = parse(Client(soak.port, soak.context).get("/metrics").decode()) if alive else {}
        stop_process(proc)
        for client in soak.clients:
            client.close()
    text = log.read_text()
    assert alive and proc.returncode == 0, text[-3000:]

    # 1. not one request failed
    requests = [s for c in soak.clients if c is not watcher for s in c.statuses]
    failed = [s for s in requests if s[1] != 200]
    assert not failed and len(requests) > 5 * DURATION * 0.8, (len(requests), failed[:10])

    # 2. every broken reload refused, every valid one applied, each one line
    last = soak.observations[-1].reloads
    assert last == {"success": reloads - broken, "failure": broken}, (last, reloads, broken)
    refused = [line for line in text.splitlines() if "reload refused" in line]
    assert len(refused) == broken, refused

    print(f"soak {SCENARIO}: {len(requests)} requests, {len(failed)} failed; {reloads} "
          f"reloads ({broken} broken, {len(refused)} refused); {len(soak.observations)} "
          f"scrapes observed")

    # 3. the lost GPU's XIDs carry its gpu and uuid, and their findings name it
    _check_xids(scenario, final, soak.findings, soak.scenario_time())

    # 4. no GPU that is neither hung nor lost loses a power sample while another hangs
    _check_power(scenario, soak.observations, final)

    # 5. every hang and loss was seen, and the lost GPU came back each time
    end = soak.scenario_time()
    hangs: dict[int, int] = {}
    for e in scenario.events:
        if e.kind == "hang" and e.at + HANG_TIMEOUT + 2 < end:
            hangs[e.gpu] = hangs.get(e.gpu, 0) + 1
    assert by_gpu(final, "cte_gpu_hangs_total") == {g: float(n) for g, n in hangs.items()}
    back: dict[int, int] = {}
    for e in scenario.events:
        if e.kind == "error" and e.until is not None and e.until + RECOVERY_INTERVAL + 3 < end:
            back[e.gpu] = back.get(e.gpu, 0) + 1
    assert by_gpu(final, "cte_gpu_recoveries_total") == {g: float(n) for g, n in back.items()}
    assert all(v == 1 for v in by_gpu(final, "gpu_up").values())


def _run_reloads(soak: Soak, proc: subprocess.Popen, broken_kinds: list) -> tuple[int, int]:
    """SIGHUP every RELOAD_EVERY seconds of scenario time, valid and broken in turn; waits
    for each outcome in the metrics. Returns (reloads, broken ones)."""
    count = broken = 0
    due = RELOAD_EVERY
    while due < DURATION - 5:
        wait_for(lambda d=due: soak.scenario_time() >= d, timeout=RELOAD_EVERY * 3 + 30,
                 interval=0.2)
        before = sum(soak.observations[-1].reloads.values())
        if count % 2:
            name, make = broken_kinds[broken % len(broken_kinds)]
            make()
            broken += 1
        else:
            _valid(soak, count // 2)
        proc.send_signal(signal.SIGHUP)
        count += 1
        wait_for(lambda b=before: sum(soak.observations[-1].reloads.values()) > b,
                 timeout=30, interval=0.2)
        due += RELOAD_EVERY
    return count, broken


def _check_xids(scenario, final: dict, findings: list[dict], end: float) -> None:
    uuids = {int(labels["gpu"]): labels["uuid"] for labels, _ in final["gpu_info"]}
    expected: dict[tuple[int, int], int] = {}
    for e in scenario.events:
        if e.kind == "xid" and e.at + 3 < end:
            key = (e.gpu, e.params["code"])
            expected[key] = expected.get(key, 0) + 1
    got = {}
    for labels, value in final["gpu_xid_errors_total"]:
        assert labels["gpu"] != "" and labels["uuid"] == uuids[int(labels["gpu"])], labels
        got[(int(labels["gpu"]), int(labels["xid"]))] = int(value)
    assert got == expected
    lost_at = [(e.gpu, e.at, e.until) for e in scenario.events
               if e.kind == "error" and e.error == "GpuIsLost"]
    from_lost = [e for e in scenario.events if e.kind == "xid" and any(
        g == e.gpu and at < e.at < until for g, at, until in lost_at)]
    assert from_lost, "the scenario must send XIDs from a lost GPU"
    xid_findings = [f for f in findings if f["kind"] == "xid"]
    assert all(f["gpu"] in uuids and not f["message"].startswith("GPU -1") for f in xid_findings)
    for e in from_lost:
        assert any(f["gpu"] == e.gpu and f["details"]["xid"] == e.params["code"]
                   for f in xid_findings), (e, xid_findings)


def _check_power(scenario, observations: list[Observation], final: dict) -> None:
    """A GPU up in the last 3 scrapes (and so neither hung nor lost, nor just back) loses
    no sample between two of them; and that happened while another GPU was stuck."""
    tested_while_another_hung = 0
    for i in range(3, len(observations)):
        window = observations[i - 3:i + 1]
        for gpu, lost in observations[i].lost.items():
            if not all(o.up.get(gpu) == 1 and gpu not in o.stuck for o in window):
                continue
            before = observations[i - 1].lost.get(gpu, 0.0)
            assert lost <= before, (gpu, observations[i].t, before, lost)
            if observations[i].stuck - {gpu}:
                tested_while_another_hung += 1
    assert tested_while_another_hung > 0
    print(f"soak: {tested_while_another_hung} scrape intervals of a healthy GPU while "
          "another was stuck, none with a lost sample")
    faulted = {e.gpu for e in scenario.events if e.kind in ("hang", "error")}
    healthy = set(range(scenario.gpus)) - faulted
    assert healthy and all(by_gpu(final, "gpu_power_samples_lost_total")[g] == 0
                           for g in healthy)
