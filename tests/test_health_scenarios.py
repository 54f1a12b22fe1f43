"""Every built-in fault scenario, through the real backend on the fake, as /metrics shows it.

Most run in simulated time: the exporter samples on a manual clock that `run_until`
moves, and each check scrapes the real HTTP server. The tests about real-time behaviour
(an XID's latency, scrapes during a hang) run the exporter's threads on the wall clock.
"""

from __future__ import annotations

import json
import re
import time

import pytest

from tests.tools import ExporterFactory, http_get, samples, wait_for


class Running:
    """An exporter on a fake scenario, scraped over HTTP like Prometheus would."""

    def __init__(self, factory: ExporterFactory, scenario: str, realtime: bool = False,
                 **config):
        # the scenarios' faults are timed for a slow sweep every 5 s (a fault at 10 s
        # is read by 15 s); the default interval is tested in test_sweep_cadence.py
        config.setdefault("gpu_health_interval_seconds", 5.0)
        self.exporter = factory.start(manual=not realtime, scenario=scenario, **config)
        self.scrapes = 0
        self.slowest = 0.0

    @property
    def sampler(self):
        return self.exporter.sampler

    def scenario_time(self) -> float:
        return self.sampler.clock.time() - self.exporter.fake_lib.start

    def get(self, path: str = "/metrics") -> tuple[int, str]:
        t0 = time.perf_counter()
        resp, body = http_get(self.exporter.port, path)
        if path == "/metrics":
            assert resp.status == 200
            self.scrapes += 1
            self.slowest = max(self.slowest, time.perf_counter() - t0)
        return resp.status, body.decode()

    def skip_ahead(self, seconds: float) -> None:
        """Move the fake's scenario time forward (real-time runs): its faults come sooner."""
        self.exporter.fake_lib.start -= seconds

    def metrics(self) -> dict[str, list]:
        return samples(self.get()[1])

    def run_until(self, scenario_seconds: float) -> dict[str, list]:
        """Sample in simulated time until the scenario reaches that time; then scrape."""
        self.sampler.advance(max(0.0, scenario_seconds - self.scenario_time()) + 1.0)
        return self.metrics()


@pytest.fixture
def running(running_exporter):
    def start(scenario: str, **kwargs) -> Running:
        return Running(running_exporter, scenario, **kwargs)

    return start


def value(samples, **labels) -> float:
    found = [s.value for s in samples if all(s.labels.get(k) == v for k, v in labels.items())]
    assert len(found) == 1, f"{labels}: {len(found)} samples"
    return found[0]


def gpus_with(samples) -> set[str]:
    return {s.labels["gpu"] for s in samples}


ALL = {str(i) for i in range(8)}


def assert_other_gpus_intact(m, except_gpu: str | None = None):
    expected = ALL - ({except_gpu} if except_gpu else set())
    assert gpus_with(m["gpu_power_watts"]) == expected
    assert gpus_with(m["gpu_temperature_celsius"]) == expected
    for gpu in expected:
        assert value(m["gpu_up"], gpu=gpu) == 1


def test_xid_scenario_counts_codes_with_their_class(running):
    run = running("xid")
    m = run.run_until(26)
    xids = m["gpu_xid_errors_total"]
    assert value(xids, gpu="2", xid="48", **{"class": "critical"}) == 2
    assert value(xids, gpu="2", xid="94", **{"class": "warning"}) == 1
    assert value(xids, gpu="1", xid="13", **{"class": "application"}) == 1
    assert value(xids, gpu="3", xid="95", **{"class": "critical"}) == 1
    assert value(xids, gpu="4", xid="119", **{"class": "critical"}) == 1
    assert value(xids, gpu="5", xid="79", **{"class": "critical"}) == 1
    assert value(xids, gpu="6", xid="999", **{"class": "unknown"}) == 1
    assert len(xids) == 7
    seen = value(m["gpu_xid_last_seen_timestamp_seconds"], gpu="2", xid="48")
    now = run.sampler.clock.time()
    assert now - 15 < seen <= now
    assert all(s.labels["uuid"].startswith("GPU-") for s in xids)
    assert value(m["cte_xid_event_gpus"]) == 8
    assert_other_gpus_intact(m)


def test_an_xid_reaches_metrics_within_a_second(running, tmp_path):
    path = tmp_path / "one-xid.yaml"
    path.write_text("gpus: 2\nevents:\n  - {kind: xid, at: 2, gpu: 1, code: 48}\n")
    run = running(str(path), realtime=True)
    due = run.exporter.fake_lib.start + 2
    seen = wait_for(lambda: "gpu_xid_errors_total" in run.metrics() and time.time(),
                    timeout=10, interval=0.05)
    assert seen - due < 1.2


def test_gpu_lost_keeps_the_others_flowing_and_retries(running):
    run = running("gpu-lost", gpu_recovery_interval_seconds=0.5)
    m = run.run_until(15)
    assert value(m["gpu_up"], gpu="5") == 0
    assert value(m["gpu_up"], gpu="5", uuid=value_uuid(m, "5")) == 0
    assert_other_gpus_intact(m, except_gpu="5")
    assert value(m["gpu_xid_errors_total"], gpu="5", xid="79") == 1
    assert value(m["cte_gpu_recovery_attempts_total"], gpu="5") >= 1
    assert "cte_gpu_recoveries_total" not in m
    assert value(m["gpu_expected_devices"]) == 8
    lost = [s for s in m["cte_nvml_errors_total"] if s.labels["error"] == "GpuIsLost"]
    assert lost and all(s.value > 0 for s in lost)
    assert run.get("/healthz")[0] == 200  # the exporter is healthy: it reports the loss


def value_uuid(m, gpu: str) -> str:
    return [s.labels["uuid"] for s in m["gpu_info"] if s.labels["gpu"] == gpu][0]


def test_lost_gpu_comes_back(running, tmp_path):
    path = tmp_path / "flap.yaml"
    path.write_text("gpus: 2\nevents:\n  - {kind: error, at: 2, until: 12, gpu: 1, "
                    "error: GpuIsLost}\n")
    run = running(str(path), gpu_recovery_interval_seconds=0.3)
    m = run.run_until(6)
    assert value(m["gpu_up"], gpu="1") == 0
    m = run.run_until(20)
    assert value(m["gpu_up"], gpu="1") == 1
    assert value(m["cte_gpu_recoveries_total"], gpu="1") == 1
    assert gpus_with(m["gpu_power_watts"]) == {"0", "1"}


def test_ecc_dbe(running):
    run = running("ecc-dbe")
    m = run.run_until(3)
    assert value(m["gpu_ecc_errors_total"], gpu="2", type="uncorrected", scope="volatile") == 0
    m = run.run_until(14)
    ecc = m["gpu_ecc_errors_total"]
    for scope in ("volatile", "aggregate"):
        assert value(ecc, gpu="2", type="uncorrected", scope=scope) == 1
        assert value(ecc, gpu="2", type="corrected", scope=scope) == 40
        assert value(ecc, gpu="0", type="uncorrected", scope=scope) == 0
    assert value(m["gpu_recovery_action"], gpu="2", action="gpu_reset") == 1
    assert value(m["gpu_recovery_action"], gpu="0", action="none") == 1
    assert value(m["gpu_xid_errors_total"], gpu="2", xid="48") == 1
    assert_other_gpus_intact(m)


def test_row_remap_pending_then_failure(running):
    run = running("row-remap")
    m = run.run_until(10)
    assert value(m["gpu_row_remap_pending"], gpu="4") == 1
    assert value(m["gpu_row_remap_failure"], gpu="4") == 0
    assert value(m["gpu_remapped_rows_total"], gpu="4", type="uncorrectable") == 1
    m = run.run_until(22)
    assert value(m["gpu_row_remap_failure"], gpu="4") == 1
    assert value(m["gpu_remapped_rows_total"], gpu="4", type="uncorrectable") == 2
    assert value(m["gpu_row_remap_failure"], gpu="3") == 0
    assert value(m["gpu_xid_errors_total"], gpu="4", xid="64") == 1
    assert_other_gpus_intact(m)


def test_nvlink_errors_and_a_link_going_down(running):
    run = running("nvlink-errors", metrics_profile="full")  # per link
    m = run.run_until(15)  # NVLink counters are read every 5 s: the read at 15 s
    errors = m["gpu_nvlink_errors_total"]
    assert value(errors, gpu="3", link="7", type="crc_flit") > 1000
    assert value(errors, gpu="3", link="7", type="crc_data") > 100
    assert value(errors, gpu="3", link="7", type="replay") >= 1
    assert value(errors, gpu="3", link="6", type="crc_flit") == 0
    assert value(errors, gpu="2", link="7", type="crc_flit") == 0
    assert value(errors, gpu="3", link="15", type="crc_data") == 0  # read the other way
    assert value(m["gpu_nvlink_links_active"], gpu="3") == 18
    m = run.run_until(22)
    assert value(m["gpu_nvlink_link_up"], gpu="3", link="7") == 0
    assert value(m["gpu_nvlink_links_active"], gpu="3") == 17
    assert value(m["gpu_nvlink_links_expected"], gpu="3") == 18
    assert value(m["gpu_nvlink_links_active"], gpu="2") == 18
    before = value(m["gpu_nvlink_transmit_bytes_total"], gpu="3", link="7")
    other = value(m["gpu_nvlink_transmit_bytes_total"], gpu="3", link="6")
    m = run.run_until(26)
    assert value(m["gpu_nvlink_transmit_bytes_total"], gpu="3", link="7") == before
    assert value(m["gpu_nvlink_transmit_bytes_total"], gpu="3", link="6") > other
    assert len(m["gpu_nvlink_link_up"]) == 8 * 18
    assert_other_gpus_intact(m)


def test_thermal_throttle(running):
    run = running("thermal-throttle")
    m = run.run_until(15)
    active = m["gpu_clock_event_active"]
    assert value(active, gpu="6", reason="hw_thermal_slowdown") == 1
    assert value(active, gpu="6", reason="sw_thermal_slowdown") == 1
    assert value(active, gpu="5", reason="hw_thermal_slowdown") == 0
    seconds = value(m["gpu_clock_event_seconds_total"], gpu="6", reason="hw_thermal_slowdown")
    assert seconds > 3
    assert value(m["gpu_clock_event_seconds_total"], gpu="5",
                 reason="hw_thermal_slowdown") == 0
    clock6 = value(m["gpu_sm_clock_hertz"], gpu="6")
    clock5 = value(m["gpu_sm_clock_hertz"], gpu="5")
    assert clock6 < 0.6 * clock5
    assert value(m["gpu_temperature_celsius"], gpu="6") > value(
        m["gpu_temperature_celsius"], gpu="5") + 10
    assert_other_gpus_intact(m)


def test_power_brake_on_every_gpu_then_released(running):
    run = running("power-brake")
    m = run.run_until(12)
    for gpu in ALL:
        assert value(m["gpu_clock_event_active"], gpu=gpu, reason="hw_power_brake_slowdown") == 1
    m = run.run_until(30)
    for gpu in ALL:
        assert value(m["gpu_clock_event_active"], gpu=gpu, reason="hw_power_brake_slowdown") == 0
    assert value(m["gpu_clock_event_seconds_total"], gpu="0",
                 reason="hw_power_brake_slowdown") > 3


STUCK_GPU_1 = re.compile(r'^cte_gpu_stuck_seconds\{[^}]*\bgpu="1"[^}]*\} (\S+)$', re.M)


def test_nvml_hang_scrapes_stay_fast_and_health_names_the_gpu(running):
    run = running("nvml-hang", realtime=True)
    run.skip_ahead(4.0)  # the hang (at 5 s) comes a second after start
    deadline = time.time() + 30
    liveness, stuck = set(), 0.0
    # scrape until GPU 1 has been stuck over 3 s and 50 scrapes were answered meanwhile
    while not (stuck > 3 and run.scrapes > 50):
        assert time.time() < deadline, f"stuck {stuck:.1f} s after {run.scrapes} scrapes"
        found = STUCK_GPU_1.search(run.get()[1])  # a regex: parsing every scrape is slow
        stuck = float(found.group(1)) if found else 0.0
        liveness.add(run.get("/healthz")[0])
        time.sleep(0.02)
    assert liveness == {200}  # a hung GPU is the node's fault, not the exporter's
    status, body = run.get("/readyz")
    assert status == 200 and body.startswith("degraded\n")
    assert "GPU 1 stuck in an NVML call" in body
    m = run.metrics()
    assert value(m["gpu_up"], gpu="1") == 0
    assert value(m["cte_gpu_stuck_seconds"], gpu="1") > 3
    assert value(m["cte_gpu_hangs_total"], gpu="1") == 1
    assert_other_gpus_intact(m, except_gpu="1")
    # not blocked by the 30 s hang: a scrape that waited on it would take seconds to tens
    # of seconds; 5 s holds on a loaded 2-CPU machine (typically a few ms)
    assert run.slowest < 5.0, f"slowest scrape {run.slowest * 1000:.0f} ms during the hang"
    assert run.scrapes > 50
    run.exporter.fake_lib.release_hangs()
    wait_for(lambda: value(run.metrics()["gpu_up"], gpu="1") == 1, timeout=5)
    assert run.get("/healthz")[0] == 200
    wait_for(lambda: run.get("/readyz") == (200, "ok\n"), timeout=15)


def test_a_lost_gpu_back_under_another_uuid_is_not_taken_for_the_same_gpu(running, tmp_path):
    """A hot swap, or another board in the slot: the index answers again, with a new UUID.
    It is not the lost GPU recovered; it stays lost (a restart takes the new board in)."""
    path = tmp_path / "swap.yaml"
    path.write_text("gpus: 2\nevents:\n  - {kind: error, at: 2, until: 12, gpu: 1, "
                    "error: GpuIsLost}\n")
    run = running(str(path), gpu_recovery_interval_seconds=0.3)
    m = run.run_until(6)
    old_uuid = value_uuid(m, "1")
    assert value(m["gpu_up"], gpu="1") == 0
    run.exporter.fake_lib.gpus[1].uuid = "GPU-00000000-0000-0000-0000-0000000000aa"
    m = run.run_until(20)
    assert value(m["gpu_up"], gpu="1", uuid=old_uuid) == 0
    assert "cte_gpu_recoveries_total" not in m
    assert value(m["cte_gpu_recovery_attempts_total"], gpu="1") > 10
    assert gpus_with(m["gpu_power_watts"]) == {"0"}
    assert all(s.labels["uuid"] != "GPU-00000000-0000-0000-0000-0000000000aa"
               for s in m["gpu_info"])


# -- the health verdict: one built-in scenario per action (docs/scenarios.md) ---------------

@pytest.mark.parametrize("scenario, at, gpu, state, action", [
    ("training", 12, None, "ok", "none"),
    ("pcie-card", 12, None, "ok", "none"),
    ("xid-contained", 12, "1", "warning", "restart_application"),
    ("ecc-dbe", 16, "2", "failed", "reset_gpu"),
    ("fabric-not-registered", 12, "3", "failed", "reset_gpu"),
    ("gpu-lost", 15, "5", "failed", "reboot_node"),
    ("row-remap", 24, "4", "failed", "drain_and_service"),
    ("inforom-corrupt", 12, "6", "failed", "drain_and_service"),
])
def test_each_action_has_a_scenario_that_produces_it(running, scenario, at, gpu, state,
                                                      action):
    run = running(scenario)
    run.run_until(at)
    status, body = run.get("/api/v1/health")
    assert status == 200
    verdict = json.loads(body)
    assert (verdict["node"]["state"], verdict["node"]["action"]) == (state, action)
    for index, gpu_verdict in verdict["gpus"].items():
        want = (state, action) if index == gpu or gpu is None else ("ok", "none")
        assert (gpu_verdict["state"], gpu_verdict["action"]) == want, index
    m = run.metrics()
    if gpu is not None:
        assert value(m["gpu_health_state"], gpu=gpu, state=state) == 1
        assert value(m["gpu_health_action"], gpu=gpu, action=action) == 1
    assert value(m["gpu_node_health_state"], state=state) == 1


def test_the_fabric_that_degrades_fails_at_the_next_board_read(running):
    run = running("fabric-not-registered", gpu_board_interval_seconds=5)
    run.run_until(12)
    assert json.loads(run.get("/api/v1/health")[1])["gpus"]["2"]["state"] == "ok"
    run.run_until(28)
    gpu2 = json.loads(run.get("/api/v1/health")[1])["gpus"]["2"]
    fabric = next(c for c in gpu2["checks"] if c["name"] == "nvlink_fabric")
    assert (fabric["state"], fabric["value"]) == ("failed", "degraded_bandwidth")


def test_nvlink_error_findings_take_the_health_checks_severity(running, tmp_path):
    """18,000 CRC errors a second are critical on the page, as DCGM's 100/s makes them,
    and rank above a power swing; a slow trickle warns; none stays information."""
    path = tmp_path / "crc.yaml"
    path.write_text("gpus: 3\nevents:\n"
                    "  - {kind: nvlink, at: 2, gpu: 1, link: 3, crc_flit_per_second: 18000}\n"
                    "  - {kind: nvlink, at: 2, gpu: 2, link: 3, crc_flit_per_second: 0.1}\n")
    run = running(str(path))
    run.run_until(30)
    found = json.loads(run.get("/api/v1/findings")[1])["findings"]
    nvlink = {f["gpu"]: f for f in found if f["kind"] == "nvlink"}
    assert nvlink[1]["severity"] == "critical"
    assert "NVLink CRC errors at the failure rate" in nvlink[1]["message"]
    assert nvlink[2]["severity"] == "warning"
    assert 0 not in nvlink
    severities = [f["severity"] for f in found]
    assert severities.index("critical") == 0


def test_an_xid_after_the_gpu_is_lost_keeps_its_gpu(running, tmp_path):
    # the GPU stops answering at 5 s; its XID 79 comes at 12 s, when asking its handle
    # anything (its UUID, its index) answers GpuIsLost
    path = tmp_path / "lost-then-xid.yaml"
    path.write_text("gpus: 8\nevents:\n  - {kind: error, at: 5, gpu: 5, error: GpuIsLost}\n"
                    "  - {kind: xid, at: 12, gpu: 5, code: 79}\n")
    run = running(str(path), gpu_recovery_interval_seconds=0.5)
    m = run.run_until(14)
    assert value(m["gpu_up"], gpu="5") == 0
    xids = m["gpu_xid_errors_total"]
    assert [(s.labels["gpu"], s.labels["uuid"], s.value) for s in xids] == [
        ("5", value_uuid(m, "5"), 1)]
    status, body = run.get("/api/v1/findings")
    xid_findings = [f for f in json.loads(body)["findings"] if f["kind"] == "xid"]
    assert [(f["gpu"], f["message"].split(":")[0]) for f in xid_findings] == [(5, "GPU 5")]
    assert_other_gpus_intact(m, except_gpu="5")


def test_a_hung_power_drain_costs_the_other_gpus_no_sample(running, tmp_path):
    # GPU 0's drain blocks for 20 s: the other GPUs' buffers (~2.4 s) must still be
    # drained in time, before and after GPU 0 is declared hung
    path = tmp_path / "hung-drain.yaml"
    path.write_text("gpus: 8\nworkload: {type: training}\nevents:\n"
                    "  - {kind: hang, at: 5, gpu: 0, call: nvmlDeviceGetSamples, seconds: 20}\n")
    run = running(str(path), realtime=True, metrics_profile="full")
    run.skip_ahead(3.0)  # the hang comes two seconds after start

    def received(m, gpu: str) -> float:
        return value(m["gpu_power_samples_total"], gpu=gpu)

    wait_for(lambda: "cte_gpu_hangs_total" in (m := run.metrics()) and m, timeout=15)
    m = run.metrics()
    before = {gpu: received(m, gpu) for gpu in ALL - {"0"}}
    # four more seconds of the hang, seen by the samples GPU 1 received meanwhile
    wait_for(lambda: received(run.metrics(), "1") > before["1"] + 200, timeout=20)
    m = run.metrics()
    assert value(m["gpu_up"], gpu="0") == 0
    assert value(m["cte_gpu_hangs_total"], gpu="0") == 1
    for gpu in sorted(ALL - {"0"}):
        assert value(m["gpu_power_samples_lost_total"], gpu=gpu) == 0, gpu
        assert received(m, gpu) > before[gpu]
    run.exporter.fake_lib.release_hangs()
