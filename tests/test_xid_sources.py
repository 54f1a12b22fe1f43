"""Both XID sources on the sampling side: `gpu_xid_errors_total` means the same with a
state directory and without one, the kernel log is read without one too (from its end,
said in a log line), and the snapshot the sampler built is the one served, never replaced."""

from __future__ import annotations

import logging

import pytest

from tests.test_history_restart import BOOT, XIDS
from tests.tools import ExporterFactory, samples

# In XIDS, NVML raises 13 on GPU 0 and 79 on GPU 1; the kernel log will say 13 again (the
# same one) and 31, which only the log saw.
OLD_LINE = "3,1,1000,-;NVRM: Xid (PCI:0000:18:00): 48, pid=1, name=x, DBE before the start\n"


@pytest.fixture
def factory():
    made = ExporterFactory()
    yield made
    made.stop_all()


def _run(factory, tmp_path, state: bool):
    """An exporter on the fake, the kernel log with a line from before its start; two
    XIDs from NVML, then two lines logged (one of them NVML's XID 13 again)."""
    where = tmp_path / ("with" if state else "without")
    where.mkdir()
    (where / "xids.yaml").write_text(XIDS)
    (where / "boot_id").write_text(BOOT + "\n")
    kmsg = where / "kmsg"
    kmsg.write_text(OLD_LINE)
    exporter = factory.start(
        manual=True, scenario=str(where / "xids.yaml"), storage_kmsg_path=str(kmsg),
        storage_boot_id_path=str(where / "boot_id"),
        storage_path=str(where / "state") if state else "")
    exporter.sampler.xids.kernel_log.boot_time = lambda: 0.0
    exporter.sampler.advance(3.0)
    seen = exporter.current.snapshot.xids[(0, 13)].last_seen
    slot = exporter.sampler.xids.slots()
    gpu0 = next(s for s, i in slot.items() if i == 0)
    with open(kmsg, "a") as f:
        f.write(f"3,2,{int((seen + 0.4) * 1e6)},-;NVRM: Xid (PCI:{gpu0}): 13, pid=9, name=x\n")
        f.write(f"3,3,{int((seen + 0.5) * 1e6)},-;NVRM: Xid (PCI:{gpu0}): 31, pid=9, name=x\n")
    exporter.sampler.advance(6.0)  # the kernel log's next read, and a snapshot after it
    return exporter


def _counts(exporter) -> dict[tuple[str, str], float]:
    got = samples(exporter.current.body).get("gpu_xid_errors_total", [])
    return {(s.labels["gpu"], s.labels["xid"]): s.value for s in got}


def test_the_xid_count_means_the_same_with_a_state_directory_and_without(factory, tmp_path,
                                                                        caplog):
    with caplog.at_level(logging.INFO):
        without = _run(factory, tmp_path, state=False)
    with_state = _run(factory, tmp_path, state=True)
    assert without.history is None and with_state.history is not None
    assert _counts(without) == {("0", "13"): 1, ("0", "31"): 1, ("1", "79"): 1}
    # the line logged before the start: taken where a cursor can be kept, said where not
    assert _counts(with_state) == {**_counts(without), ("0", "48"): 1}
    assert any("read from its end (no state directory is kept)" in r.getMessage()
               for r in caplog.records)
    for exporter in (without, with_state):
        body = samples(exporter.current.body)
        assert body["cte_history_xid_duplicates_total"][0].value == 1
        assert body["cte_kmsg_readable"][0].value == 1


def test_the_snapshot_served_is_the_one_the_sampler_built(factory, tmp_path):
    exporter = _run(factory, tmp_path, state=True)
    assert exporter.current.snapshot is exporter.sampler.snapshot
    exporter.stop()
    factory.exporters.remove(exporter)
    again = factory.start(manual=True, scenario=str(tmp_path / "with" / "xids.yaml"),
                          storage_path=str(tmp_path / "with" / "state"),
                          storage_kmsg_path=str(tmp_path / "with" / "kmsg"),
                          storage_boot_id_path=str(tmp_path / "with" / "boot_id"))
    # the counts continue from the store, in the snapshot the sampler built
    assert again.current.snapshot is again.sampler.snapshot
    assert _counts(again) == {("0", "13"): 1, ("0", "31"): 1, ("0", "48"): 1, ("1", "79"): 1}


def test_a_node_without_a_kernel_log_serves_no_kernel_log_figures(factory, tmp_path):
    (tmp_path / "xids.yaml").write_text(XIDS)
    exporter = factory.start(manual=True, scenario=str(tmp_path / "xids.yaml"))
    exporter.sampler.advance(3.0)
    assert exporter.sampler.xids.kernel_log is None  # auto: none on the fake
    body = samples(exporter.current.body)
    assert "cte_kmsg_readable" not in body and "cte_kmsg_xids_total" not in body
    assert _counts(exporter) == {("0", "13"): 1, ("1", "79"): 1}
