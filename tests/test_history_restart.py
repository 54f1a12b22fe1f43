"""Restarts on the fake with a state directory: XID counts that continue, XIDs from the
kernel log (a fake kmsg file) counted once, a GPU swapped in its slot, and what /readyz
says where the log cannot be read."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from exporter.history.store import Store, StoreBusy
from tests.tools import REPO, ExporterFactory, http_get, samples

BOOT = "7d1c9a52-0b7e-4a33-9b1a-0c5a0f00b001"

XIDS = """
gpus: 2
workload: {type: training}
events:
  - {kind: xid, at: 1, gpu: 0, code: 13}
  - {kind: xid, at: 2, gpu: 1, code: 79}
"""
QUIET = "gpus: 2\nworkload: {type: training}\n"
SWAPPED = QUIET + 'events:\n  - {kind: replace, at: 0, gpu: 1, serial: "1652221099999"}\n'


@pytest.fixture
def node(tmp_path):
    (tmp_path / "boot_id").write_text(BOOT + "\n")
    (tmp_path / "kmsg").write_text("6,1,1000,-;Linux version 6.8.0\n")
    for name, text in (("xids", XIDS), ("quiet", QUIET), ("swapped", SWAPPED)):
        (tmp_path / f"{name}.yaml").write_text(text)
    factory = ExporterFactory()
    yield tmp_path, factory
    factory.stop_all()


def start(node, scenario: str, kmsg: str = "kmsg"):
    tmp, factory = node
    exporter = factory.start(manual=True, scenario=str(tmp / f"{scenario}.yaml"),
                             storage_path=str(tmp / "state"), storage_kmsg_path=str(tmp / kmsg),
                             storage_boot_id_path=str(tmp / "boot_id"))
    exporter.sampler.advance(3.0)
    exporter.sampler.xids.kernel_log.tick()
    exporter.sampler.advance(1.0)
    return exporter


def stop(node, exporter) -> None:
    exporter.stop()
    node[1].exporters.remove(exporter)


def xid_counts(exporter) -> dict[tuple[str, str], float]:
    got = samples(exporter.current.body).get("gpu_xid_errors_total", [])
    return {(s.labels["gpu"], s.labels["xid"]): s.value for s in got}


def value(exporter, name: str, **labels) -> float | None:
    for s in samples(exporter.current.body).get(name, []):
        if all(s.labels.get(k) == v for k, v in labels.items()):
            return s.value
    return None


def test_xids_before_a_stop_and_after_a_start_add_up(node):
    first = start(node, "xids")
    assert xid_counts(first) == {("0", "13"): 1, ("1", "79"): 1}
    stop(node, first)
    second = node[1].start(manual=True, scenario=str(node[0] / "xids.yaml"),
                           storage_path=str(node[0] / "state"),
                           storage_kmsg_path=str(node[0] / "kmsg"),
                           storage_boot_id_path=str(node[0] / "boot_id"))
    second.sampler.advance(0.5)  # before the scenario raises its XIDs again: never reset
    assert xid_counts(second) == {("0", "13"): 1, ("1", "79"): 1}
    second.sampler.advance(3.0)  # the same XIDs again, new ones: counted, once each
    assert xid_counts(second) == {("0", "13"): 2, ("1", "79"): 2}
    stop(node, second)
    third = start(node, "quiet")
    assert xid_counts(third) == {("0", "13"): 2, ("1", "79"): 2}
    assert value(third, "gpu_node_episodes", kind="xid", window="1d") >= 2


def slot_of(exporter, gpu: int) -> str:
    bus = exporter.current.snapshot.identities[gpu].pci_bus_id  # 00000000:BB:00.0
    return f"0000:{bus.split(':')[1].lower()}:00"


def test_an_xid_logged_while_stopped_is_counted_once_after_the_start(node):
    first = start(node, "quiet")
    assert xid_counts(first) == {}
    slot = slot_of(first, 1)
    stop(node, first)
    with open(node[0] / "kmsg", "a") as f:  # the driver logs it while no exporter runs
        f.write(f"4,2,2000000,-;NVRM: Xid (PCI:{slot}): 79, pid='<unknown>', "
                "name=<unknown>, GPU has fallen off the bus.\n")
        f.write(f"4,3,2000100,-;nvidia-nvswitch0: SXid (PCI:{slot}.0): 12028, Non-fatal\n")
    second = start(node, "quiet")
    assert xid_counts(second) == {("1", "79"): 1}
    assert value(second, "cte_kmsg_xids_total") == 1
    stop(node, second)
    third = start(node, "quiet")  # the same boot: its cursor says the line was taken
    assert xid_counts(third) == {("1", "79"): 1}
    stop(node, third)
    (node[0] / "boot_id").write_text("7d1c9a52-0b7e-4a33-9b1a-0c5a0f00b002\n")
    (node[0] / "kmsg").write_text("6,1,1000,-;Linux version 6.8.0\n")  # a reboot
    fourth = start(node, "quiet")
    assert xid_counts(fourth) == {("1", "79"): 1}


def test_a_log_line_after_a_clean_restart_is_a_new_xid(node):
    """Three XIDs from the log, a clean restart, a fourth line within 30 s: four."""
    first = start(node, "quiet")
    slot = slot_of(first, 1)
    first.sampler.xids.kernel_log.boot_time = lambda: 0.0
    at = first.sampler.clock.time()
    with open(node[0] / "kmsg", "a") as f:
        for i in (2, 3, 4):
            f.write(f"3,{i},{int((at + i) * 1e6)},-;NVRM: Xid (PCI:{slot}): 31, pid=1, name=x\n")
    first.sampler.xids.kernel_log.tick()
    first.sampler.advance(1.0)
    assert xid_counts(first) == {("1", "31"): 3}
    stop(node, first)
    with open(node[0] / "kmsg", "a") as f:
        f.write(f"3,5,{int((at + 5) * 1e6)},-;NVRM: Xid (PCI:{slot}): 31, pid=1, name=x\n")
    tmp, factory = node
    second = factory.start(manual=True, scenario=str(tmp / "quiet.yaml"),
                           storage_path=str(tmp / "state"), storage_kmsg_path=str(tmp / "kmsg"),
                           storage_boot_id_path=str(tmp / "boot_id"))
    second.sampler.xids.kernel_log.boot_time = lambda: 0.0
    second.sampler.xids.kernel_log.tick()
    second.sampler.advance(1.0)
    assert xid_counts(second) == {("1", "31"): 4}
    assert value(second, "cte_history_xid_duplicates_total") == 0


def test_an_xid_both_nvml_and_the_log_saw_counts_once(node):
    exporter = start(node, "xids")
    exporter.sampler.xids.kernel_log.boot_time = lambda: 0.0
    slot = slot_of(exporter, 0)
    seen = exporter.current.snapshot.xids[(0, 13)].last_seen
    with open(node[0] / "kmsg", "a") as f:
        f.write(f"3,5,{int((seen + 0.4) * 1e6)},-;NVRM: Xid (PCI:{slot}): 13, pid=99, "
                "name=python, Graphics SM Warp Exception\n")
        f.write(f"3,6,{int((seen + 0.5) * 1e6)},-;NVRM: Xid (PCI:{slot}): 31, pid=99, "
                "name=python, MMU Fault\n")  # only the log saw this one
    exporter.sampler.xids.kernel_log.tick()
    exporter.sampler.advance(1.0)
    assert xid_counts(exporter) == {("0", "13"): 1, ("0", "31"): 1, ("1", "79"): 1}
    assert value(exporter, "cte_history_xid_duplicates_total") == 1


def test_the_log_is_followed_where_nvml_events_are_unsupported(node):
    tmp, factory = node
    (tmp / "noevents.yaml").write_text(
        QUIET + "events:\n  - {kind: error, at: 0, call: nvmlDeviceRegisterEvents, "
        "error: NotSupported}\n")
    exporter = start(node, "noevents")
    assert exporter.current.snapshot.xid_events_registered == 0
    with open(tmp / "kmsg", "a") as f:
        f.write(f"3,9,9000000,-;NVRM: Xid (PCI:{slot_of(exporter, 0)}): 48, pid=1, name=x, "
                "DBE\n")
    exporter.sampler.xids.kernel_log.tick()
    exporter.sampler.advance(1.0)
    assert xid_counts(exporter) == {("0", "48"): 1}


def test_records_the_reader_cannot_take_are_skipped_whole_and_counted(node):
    tmp, _ = node
    exporter = start(node, "quiet")
    assert value(exporter, "cte_kmsg_skipped_records_total") == 0
    slot = slot_of(exporter, 0)
    with open(tmp / "kmsg", "a") as f:
        f.write(f"3,2,2000,-;NVRM: Xid (PCI:{slot}): 31, pid=1, name=x, {'x' * 9000}\n")
        f.write(f"3,{2**64},3000,-;NVRM: Xid (PCI:{slot}): 43, pid=1, name=x\n")
        f.write(f"3,3,4000,-;NVRM: Xid (PCI:{slot}): 48, pid=1, name=x\n")
    exporter.sampler.xids.kernel_log.tick()
    exporter.sampler.advance(1.0)
    assert xid_counts(exporter) == {("0", "48"): 1}
    assert value(exporter, "cte_kmsg_skipped_records_total") == 2


def test_a_gpu_whose_serial_changes_in_its_slot_shows_as_replaced(node):
    first = start(node, "xids")
    old = first.current.snapshot.identities[1]
    stop(node, first)
    second = start(node, "swapped")
    new = second.current.snapshot.identities[1]
    assert new.serial == "1652221099999" and new.uuid != old.uuid
    assert value(second, "gpu_node_gpu_replacements_total") == 1
    second.history.flush()  # its thread's work, by hand: the GPUs as stored
    _, body = http_get(second.port, "/api/v1/history")
    answer = json.loads(body)
    assert answer["replacements"] == [{
        "time": answer["replacements"][0]["time"], "slot": slot_of(second, 1),
        "old": {"serial": old.serial, "uuid": old.uuid},
        "new": {"serial": new.serial, "uuid": new.uuid}}]
    slots = [(g["slot"], g["serial"], g["boots"], g["drivers"]) for g in answer["gpus"]
             if g["slot"] == slot_of(second, 1)]
    driver = second.current.snapshot.driver_version
    assert slots == [(slot_of(second, 1), old.serial, 1, [driver]),
                     (slot_of(second, 1), new.serial, 1, [driver])]
    # the old GPU's XID stays under its own serial; the new GPU starts at none
    assert ("1", "79") not in xid_counts(second)
    _, body = http_get(second.port, f"/api/v1/history?gpu={old.uuid}")
    episodes = json.loads(body)["episodes"]
    assert [(e["serial"], e["xid"]) for e in episodes if e["kind"] == "xid"] == [(old.serial, 79)]
    assert {e["serial"] for e in episodes} == {old.serial}  # its verdict's episode too
    _, body = http_get(second.port, "/api/v1/findings")
    kinds = [f["kind"] for f in json.loads(body)["findings"]]
    assert "gpu_replaced" in kinds
    stop(node, second)
    third = start(node, "swapped")  # the same new GPU: no second replacement
    assert value(third, "gpu_node_gpu_replacements_total") == 1


def test_an_unreadable_kernel_log_degrades_readiness_and_the_exporter_runs_on(node):
    exporter = start(node, "xids", kmsg="no-such-kmsg")
    resp, body = http_get(exporter.port, "/readyz")
    assert resp.status == 200
    assert b"degraded" in body and b"cannot be read" in body and b"CAP_SYSLOG" in body
    assert xid_counts(exporter) == {("0", "13"): 1, ("1", "79"): 1}
    assert value(exporter, "cte_kmsg_readable") == 0


def test_the_history_api_bounds_and_bad_queries(node):
    exporter = start(node, "xids")
    t13 = exporter.current.snapshot.xids[(0, 13)].last_seen
    t79 = exporter.current.snapshot.xids[(1, 79)].last_seen
    assert t13 < t79
    def xids(query: str) -> list[tuple[int, int]]:
        _, body = http_get(exporter.port, f"/api/v1/history?{query}")
        return [(e["gpu"], e["xid"]) for e in json.loads(body)["episodes"] if e["kind"] == "xid"]

    assert xids("gpu=0") == [(0, 13)]
    serial = exporter.current.snapshot.identities[1].serial
    assert serial.isdigit()  # NVIDIA's serials are all digits: not an index
    assert xids(f"gpu={serial}") == [(1, 79)]
    assert xids(f"since={t79}") == [(1, 79)]
    assert xids(f"until={t79}") == [(0, 13)]
    _, body = http_get(exporter.port, "/api/v1/history?gpu=node")
    assert all("gpu" not in e for e in json.loads(body)["episodes"])
    for bad in ("since=soon", "gpu=7", "until=-1", "what=1"):
        resp, body = http_get(exporter.port, f"/api/v1/history?{bad}")
        assert resp.status == 400, bad
        assert "error" in json.loads(body)


def test_the_history_command_prints_event_lines(node):
    exporter = start(node, "xids")
    stop(node, exporter)
    out = subprocess.run([sys.executable, "-m", "exporter", "history", "--storage.path",
                          str(node[0] / "state"), "--format", "jsonl"], capture_output=True,
                         text=True, cwd=REPO, timeout=60)
    assert out.returncode == 0, out.stderr
    from exporter.events import parse_event

    events = [parse_event(line) for line in out.stdout.splitlines()]
    assert [(e.kind, e.xid) for e in events if e.kind == "xid"] == [("xid", 13), ("xid", 79)]
    assert {e.kind for e in events} == {"xid", "health_failed"}  # 79 fails GPU 1's verdict
    uuids = {i.uuid for i in exporter.current.snapshot.identities}
    assert {e.gpu for e in events} <= uuids and all(e.node for e in events)
    missing = subprocess.run([sys.executable, "-m", "exporter", "history", "--storage.path",
                              str(node[0] / "nothing")], capture_output=True, text=True,
                             cwd=REPO, timeout=60)
    assert missing.returncode == 1 and len(missing.stderr.strip().splitlines()) == 1


def test_a_second_exporter_on_the_same_directory_refuses_to_start(node, tmp_path):
    held = Store(tmp_path / "state")
    held.open()
    try:
        with pytest.raises(StoreBusy):
            node[1].start(manual=True, storage_path=str(tmp_path / "state"))
        out = subprocess.run(
            [sys.executable, "-m", "exporter", "run", "--fake", "--no-fake.costs",
             "--web.listen-address", "127.0.0.1:0", "--storage.path", str(tmp_path / "state")],
            capture_output=True, text=True, cwd=REPO, timeout=60)
    finally:
        held.close()
    assert out.returncode == 1
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "in use by another exporter" in lines[0], out.stderr


def test_a_locked_store_leaves_the_exporter_serving_without_a_history(node):
    import sqlite3

    from tests.test_history_store import hold_exclusively

    first = start(node, "xids")
    stop(node, first)
    holder = hold_exclusively(node[0] / "state")
    try:
        exporter = node[1].start(manual=True, scenario=str(node[0] / "xids.yaml"),
                                 storage_path=str(node[0] / "state"),
                                 storage_kmsg_path=str(node[0] / "kmsg"),
                                 storage_boot_id_path=str(node[0] / "boot_id"))
    finally:
        holder.close()
    assert exporter.history is None
    exporter.sampler.advance(4.0)
    resp, body = http_get(exporter.port, "/readyz")
    assert resp.status == 200 and b"degraded" in body and b"database is locked" in body
    assert xid_counts(exporter) == {("0", "13"): 1, ("1", "79"): 1}  # counted from zero
    db = sqlite3.connect(node[0] / "state" / "history.sqlite3")
    assert db.execute("SELECT count(*) FROM episodes WHERE kind = 'xid'").fetchone()[0] == 2
    db.close()
    assert sorted(p.name for p in (node[0] / "state").iterdir()
                  if p.name.startswith("history.sqlite3.")) == []


FAILING = QUIET + """events:
  - {kind: row_remap, at: 1, gpu: 0, uncorrectable: 1, failure: true}
  - {kind: fabric, at: 1, gpu: 1, degraded: true}
"""


def test_a_verdict_that_turns_failed_is_an_episode_once_across_restarts(node):
    (node[0] / "failing.yaml").write_text(FAILING)

    def kinds(exporter) -> list[tuple[int | None, str]]:
        _, body = http_get(exporter.port, "/api/v1/history")
        return sorted((e.get("gpu", -1), e["kind"]) for e in json.loads(body)["episodes"])

    first = start(node, "failing")
    first.sampler.advance(70.0)  # the fabric is read every 60 s
    assert first.current.verdict.gpus[0].state == "failed"
    got = kinds(first)
    assert (0, "health_failed") in got and (0, "row_remap_failure") in got
    assert (1, "fabric_degraded") in got
    stop(node, first)
    second = start(node, "failing")
    second.sampler.advance(70.0)
    assert kinds(second) == got  # the same verdict after a restart: nothing new


def test_a_quiet_node_writes_once_at_start_and_then_nothing(node):
    exporter = start(node, "quiet")
    history = exporter.history
    for _ in range(12):  # a minute of a healthy node, the history's thread's work by hand
        exporter.sampler.advance(5.0)  # the kernel log read too
        history.flush()
    assert history.writer.transactions == 1  # the GPUs, their boot and slots, at start


def test_the_live_page_shows_the_replacement(node, tmp_path):
    from tests.test_live_page import chromium
    from tests.tools import require_binary

    require_binary("chromium")
    first = start(node, "quiet")
    stop(node, first)
    second = start(node, "swapped")
    result = chromium(tmp_path, f"http://127.0.0.1:{second.port}/", "--dump-dom")
    assert result.returncode == 0, result.stderr[-2000:]
    item = re.search(r'<li[^>]*data-kind="gpu_replaced"[^>]*>(.*?)</li>', result.stdout, re.S)
    assert item, result.stdout[-3000:]
    assert "1652221099999" in item.group(1) and "replaced" in item.group(1)
