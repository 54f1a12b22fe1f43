"""The history judges nothing: an episode is a check of the verdict turning warning or
failed (exporter/health/), once, kept across a restart; per port for the InfiniBand
checks. A threshold raised out of reach in the health settings records no episode."""

from __future__ import annotations

from exporter.gpu.device_read import DeviceRead, NvLink
from exporter.health.monitor import HealthMonitor
from exporter.health.settings import HealthSettings
from exporter.history.episodes import NODE
from tests.test_health_infiniband import ib_snapshot
from tests.test_history_store import history, stored
from tests.tools import make_snapshot, xid_sources

T0 = 1_790_000_000.0


def gpu_health(t: float, dbe: float = 0.0, remap_failure: float = 0.0, crc: float = 0.0):
    links = (NvLink(0, True, errors={"crc_flit": crc, "replay": 0.0}),)
    return DeviceRead(T0 + t, {("uncorrected", "volatile"): dbe}, {}, None, {}, 0.0,
                     remap_failure, None, links)


def judge(h, monitor: HealthMonitor, snapshot) -> None:
    """What the app does with each snapshot: the history sees it, then its verdict."""
    h.observe(snapshot)
    h.observe_health(monitor.assess(snapshot))


def kinds(h) -> list[tuple[str, str]]:
    return sorted((e.kind, e.detail) for e in h.recent)


def test_a_checks_turn_is_one_episode_and_a_restart_adds_none(tmp_path):
    h, monitor = history(tmp_path), HealthMonitor()
    judge(h, monitor, make_snapshot(2, time=T0 + 1, device_reads={0: gpu_health(1)}))
    assert h.recent == []
    judge(h, monitor, make_snapshot(2, time=T0 + 2, device_reads={0: gpu_health(2, dbe=2.0)}))
    judge(h, monitor, make_snapshot(2, time=T0 + 3, device_reads={0: gpu_health(3, 2.0, 1.0)},
                                    lost=frozenset({1})))
    judge(h, monitor, make_snapshot(2, time=T0 + 4, device_reads={0: gpu_health(4, 2.0, 1.0)},
                                    lost=frozenset({1})))
    assert kinds(h) == [("ecc_dbe", ""), ("gpu_lost", ""), ("health_failed", ""),
                        ("health_failed", ""), ("row_remap_failure", "")]  # one per GPU failed
    h.stop()
    count = len(stored(tmp_path))
    again, monitor = history(tmp_path), HealthMonitor()
    judge(again, monitor, make_snapshot(2, time=T0 + 9, device_reads={0: gpu_health(9, 2.0, 1.0)},
                                        lost=frozenset({1})))
    again.stop()
    assert len(stored(tmp_path)) == count  # the same verdict: nothing new


def nvlink_episodes(tmp_path, settings: HealthSettings) -> list[tuple[str, str]]:
    h, monitor = history(tmp_path), HealthMonitor(settings)
    for t, crc in ((0.0, 0.0), (60.0, 30.0), (120.0, 60.0)):
        judge(h, monitor, make_snapshot(1, time=T0 + t, device_reads={0: gpu_health(t, crc=crc)}))
    found = [k for k in kinds(h) if k[0].startswith("nvlink")]
    h.stop()
    return found


def test_a_threshold_out_of_reach_records_no_episode(tmp_path):
    """30 CRC errors a minute: the NVLink check warns at 1 a minute, so the history has an
    NVLink episode; with health_nvlink_crc_per_minute raised past it, none."""
    assert nvlink_episodes(tmp_path / "a", HealthSettings()) == [("nvlink_errors", "")]
    assert nvlink_episodes(tmp_path / "b", HealthSettings(nvlink_crc_per_minute=1e6)) == []


def test_infiniband_episodes_are_per_port_and_a_port_back_can_fail_again(tmp_path):
    h, monitor = history(tmp_path), HealthMonitor()
    readings = [(0, 4, 0.0), (10, 1, 0.0), (20, 4, 0.0), (30, 4, 3.0), (400, 4, 3.0),
                (410, 1, 3.0)]
    for t, state, integrity in readings:
        judge(h, monitor, ib_snapshot(t, state, link_downed=0.0,
                                      local_link_integrity_errors=integrity))
    # down, back, link errors (within the failed verdict's episode), back, down again
    assert kinds(h) == [("health_failed", ""), ("health_failed", ""),
                        ("ib_degraded", "mlx5_0/1"), ("ib_link_down", "mlx5_0/1"),
                        ("ib_link_down", "mlx5_0/1")]
    assert all(e.gpu == NODE for e in h.recent)
    h.stop()



def test_xid_episodes_are_also_counted_by_the_xid_tables_action(tmp_path):
    """The lemon score's rules count only the XIDs that ask for a reset, a reboot or
    service; an episode's kind carries no code, so the node says the action beside it."""
    from exporter.history.families import history_families
    from exporter.sampling.xid_ledger import Occurrence

    h = history(tmp_path)
    ledger, _ = xid_sources(h, make_snapshot(2, time=T0))
    ledger.add([Occurrence(0, 13, T0, "nvml"), Occurrence(0, 48, T0, "nvml"),
                Occurrence(1, 79, T0, "nvml")])
    fams = {f.name: f for f in history_families(h, T0 + 60)}
    h.stop()

    def samples(name: str, label: str) -> dict:
        return {(s.labels.get("gpu"), s.labels[label]): s.value for s in fams[name].samples
                if s.labels["window"] == "28d"}

    assert samples("gpu_xid_episodes", "action") == {
        ("0", "restart_application"): 1, ("0", "reset_gpu"): 1, ("1", "reboot_node"): 1}
    assert samples("gpu_node_xid_episodes", "action") == {
        (None, "restart_application"): 1, (None, "reset_gpu"): 1, (None, "reboot_node"): 1}
    assert samples("gpu_episodes", "kind") == {("0", "xid"): 2, ("1", "xid"): 1}
