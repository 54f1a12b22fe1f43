"""What the history must not lose or take back: a served XID count after kill -9, a batch
around one bad record, the exporter's answers while a long kernel log is read."""

from __future__ import annotations

import json
import logging
import signal
import sqlite3
import subprocess
import sys
import threading
import time

import pytest

from exporter.history.kmsg import KmsgReader
from exporter.history.recorder import KMSG_SLICE, History
from exporter.history.store import FILE, Batch, Store
from exporter.sampling.snapshot import XidRecord
from tests.tools import REPO, free_port, http_get, make_snapshot, samples, wait_for

NOW = 1_790_000_000.0
BOOT = "7d1c9a52-0b7e-4a33-9b1a-0c5a0f00b001"

# an XID every 0.15 s on one of two GPUs: whenever the exporter is killed, one was just
# counted, or is about to be
STORM = "gpus: 2\nworkload: {type: training}\nevents:\n" + "".join(
    f"  - {{kind: xid, at: {0.3 + 0.15 * i:.2f}, gpu: {i % 2}, code: {(13, 31)[i % 2]}}}\n"
    for i in range(400))


def _served(port: int) -> float | None:
    """gpu_xid_errors_total summed, as a scrape gets it; None before the first answer."""
    try:
        resp, body = http_get(port, "/metrics", timeout=2.0)
    except OSError:
        return None
    if resp.status != 200:
        return None
    return sum(s.value for s in samples(body).get("gpu_xid_errors_total", []))


def _served_above(port: int, floor: float) -> float:
    """The first count served above `floor` (-1: any answer), waiting for it."""
    return wait_for(lambda: (v := _served(port)) is not None and v > floor and (v,), 30)[0]


def _start_serve_kill(tmp_path, wait_after: float) -> tuple[float, float]:
    """(the first count the exporter served, the highest it served before kill -9): killed
    at once after a scrape saw the count rise (an XID just served), or `wait_after` s on."""
    port = free_port()
    log = tmp_path / "exporter.log"
    with log.open("a") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "exporter", "run", "--fake", "--no-fake.costs",
             "--scenario", str(tmp_path / "storm.yaml"), "--no-collector.host",
             "--no-collector.infiniband", "--storage.path", str(tmp_path / "state"),
             "--storage.kmsg-path", "", "--web.listen-address", f"127.0.0.1:{port}"],
            stdout=out, stderr=subprocess.STDOUT, cwd=REPO)
    try:
        first = _served_above(port, -1.0)
        seen = _served_above(port, first)
        if wait_after:
            time.sleep(wait_after)
            seen = max(seen, _served(port) or 0.0)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        return first, seen
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def test_kill_9_never_takes_back_a_served_xid_count(tmp_path):
    """kill -9 at once after a scrape saw the count rise (just after an XID), and at
    other moments after it; the restarted exporter's first answer is never below the
    highest count served before the kill."""
    (tmp_path / "storm.yaml").write_text(STORM)
    highest = 0.0
    moments = (0.0, 0.0, 0.05, 0.3)
    for wait_after in moments:
        first, seen = _start_serve_kill(tmp_path, wait_after)
        assert first >= highest, (wait_after, first, highest,
                                  (tmp_path / "exporter.log").read_text()[-3000:])
        highest = max(highest, seen)
    first, _ = _start_serve_kill(tmp_path, 0.0)
    assert first >= highest >= len(moments)  # each run served at least one XID more
    db = sqlite3.connect(tmp_path / "state" / FILE)
    assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    db.close()


# -- one bad record, refused alone -----------------------------------------------------

def _history(tmp_path, log_text: str = "", **kw) -> History:
    (tmp_path / "boot_id").write_text(BOOT + "\n")
    (tmp_path / "kmsg").write_text(log_text)
    store = Store(tmp_path / "state", lambda: NOW)
    store.open()
    h = History(store, "node-a", clock=lambda: NOW, kmsg_path=str(tmp_path / "kmsg"),
                boot_id_path=str(tmp_path / "boot_id"), boot_time=lambda: NOW - 1000.0, **kw)
    h.load()
    h.observe(make_snapshot(2))  # GPUs 0 and 1, in slots 0000:00:00 and 0000:01:00
    return h


def _xid_line(sequence: int, slot: str, code: str) -> str:
    return f"3,{sequence},{sequence * 1000},-;NVRM: Xid (PCI:{slot}): {code}, pid=1, name=x\n"


def _stored_xids(tmp_path) -> dict[str, float]:
    db = sqlite3.connect(tmp_path / "state" / FILE)
    try:
        return {key: value for key, value in db.execute(
            "SELECT key, value FROM counters WHERE name = 'xid'")}
    finally:
        db.close()


def test_a_bad_kernel_log_record_is_refused_alone_and_named(tmp_path, caplog):
    lines = [_xid_line(1, "0000:00:00", "13"),
             _xid_line(2, "0000:3a:00", "99999999999999999999999999999"),  # absurd code
             _xid_line(3, "0000:01:00", "0"),  # no XID is 0
             _xid_line(4, "0000:77:00", "79"),  # a slot where this node has no GPU
             _xid_line(5, "0000:01:00", "31"),
             _xid_line(6, "0000:01:00", "9" * 5000)]  # past what int() converts
    h = _history(tmp_path, "".join(lines))
    with caplog.at_level(logging.WARNING):
        h.poll_kmsg()
    assert {code: n for (_, code), (n, _) in h.xids.items()} == {13: 1, 31: 1}
    assert _stored_xids(tmp_path) == {"13": 1.0, "31": 1.0}  # written ahead, the batch whole
    assert h.stats().refused == {"xid_code": 3, "not_on_this_node": 1}
    assert h.cursor == 6  # past them all: none is read again
    refused = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert len(refused) == 4 and all("\n" not in line for line in refused)
    assert any("record 4" in line and "0000:77:00" in line for line in refused)
    served = h.observe(make_snapshot(2))
    assert sorted(served.xids) == [(0, 13), (1, 31)]  # no absurd code, no gpu=""
    h.stop()


def test_an_nvml_xid_outside_its_range_is_no_label_and_refused(tmp_path):
    h = _history(tmp_path)
    snapshot = make_snapshot(2, xids={(0, 10**12): XidRecord(1, NOW), (1, 48): XidRecord(1, NOW)})
    served = h.observe(snapshot)
    assert sorted(served.xids) == [(1, 48)]
    assert h.stats().refused == {"xid_code": 1}
    assert _stored_xids(tmp_path) == {"48": 1.0}
    h.stop()
    (tmp_path / "alone").mkdir()
    alone = _history(tmp_path / "alone")  # nothing else counted: still no label
    served = alone.observe(make_snapshot(2, xids={(0, 10**12): XidRecord(1, NOW)}))
    assert served.xids == {}
    alone.stop()


def test_a_row_the_store_cannot_hold_is_refused_alone_and_the_rest_written(tmp_path):
    h = _history(tmp_path)
    with h.lock:
        h._level(("", "GPU-00000000"), "ecc_dbe", float("nan"), NOW)  # NOT NULL refuses NaN
        h._level(("", "GPU-00000000"), "retired_pages", 2.0**70, NOW)
        h._xid(("", "GPU-00000000"), 13, NOW, "nvml")
        h._occurred(("", "GPU-00000000"), "xid", NOW, 2**70)  # past sqlite's 64 bits
    assert h.flush()
    assert h.stats().refused == {"unstorable": 2}
    assert h.writer.write_failures == 0 and h.problems() == []
    assert _stored_xids(tmp_path) == {"13": 1.0}
    h.stop()


def test_a_write_that_fails_for_any_reason_is_counted_and_on_readyz(tmp_path, monkeypatch):
    h = _history(tmp_path)
    with h.lock:
        h._xid(("", "GPU-00000000"), 13, NOW, "nvml")

    def broken(batch: Batch) -> list[str]:
        raise OverflowError("Python int too large to convert to SQLite INTEGER")

    monkeypatch.setattr(h.store, "write", broken)
    assert not h.flush()
    assert h.writer.write_failures == 1
    assert any("OverflowError" in p for p in h.problems())
    monkeypatch.undo()
    assert h.flush() and h.problems() == []
    assert _stored_xids(tmp_path) == {"13": 1.0}  # kept, and written once it could be
    h.stop()


# -- a long kernel log ------------------------------------------------------------------

def _long_log(records: int, slot: str = "0000:00:00") -> str:
    return "".join(_xid_line(i, slot, "13") for i in range(1, records + 1))


def test_a_long_log_is_read_in_slices_each_written_with_its_cursor(tmp_path):
    records = 3 * KMSG_SLICE + 17
    h = _history(tmp_path, _long_log(records))
    writes = []
    real = h.store.write
    h.store.write = lambda batch: writes.append(dict(batch.cursors)) or real(batch)
    h.poll_kmsg()
    assert h.xids[(("", "GPU-00000000"), 13)][0] == records
    assert h.cursor == records
    assert len(writes) >= 4  # one transaction a slice, each with the cursor past it
    assert all(w.get(BOOT) for w in writes)
    h.stop()
    again = _history(tmp_path, _long_log(records))
    again.poll_kmsg()  # the same boot: nothing taken twice
    assert again.xids[(("", "GPU-00000000"), 13)][0] == records
    again.stop()


def test_matching_a_long_log_walks_each_entry_a_bounded_number_of_times(tmp_path,
                                                                         monkeypatch):
    """Counted in steps, not timed: how often matching reads an entry's time, for 4,000
    XIDs of one burst from the log and NVML's count of it."""
    from exporter.history import matching

    steps = 0

    class Counted(matching.Seen):
        def __getattribute__(self, name):
            nonlocal steps
            steps += name == "time"
            return super().__getattribute__(name)

    monkeypatch.setattr(matching, "Seen", Counted)
    h = _history(tmp_path)
    with h.lock:
        for i in range(4_000):  # within one minute, as a burst logs them
            h._xid(("", "GPU-00000000"), 13, NOW + i * 0.01, "kmsg")
    h.observe(make_snapshot(2, xids={(0, 13): XidRecord(4_000, NOW + 20.0)}))
    assert h.duplicates == 4_000 and h.xids[(("", "GPU-00000000"), 13)][0] == 4_000
    assert steps <= 4 * 4_000  # each entry a few times, not once for each other entry
    h.stop()


def test_scrapes_answer_while_a_long_log_is_read(tmp_path):
    """The lock is let go between slices: a scrape's figures (stats()) never wait for the
    whole log."""
    records = 10 * KMSG_SLICE
    h = _history(tmp_path, _long_log(records))
    reader = threading.Thread(target=h.poll_kmsg)
    waits = []
    reader.start()
    while reader.is_alive():
        started = time.monotonic()
        h.stats()
        waits.append(time.monotonic() - started)
        time.sleep(0.001)
    reader.join()
    assert h.xids[(("", "GPU-00000000"), 13)][0] == records
    assert len(waits) >= 5  # stats() got the lock while the log was read, again and again
    h.stop()


def test_the_reader_takes_a_file_in_slices_and_drops_an_endless_line(tmp_path):
    path = tmp_path / "kmsg"
    path.write_bytes(b"6,1,10,-;first\n" + b"x" * 100_000 + b"\n6,2,20,-;second\n")
    reader = KmsgReader(str(path))
    got = []
    for _ in range(100):
        records, more = reader.read_slice(1)
        got += [r.sequence for r in records]
        assert len(reader._partial) <= 8192
        if not more:
            break
    assert got == [1, 2]



# -- /api/v1/history --------------------------------------------------------------------

@pytest.fixture
def exporter(tmp_path):
    from tests.tools import ExporterFactory

    (tmp_path / "boot_id").write_text(BOOT + "\n")
    (tmp_path / "kmsg").write_text("")
    factory = ExporterFactory()
    exp = factory.start(manual=True, storage_path=str(tmp_path / "state"),
                        storage_kmsg_path=str(tmp_path / "kmsg"),
                        storage_boot_id_path=str(tmp_path / "boot_id"))
    exp.sampler.advance(2.0)
    yield exp
    factory.stop_all()


def _api(exp, query: str) -> tuple[int, dict]:
    resp, body = http_get(exp.port, f"/api/v1/history?{query}")
    return resp.status, json.loads(body)


@pytest.mark.parametrize("unknown", ["9", "GPU-not-here", "1652221999999", "x y"])
def test_an_unknown_gpu_is_refused_by_one_rule_numeric_or_not(exporter, unknown):
    from urllib.parse import quote

    status, answer = _api(exporter, f"gpu={quote(unknown)}")
    assert status == 400 and f"no GPU {unknown!r} on this node or stored" in answer["error"]


def test_parameters_are_percent_decoded(exporter):
    h = exporter.history
    uuid = exporter.current.snapshot.identities[1].uuid
    with h.lock:
        h._xid(h.gpus.key_of[1], 31, NOW, "nvml")
    encoded = "".join(f"%{b:02X}" for b in uuid.encode())  # every character encoded
    status, answer = _api(exporter, f"gpu={encoded}&since=1.79e%2B9")
    assert status == 200, answer
    assert [(e["gpu"], e["xid"]) for e in answer["episodes"]] == [(1, 31)]
    assert answer["since"] == 1.79e9


def test_episodes_come_in_pages(exporter):
    from exporter.history.answer import DEFAULT_PAGE

    h = exporter.history
    total = DEFAULT_PAGE + 150
    with h.lock:
        for i in range(total):  # an episode each: 200 s apart, more than the merge gap
            h._occurred(("", ""), "ib_link_down", NOW + 200.0 * i, detail=f"mlx5_{i % 3}/1")
            if i == total // 2:
                h.writer.write_ahead()  # half stored, half in memory only
    status, first = _api(exporter, "")
    assert status == 200 and len(first["episodes"]) == DEFAULT_PAGE and first["next"]
    status, rest = _api(exporter, f"after={first['next']}")
    assert len(rest["episodes"]) == 150 and rest["next"] is None
    seen, after = [], ""
    while True:
        status, page = _api(exporter, f"limit=400{after}")
        assert status == 200 and len(page["episodes"]) <= 400
        seen += [e["time"] for e in page["episodes"]]
        if page["next"] is None:
            break
        after = f"&after={page['next']}"
    assert seen == [NOW + 200.0 * i for i in range(total)]  # each once, in order
    for bad in ("limit=0", "limit=10001", "limit=ten", "after=yesterday"):
        status, answer = _api(exporter, bad)
        assert status == 400 and "error" in answer, bad


def test_an_nvml_event_outside_the_xid_range_never_reaches_a_label(caplog):
    from exporter.sampling.xids import XidWatcher

    watcher = XidWatcher(None, type("Clock", (), {"time": staticmethod(lambda: NOW)})(),
                         threading.Event())
    with caplog.at_level(logging.WARNING):
        for code in (0, 1000, 10**20):
            watcher.record(0, code)
        watcher.record(0, 999)  # NVML's "unknown": an XID
    assert sorted(watcher.seen()) == [(0, 999)]
    assert sum("outside NVML's range" in r.getMessage() for r in caplog.records) == 3
