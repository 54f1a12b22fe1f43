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
from dataclasses import dataclass

import pytest

from exporter.history.recorder import History
from exporter.history.store import FILE, Batch, Store
from exporter.sampling.clock import SYSTEM
from exporter.sampling.kmsg import KmsgReader
from exporter.sampling.xid_kmsg import SLICE, KernelLogFollower
from exporter.sampling.xid_ledger import Occurrence, XidLedger
from exporter.sampling.xid_sources import XidSources
from exporter.sampling.xids import XidWatcher
from tests.tools import (
    REPO,
    free_port,
    http_get,
    make_snapshot,
    samples,
    wait_for,
    xid_sources,
)

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

@dataclass
class Node:
    """A history with the sampler's XID side wired to it, as the exporter wires them."""

    history: History
    ledger: XidLedger
    log: KernelLogFollower

    def stop(self) -> None:
        self.log.finish()
        self.history.stop()


def _node(tmp_path, log_text: str = "") -> Node:
    (tmp_path / "boot_id").write_text(BOOT + "\n")
    (tmp_path / "kmsg").write_text(log_text)
    store = Store(tmp_path / "state", lambda: NOW)
    store.open()
    h = History(store, "node-a", clock=lambda: NOW, boot_id_path=str(tmp_path / "boot_id"))
    h.load()
    # GPUs 0 and 1, in slots 0000:00:00 and 0000:01:00
    ledger, follower = xid_sources(h, make_snapshot(2), str(tmp_path / "kmsg"),
                                   boot_time=lambda: NOW - 1000.0)
    return Node(h, ledger, follower)


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
    node = _node(tmp_path, "".join(lines))
    with caplog.at_level(logging.WARNING):
        node.log.tick()
    h = node.history
    assert {code: n for (_, code), (n, _) in h.xids.items()} == {13: 1, 31: 1}
    assert _stored_xids(tmp_path) == {"13": 1.0, "31": 1.0}  # written ahead, the batch whole
    assert h.stats().refused == {"xid_code": 3, "not_on_this_node": 1}
    assert h.cursor == 6  # past them all: none is read again
    refused = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert len(refused) == 4 and all("\n" not in line for line in refused)
    assert any("record 4" in line and "0000:77:00" in line for line in refused)
    assert sorted(node.ledger.seen()) == [(0, 13), (1, 31)]  # no absurd code, no gpu=""
    node.stop()


def test_an_nvml_xid_outside_its_range_is_no_label_and_refused(tmp_path, caplog):
    node = _node(tmp_path)
    watcher = XidWatcher(None, type("Clock", (), {"time": staticmethod(lambda: NOW)})(),
                         threading.Event(), node.ledger)
    with caplog.at_level(logging.WARNING):
        watcher.record([(0, 0), (0, 1000), (0, 10**20), (1, 48),
                        (0, 999)])  # 999: NVML's "unknown", an XID
    assert sorted(node.ledger.seen()) == [(0, 999), (1, 48)]
    assert node.history.stats().refused == {"xid_code": 3}
    assert _stored_xids(tmp_path) == {"48": 1.0, "999": 1.0}
    assert sum("refused NVML event" in r.getMessage() for r in caplog.records) == 3
    node.stop()


def test_without_a_state_directory_a_bad_xid_is_no_label_and_named(caplog):
    ledger = XidLedger()
    with caplog.at_level(logging.WARNING):
        ledger.add([Occurrence(0, 10**12, NOW, "nvml", what="NVML event: XID 1e12"),
                    Occurrence(None, 79, NOW, "kmsg", slot="0000:77:00", what="record 4"),
                    Occurrence(1, 48, NOW, "nvml")])
    assert sorted(ledger.seen()) == [(1, 48)]
    assert [r.getMessage() for r in caplog.records] == [
        "refused NVML event: XID 1e12 (xid code)", "refused record 4 (not on this node)"]


def test_a_row_the_store_cannot_hold_is_refused_alone_and_the_rest_written(tmp_path):
    node = _node(tmp_path)
    h = node.history
    with h.lock:
        h._level(("", "GPU-00000000"), "ecc_dbe", float("nan"), NOW)  # NOT NULL refuses NaN
        h._level(("", "GPU-00000000"), "retired_pages", 2.0**70, NOW)
        h._xid(("", "GPU-00000000"), 13, NOW, 1)
        h._occurred(("", "GPU-00000000"), "xid", NOW, 2**70)  # past sqlite's 64 bits
    assert h.flush()
    assert h.stats().refused == {"unstorable": 2}
    assert h.writer.write_failures == 0 and h.problems() == []
    assert _stored_xids(tmp_path) == {"13": 1.0}
    node.stop()


def test_a_write_that_fails_for_any_reason_is_counted_and_on_readyz(tmp_path, monkeypatch):
    node = _node(tmp_path)
    h = node.history

    def broken(batch: Batch) -> list[str]:
        raise OverflowError("Python int too large to convert to SQLite INTEGER")

    monkeypatch.setattr(h.store, "write", broken)
    node.ledger.add([Occurrence(0, 13, NOW, "nvml")])  # served from memory meanwhile
    assert node.ledger.seen()[(0, 13)].count == 1
    assert h.writer.write_failures == 1
    assert any("OverflowError" in p for p in h.problems())
    monkeypatch.undo()
    assert h.flush() and h.problems() == []
    assert _stored_xids(tmp_path) == {"13": 1.0}  # kept, and written once it could be
    node.stop()


# -- a long kernel log ------------------------------------------------------------------

def _long_log(records: int, slot: str = "0000:00:00") -> str:
    return "".join(_xid_line(i, slot, "13") for i in range(1, records + 1))


def test_a_long_log_is_read_in_slices_each_written_with_its_cursor(tmp_path):
    records = 3 * SLICE + 17
    node = _node(tmp_path, _long_log(records))
    h = node.history
    writes = []
    real = h.store.write
    h.store.write = lambda batch: writes.append(dict(batch.cursors)) or real(batch)
    node.log.tick()
    assert h.xids[(("", "GPU-00000000"), 13)][0] == records
    assert h.cursor == records
    assert len(writes) >= 4  # one transaction a slice, each with the cursor past it
    assert all(w.get(BOOT) for w in writes)
    node.stop()
    again = _node(tmp_path, _long_log(records))
    again.log.tick()  # the same boot: nothing taken twice
    assert again.history.xids[(("", "GPU-00000000"), 13)][0] == records
    assert again.ledger.seen()[(0, 13)].count == records
    again.stop()


def test_matching_a_long_log_walks_each_entry_a_bounded_number_of_times(tmp_path,
                                                                         monkeypatch):
    """Counted in steps, not timed: how often matching reads an entry's time, for 4,000
    XIDs of one burst from the log and NVML's count of it."""
    from exporter.sampling import xid_matching as matching

    steps = 0

    class Counted(matching.Seen):
        def __getattribute__(self, name):
            nonlocal steps
            steps += name == "time"
            return super().__getattribute__(name)

    monkeypatch.setattr(matching, "Seen", Counted)
    node = _node(tmp_path)
    # within one minute, as a burst logs them
    node.ledger.add([Occurrence(0, 13, NOW + i * 0.01, "kmsg", slot="0000:00:00")
                     for i in range(4_000)])
    node.ledger.add([Occurrence(0, 13, NOW + 20.0, "nvml", 4_000)])
    assert node.ledger.duplicates == 4_000
    assert node.history.xids[(("", "GPU-00000000"), 13)][0] == 4_000
    assert steps <= 4 * 4_000  # each entry a few times, not once for each other entry
    node.stop()


def test_snapshots_and_scrapes_never_wait_for_a_long_log(tmp_path):
    """The counts are taken without a lock and the history's lock is let go between
    slices: neither the publisher nor a scrape's figures wait for the whole log."""
    records = 10 * SLICE
    node = _node(tmp_path, _long_log(records))
    reader = threading.Thread(target=node.log.tick)
    waits = []
    reader.start()
    while reader.is_alive():
        started = time.monotonic()
        node.history.stats()
        node.ledger.seen()
        waits.append(time.monotonic() - started)
        time.sleep(0.001)
    reader.join()
    assert node.ledger.seen()[(0, 13)].count == records
    assert len(waits) >= 5  # stats() got the lock while the log was read, again and again
    node.stop()


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



def test_a_record_longer_than_the_reader_takes_is_skipped_whole(tmp_path, caplog):
    """A user's line (anyone may write one) longer than a record can be, with a kernel XID
    record's text where the reader's first chunk ends, and a kernel line too long to be a
    record: neither is an XID, and the tail of neither is read as a record of its own."""
    from exporter.sampling import kmsg

    head, user = "6,1,10,-;first\n", "14,2,20,-;"  # facility 1: a user's line
    inner = "3,3,30,-;NVRM: Xid (PCI:0000:00:00): 79, pid=1, name=x"
    pad = "A" * (kmsg.FILE_CHUNK - len(head) - len(user))  # `inner` starts the next chunk
    long_kernel = ("3,4,40,-;NVRM: Xid (PCI:0000:01:00): 31, pid=1, name=x, "
                   + "B" * kmsg.MAX_RECORD + "\n")
    node = _node(tmp_path, head + user + pad + inner + "\n" + long_kernel
                 + _xid_line(5, "0000:00:00", "13"))
    with caplog.at_level(logging.WARNING):
        node.log.tick()
    assert {code for (_, code) in node.history.xids} == {13}
    assert node.log.skipped == 2 and node.history.cursor == 5
    lines = [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()]
    assert lines and all("longer than" in line for line in lines)
    node.stop()


def test_a_record_numbered_past_64_bits_is_skipped_and_later_ones_are_read(tmp_path):
    """The cursor never moves past what the store holds: a record whose sequence (or
    stamp) is past 64 bits is skipped, and the records after it are read."""
    xid = "NVRM: Xid (PCI:0000:01:00): {}, pid=1, name=x\n"
    node = _node(tmp_path, "".join([
        _xid_line(1, "0000:00:00", "13"),
        f"3,{2**63},2000,-;" + xid.format(31),
        f"3,{2**64 + 7},3000,-;" + xid.format(48),
        f"3,3,{2**63},-;" + xid.format(63),
        f"3,4,{'9' * 400},-;" + xid.format(64),  # a stamp no float holds
        _xid_line(5, "0000:01:00", "79")]))
    node.log.tick()
    h = node.history
    assert {code for (_, code) in h.xids} == {13, 79}
    assert node.log.skipped == 4 and h.stats().refused == {}
    assert h.cursor == 5 and _stored_cursor(tmp_path) == 5
    with open(tmp_path / "kmsg", "a") as f:
        f.write(_xid_line(6, "0000:00:00", "48"))
    node.log.tick()  # a later record is read, not skipped as "already taken"
    assert {code for (_, code) in h.xids} == {13, 48, 79}
    assert _stored_cursor(tmp_path) == 6
    node.stop()


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
        h._xid(h.gpus.key_of[1], 31, NOW, 1)
    encoded = "".join(f"%{b:02X}" for b in uuid.encode())  # every character encoded
    status, answer = _api(exporter, f"gpu={encoded}&since=1.79e%2B9")
    assert status == 200, answer
    assert [(e["gpu"], e["xid"]) for e in answer["episodes"]] == [(1, 31)]
    assert answer["since"] == 1.79e9


def test_episodes_come_in_pages(exporter):
    from exporter.history.answer import DEFAULT_PAGE

    h = exporter.history
    total = DEFAULT_PAGE + 150
    for i in range(total):  # an episode each: 200 s apart, more than the merge gap
        with h.lock:
            h._occurred(("", ""), "ib_link_down", NOW + 200.0 * i, detail=f"mlx5_{i % 3}/1")
        if i == total // 2:
            h.flush()  # half stored, half in memory only
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


@pytest.mark.parametrize("bad", [
    "after=0:9223372036854775808", "after=0:-9223372036854775809",
    f"after=0:{2**64}", f"after=0:{'9' * 5000}", "after=1e999:1", "after=nan:1",
    "after=0:1.5", "after=:1", "limit=99999999999999999999", "limit=-1", "since=1e999",
    "until=nan", "gpu=99999999999999999999"])
def test_a_number_past_what_the_store_holds_is_a_bad_request(exporter, bad):
    status, answer = _api(exporter, bad)
    assert status == 400 and "error" in answer, (bad, answer)
    assert _api(exporter, "")[0] == 200  # and the exporter answers on


# -- the XID path under load, a slow disk, a late GPU and a stop -------------------------

def _stored_cursor(tmp_path) -> int | None:
    db = sqlite3.connect(tmp_path / "state" / FILE)
    try:
        row = db.execute("SELECT sequence FROM cursors WHERE boot_id = ?", (BOOT,)).fetchone()
        return row[0] if row else None
    finally:
        db.close()


def test_a_log_slice_of_xids_nvml_already_counted_commits_its_cursor_at_once(tmp_path):
    """Else a kill before the next flush would read the line again after the restart,
    with nothing left to match it against, and count the XID twice."""
    node = _node(tmp_path)
    node.ledger.add([Occurrence(0, 13, NOW, "nvml")])
    with open(tmp_path / "kmsg", "a") as f:  # boot at NOW - 1000 s: the line is at NOW
        f.write("3,1,1000000000,-;NVRM: Xid (PCI:0000:00:00): 13, pid=1, name=x\n")
    node.log.tick()
    assert node.ledger.duplicates == 1 and node.ledger.seen()[(0, 13)].count == 1
    assert _stored_cursor(tmp_path) == 1  # committed, no flush needed
    node.stop()


def test_a_slow_disk_holds_the_xids_thread_never_the_publisher_or_a_scrape(tmp_path):
    node = _node(tmp_path)
    h = node.history
    writing, release = threading.Event(), threading.Event()
    real = h.store.write

    def slow(batch):
        writing.set()
        release.wait(30)
        return real(batch)

    h.store.write = slow
    xid = threading.Thread(target=node.ledger.add, args=([Occurrence(0, 13, NOW, "nvml")],))
    xid.start()
    assert writing.wait(10)
    meanwhile = threading.Thread(target=lambda: (h.observe(make_snapshot(2)), h.stats(),
                                                 h.problems(), node.ledger.seen()))
    meanwhile.start()
    meanwhile.join(10)
    served_while_writing = dict(node.ledger.seen())
    release.set()
    xid.join(10)
    assert not meanwhile.is_alive()  # done while the write still waited
    assert served_while_writing == {}  # and the XID not served before it is on disk
    assert node.ledger.seen()[(0, 13)].count == 1 and _stored_xids(tmp_path) == {"13": 1.0}
    node.stop()


class _Events:
    """NVML's event calls for a watcher: `pending` events, then none."""

    def __init__(self, pending: list[tuple[int, int]]):
        self.pending = pending
        self.uuids = dict

    def register_xid_events(self):
        return "set", 2

    def wait_xid(self, event_set, timeout_ms):
        return self.pending.pop(0) if self.pending else None

    def gpu_of(self, handle, uuids):
        return handle

    def call(self, *args, **kwargs):
        return None


def test_a_burst_of_nvml_events_is_one_transaction(tmp_path):
    node = _node(tmp_path)
    backend = _Events([(i % 2, 13) for i in range(50)])
    gpus = type("Gpus", (), {"backend": backend, "uuids": staticmethod(dict)})()
    watcher = XidWatcher(gpus, type("Clock", (), {"time": staticmethod(lambda: NOW)})(),
                         threading.Event(), node.ledger)
    before = node.history.writer.transactions
    watcher.poll()
    assert node.ledger.seen()[(0, 13)].count == 25 and node.ledger.seen()[(1, 13)].count == 25
    assert node.history.writer.transactions == before + 1
    node.stop()


def test_a_gpu_lost_at_start_gets_its_stored_count_once_it_is_back(tmp_path):
    node = _node(tmp_path)
    node.ledger.add([Occurrence(1, 79, NOW, "nvml", 2)])
    node.stop()
    store = Store(tmp_path / "state", lambda: NOW)
    store.open()
    h = History(store, "node-a", clock=lambda: NOW, boot_id_path=str(tmp_path / "boot_id"))
    h.load()
    both = make_snapshot(2).identities
    identities = [both[0], None]  # GPU 1 lost when the exporter starts
    sources = XidSources(type("Gpus", (), {"identities": identities})(), SYSTEM,
                         threading.Event(), "")
    sources.begin(h.begin(identities, "1"), h)
    assert (1, 79) not in sources.seen()
    identities[1] = both[1]  # recovered
    h.observe(make_snapshot(2))
    sources.ledger.add([Occurrence(1, 79, NOW + 5, "nvml")])
    assert sources.seen()[(1, 79)].count == 3  # never below what the last run served
    assert h.xids[(("", both[1].uuid), 79)][0] == 3  # and stored under its own GPU
    h.stop()


def test_after_the_sampler_stops_nothing_reaches_the_closed_store(tmp_path):
    node = _node(tmp_path)
    node.ledger.close()
    node.history.stop()
    node.ledger.add([Occurrence(0, 13, NOW, "nvml")])  # an event thread that outlived stop
    assert node.ledger.seen()[(0, 13)].count == 1 and node.history.xids == {}


def test_an_xid_nvml_reported_before_a_stop_counts_once_when_its_log_line_comes_after(
        tmp_path):
    node = _node(tmp_path)
    node.ledger.add([Occurrence(0, 13, NOW, "nvml")])
    node.history.stop()  # stopped (or killed) before the log's next read
    with open(tmp_path / "kmsg", "a") as f:  # boot at NOW - 1000 s: the line is at NOW + 0.4
        f.write("3,1,1000400000,-;NVRM: Xid (PCI:0000:00:00): 13, pid=1, name=x\n")
    again = _node(tmp_path, (tmp_path / "kmsg").read_text())
    again.log.tick()
    assert again.ledger.seen()[(0, 13)].count == 1 and again.ledger.duplicates == 1
    assert _stored_xids(tmp_path) == {"13": 1.0}
    again.stop()


def _log_xid(sequence: int, at: float, code: int = 13, slot: str = "0000:00:00") -> str:
    """A kernel-log XID line at `at` (the nodes of _node booted at NOW - 1000 s)."""
    stamp = round((at - NOW + 1000.0) * 1e6)
    return f"3,{sequence},{stamp},-;NVRM: Xid (PCI:{slot}): {code}, pid=1, name=x\n"


def test_xids_from_the_log_leave_nothing_waiting_after_a_restart(tmp_path):
    """Three log lines, a clean restart, a fourth line within 30 s: four XIDs, none of
    them taken for an NVML report still waiting for its line."""
    lines = "".join(_log_xid(i, NOW + i) for i in (1, 2, 3))
    node = _node(tmp_path, lines)
    node.log.tick()
    assert node.ledger.seen()[(0, 13)].count == 3
    node.stop()
    again = _node(tmp_path, lines + _log_xid(4, NOW + 4))
    again.log.tick()
    assert again.ledger.seen()[(0, 13)].count == 4 and again.ledger.duplicates == 0
    assert _stored_xids(tmp_path) == {"13": 4.0}
    again.stop()


def test_an_xid_matched_before_a_restart_leaves_nothing_waiting(tmp_path):
    node = _node(tmp_path)
    node.ledger.add([Occurrence(0, 13, NOW, "nvml")])
    with open(tmp_path / "kmsg", "a") as f:
        f.write(_log_xid(1, NOW + 0.4))
    node.log.tick()
    assert node.ledger.seen()[(0, 13)].count == 1 and node.ledger.duplicates == 1
    node.stop()
    again = _node(tmp_path, (tmp_path / "kmsg").read_text() + _log_xid(2, NOW + 5))
    again.log.tick()
    assert again.ledger.seen()[(0, 13)].count == 2 and again.ledger.duplicates == 0
    again.stop()


def _as_an_older_version_left_it(tmp_path) -> None:
    """The store as a version that kept no XID's source wrote it."""
    db = sqlite3.connect(tmp_path / "state" / FILE)
    db.execute("DELETE FROM counters WHERE name != 'xid' AND name != 'level'")
    db.commit()
    db.close()


def test_an_older_store_s_xid_waits_for_its_line_only_if_the_log_was_not_read_since(
        tmp_path):
    # killed after NVML's event, before the log was read: its line, read after the
    # restart, is the same XID
    node = _node(tmp_path)
    node.ledger.add([Occurrence(0, 13, NOW, "nvml")])
    node.history.stop()
    _as_an_older_version_left_it(tmp_path)
    again = _node(tmp_path, _log_xid(1, NOW + 0.4))
    again.log.tick()
    assert again.ledger.seen()[(0, 13)].count == 1 and again.ledger.duplicates == 1
    again.stop()
    # an XID the log was read after (the cursor stored at a clean stop, at NOW): a new
    # line of the same code within 30 s is a new XID
    other = tmp_path / "other"
    other.mkdir()
    boot = "6,1,1000,-;Linux version 6.8.0\n"
    node = _node(other, boot)
    node.ledger.add([Occurrence(0, 13, NOW - 10, "nvml")])
    node.stop()
    assert _stored_cursor(other) == 1
    _as_an_older_version_left_it(other)
    again = _node(other, boot + _log_xid(2, NOW - 5))
    again.log.tick()
    assert again.ledger.seen()[(0, 13)].count == 2 and again.ledger.duplicates == 0
    again.stop()
