"""The store under faults: corrupt, unreadable and future files moved aside; a full disk
(RLIMIT_FSIZE) that loses nothing stored; kill -9 during writes; the size bound over years
of events; batched writes."""

from __future__ import annotations

import logging
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap

import pytest

from exporter.history.episodes import NODE
from exporter.history.recorder import History
from exporter.history.store import BOUND_BYTES, FILE, MAX_EPISODES, PRUNE_EPISODES, Store
from exporter.sampling.snapshot import XidRecord
from exporter.sampling.xid_ledger import Occurrence
from tests.tools import REPO, make_snapshot, wait_for, xid_sources

GPU = ("1652221000000", "GPU-00000000")


def history(directory, now=lambda: 1_790_000_000.0, **kw) -> History:
    store = Store(directory, now)
    store.open()
    h = History(store, "node-a", clock=now, reads_kernel_log=False,
                boot_id_path=str(directory) + "-no-boot", **kw)
    h.load()
    return h


def add_xid(h: History, at: float, code: int = 13, gpu=GPU) -> None:
    with h.lock:
        h._xid(gpu, code, at, 1)


def stored(directory) -> list[tuple]:
    db = sqlite3.connect(directory / FILE)
    try:
        return db.execute("SELECT kind, xid, start, count FROM episodes ORDER BY start").fetchall()
    finally:
        db.close()


def test_episodes_and_counts_survive_a_reopen(tmp_path):
    h = history(tmp_path)
    for t in (0.0, 10.0, 500.0):
        add_xid(h, 1_790_000_000.0 - 1000 + t)
    assert h.flush() and h.writer.transactions == 1
    h.stop()
    again = history(tmp_path)
    assert again.xids[(GPU, 13)][0] == 3
    assert [(e.count, e.xid) for e in again.recent] == [(2, 13), (1, 13)]
    again.stop()


def test_no_transaction_when_nothing_happened(tmp_path):
    h = history(tmp_path)
    assert h.flush() and h.flush()
    assert h.writer.transactions == 0
    add_xid(h, 1_790_000_000.0)
    h.flush()
    h.flush()
    assert h.writer.transactions == 1
    h.stop()


@pytest.mark.parametrize("reason", ["corrupt", "unreadable", "future"])
def test_a_bad_file_is_moved_aside_and_the_store_starts_afresh(tmp_path, reason, caplog):
    path = tmp_path / FILE
    if reason == "corrupt":
        path.write_bytes(b"SQLite format 3\x00" + os.urandom(4096))
    elif reason == "unreadable":
        path.mkdir()  # open() fails whoever we are (root reads any mode)
    else:
        db = sqlite3.connect(path)
        db.execute("PRAGMA user_version=99")
        db.execute("CREATE TABLE t(x)")
        db.commit()
        db.close()
    h = history(tmp_path)
    assert h.store.resets == {reason: 1}
    aside = [p.name for p in tmp_path.iterdir() if p.name.startswith(f"{FILE}.{reason}-")]
    assert len(aside) == 1
    moved = [r for r in caplog.records if "moved aside" in r.getMessage()]
    assert len(moved) == 1
    add_xid(h, 1_790_000_000.0)
    assert h.flush()
    from exporter.history.families import history_families

    resets = next(f for f in history_families(h, 1_790_000_000.0)
                  if f.name == "cte_history_state_resets")
    assert {s.labels["reason"]: s.value for s in resets.samples}[reason] == 1
    h.stop()


def test_a_store_dated_in_the_future_is_kept_and_the_clock_named(tmp_path, caplog):
    """A node that boots with its clock behind: its history is good, only the clock is
    wrong; the file stays and the oddity is logged."""
    h = history(tmp_path, now=lambda: 1_900_000_000.0)
    add_xid(h, 1_900_000_000.0)
    h.stop()
    back = history(tmp_path, now=lambda: 1_790_000_000.0)  # the clock is far behind now
    assert back.store.resets == {}
    assert back.xids[(GPU, 13)][0] == 1
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(f"{FILE}.")] == []
    assert any("is the clock right?" in r.getMessage() for r in caplog.records)
    back.stop()


def hold_exclusively(directory) -> sqlite3.Connection:
    """Another connection holding the file's lock: every other one reads 'database is
    locked' (SQLITE_BUSY), as a backup tool or a stuck reader would cause."""
    db = sqlite3.connect(directory / FILE, isolation_level=None, timeout=0)
    db.execute("PRAGMA locking_mode=EXCLUSIVE")
    db.execute("BEGIN EXCLUSIVE")
    return db


def test_a_locked_file_is_left_alone_and_the_store_fails_to_open(tmp_path):
    from exporter.history.store import StoreError

    h = history(tmp_path)
    add_xid(h, 1_790_000_000.0)
    h.stop()
    holder = hold_exclusively(tmp_path)
    store = Store(tmp_path)
    try:
        with pytest.raises(StoreError, match="database is locked"):
            store.open()
    finally:
        holder.close()
    assert store.resets == {}
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(f"{FILE}.")] == []
    again = history(tmp_path)  # the directory's lock was released with the failure
    assert again.xids[(GPU, 13)][0] == 1  # the history is all there
    again.stop()


def test_a_second_store_on_one_directory_is_refused(tmp_path):
    from exporter.history.store import StoreBusy

    first = Store(tmp_path)
    first.open()
    with pytest.raises(StoreBusy, match=f"pid {os.getpid()}"):
        Store(tmp_path).open()
    first.close()
    Store(tmp_path).open()


# -- the `history` command: a read ---------------------------------------------------------

def history_command(directory) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "exporter", "history", "--storage.path",
                           str(directory)], capture_output=True, text=True, cwd=REPO,
                          timeout=60)


def files(directory) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in directory.iterdir()}


def damage_a_table(directory, table: str = "replacements") -> None:
    """Break one table's b-tree page (the episodes stay readable): SQLite's quick check
    fails."""
    db = sqlite3.connect(directory / FILE)
    root = db.execute("SELECT rootpage FROM sqlite_master WHERE name = ?", (table,)).fetchone()[0]
    size = db.execute("PRAGMA page_size").fetchone()[0]
    db.close()
    with open(directory / FILE, "r+b") as f:
        f.seek(size * (root - 1))
        f.write(b"\x07")  # no page type


def test_the_history_command_reads_the_store_without_writing_a_byte(tmp_path):
    h = history(tmp_path)
    add_xid(h, 1_790_000_000.0)
    h.stop()
    before = files(tmp_path)
    assert sorted(before) == [FILE, "lock"]
    out = history_command(tmp_path)
    assert out.returncode == 0 and '"xid": 13' in out.stdout, out.stderr
    assert files(tmp_path) == before  # no -wal or -shm left, nothing changed


def test_the_history_command_reads_what_a_running_exporter_wrote(tmp_path):
    h = history(tmp_path)
    add_xid(h, 1_790_000_000.0)
    assert h.flush()  # in the write-ahead log, the store still open
    try:
        out = history_command(tmp_path)
    finally:
        h.stop()
    assert out.returncode == 0 and '"xid": 13' in out.stdout, out.stderr


def test_the_history_command_reads_a_killed_exporter_s_log_without_its_index(tmp_path):
    """A write-ahead log left without its index (-shm): read from a copy, the directory
    left as it was."""
    h = history(tmp_path / "live")
    add_xid(h, 1_790_000_000.0)
    assert h.flush()
    left = tmp_path / "left"
    left.mkdir()
    for name in (FILE, f"{FILE}-wal"):  # as kill -9 left them, the index gone
        (left / name).write_bytes((tmp_path / "live" / name).read_bytes())
    h.stop()
    before = files(left)
    out = history_command(left)
    assert out.returncode == 0 and '"xid": 13' in out.stdout, out.stderr
    assert files(left) == before


def test_the_history_command_says_a_damaged_store_is_damaged_and_leaves_it(tmp_path):
    h = history(tmp_path)
    add_xid(h, 1_790_000_000.0)
    h.stop()
    damage_a_table(tmp_path)
    before = files(tmp_path)
    out = history_command(tmp_path)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 1 and out.stdout == "", out
    assert len(lines) == 1 and "damaged" in lines[0] and "quick check" in lines[0], lines
    assert files(tmp_path) == before
    again = history(tmp_path)  # where `run` moves the same file aside, by the same check
    assert again.store.resets == {"corrupt": 1}
    again.stop()


FULL_DISK = textwrap.dedent("""
    import json, os, resource, signal, sys
    sys.path.insert(0, {repo!r})
    from tests.test_history_store import history, add_xid, GPU
    d = sys.argv[1]
    h = history(__import__("pathlib").Path(d))
    for i in range(50):
        add_xid(h, 1_789_990_000.0 + 400 * i)
    assert h.flush()
    size = sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG, as a full disk's ENOSPC
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, resource.RLIM_INFINITY))
    for i in range(2000):
        add_xid(h, 1_790_000_000.0 + 400 * i, code=31)
    ok = h.flush()
    failures = h.writer.write_failures
    problems = h.problems()
    resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    later = h.flush()
    h.stop()
    print(json.dumps({{"ok": ok, "failures": failures, "later": later, "problems": problems}}))
""")


def test_a_full_disk_keeps_serving_counts_failures_and_loses_nothing_stored(tmp_path):
    script = tmp_path / "full.py"
    script.write_text(FULL_DISK.format(repo=str(REPO)))
    out = subprocess.run([sys.executable, str(script), str(tmp_path / "state")],
                         capture_output=True, text=True, timeout=120, cwd=REPO)
    assert out.returncode == 0, out.stderr
    import json

    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["ok"] is False and got["failures"] >= 1 and got["later"] is True
    assert any("writes to" in p for p in got["problems"])
    rows = stored(tmp_path / "state")
    assert sum(1 for r in rows if r[1] == 13) == 50  # what was stored before: all there
    assert sum(1 for r in rows if r[1] == 31) == 2000  # what waited in memory: written later
    db = sqlite3.connect(tmp_path / "state" / FILE)
    assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    db.close()


WRITER = textwrap.dedent("""
    import sys
    sys.path.insert(0, {repo!r})
    from pathlib import Path
    from tests.test_history_store import history, add_xid
    h = history(Path(sys.argv[1]))
    i = 0
    while True:
        for _ in range(20):
            add_xid(h, 1_780_000_000.0 + 400 * i)
            i += 1
        h.flush()
        print(i, flush=True)  # episodes committed so far
""")


def test_kill_9_during_writes_loses_at_most_the_last_batch_and_stays_readable(tmp_path):
    script = tmp_path / "writer.py"
    script.write_text(WRITER.format(repo=str(REPO)))
    proc = subprocess.Popen([sys.executable, str(script), str(tmp_path / "state")],
                            stdout=subprocess.PIPE, text=True, cwd=REPO)
    committed = []
    try:
        wait_for(lambda: committed.append(int(proc.stdout.readline() or 0)) or
                 committed[-1] >= 400, timeout=60, interval=0)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    committed += [int(line) for line in proc.stdout.read().split()]  # printed before the kill
    h = history(tmp_path / "state")  # the lock died with the process
    assert h.store.resets == {}
    count = int(h.xids[(GPU, 13)][0])
    # every batch it said was committed is there; at most the one in flight is not
    assert committed[-1] <= count <= committed[-1] + 20
    assert len(stored(tmp_path / "state")) == count
    h.stop()


def test_years_of_events_stay_within_the_bound(tmp_path):
    """Three years of an XID every 10 minutes on each of 2 GPUs (315,000 occurrences,
    each its own episode) plus a link flap an hour: the file stays under its bound."""
    h = history(tmp_path)
    start = 1_790_000_000.0 - 3 * 365 * 86_400
    gpus = [(f"16522210{i:05d}", f"GPU-{i}") for i in range(2)]
    t = start
    step = 600.0
    while t < 1_790_000_000.0:
        with h.lock:
            for gpu in gpus:
                h._xid(gpu, 31, t, 1)
            if int(t) % 3600 < step:
                h._occurred(NODE, "ib_link_down", t, detail="mlx5_0/1")
        t += step
        if len(h.writer.batch.episodes) > 20_000:
            assert h.flush()
            h.forget_old(t)
    assert h.flush()
    h.stop()
    db = sqlite3.connect(tmp_path / FILE)
    episodes = db.execute("SELECT count(*) FROM episodes").fetchone()[0]
    db.close()
    size = sum(p.stat().st_size for p in tmp_path.iterdir() if p.name.startswith(FILE))
    assert episodes <= MAX_EPISODES + PRUNE_EPISODES  # kept hourly, and each 5,000
    assert size <= BOUND_BYTES, size
    again = history(tmp_path)
    db = sqlite3.connect(tmp_path / FILE)
    assert db.execute("SELECT count(*) FROM episodes").fetchone()[0] <= MAX_EPISODES  # at open
    db.close()
    assert again.xids[(gpus[0], 31)][0] == pytest.approx(3 * 365 * 144, abs=2)  # counts stay
    again.stop()


def test_the_counts_served_continue_from_the_store(tmp_path):
    h = history(tmp_path)
    snap = make_snapshot(2)
    ledger, _ = xid_sources(h, snap)
    ledger.add([Occurrence(1, 48, 1_790_000_000.0, "nvml", 2)])
    assert _stored_codes(tmp_path) == {"48": 2.0}  # written before add() returned
    h.stop()
    again = history(tmp_path)
    ledger, _ = xid_sources(again, snap)
    assert ledger.seen()[(1, 48)] == XidRecord(2, 1_790_000_000.0)  # handed at start
    ledger.add([Occurrence(1, 48, 1_790_000_100.0, "nvml")])
    assert ledger.seen()[(1, 48)] == XidRecord(3, 1_790_000_100.0)
    again.stop()


def _stored_codes(directory) -> dict[str, float]:
    db = sqlite3.connect(directory / FILE)
    try:
        return dict(db.execute("SELECT key, value FROM counters WHERE name = 'xid'"))
    finally:
        db.close()


def test_episode_windows_per_gpu_and_node_only_for_kinds_seen_in_28_days(tmp_path):
    from exporter.history.families import history_families

    now = 1_790_000_000.0
    h = history(tmp_path)
    h.observe(make_snapshot(2))  # GPUs 0 and 1: serial "", UUID GPU-0000000N
    gpu1 = ("", "GPU-00000001")
    with h.lock:
        h._xid(gpu1, 79, now - 2 * 86_400, 1)
        h._xid(gpu1, 79, now - 3600, 1)
        h._occurred(gpu1, "ecc_dbe", now - 30 * 86_400)  # past the longest window
        h._occurred(NODE, "ib_link_down", now - 60, detail="mlx5_0/1")
    got = {f.name: f for f in history_families(h, now)}
    per_gpu = {(s.labels["gpu"], s.labels["kind"], s.labels["window"]): s.value
               for s in got["gpu_episodes"].samples}
    assert per_gpu == {("1", "xid", "1d"): 1, ("1", "xid", "7d"): 2, ("1", "xid", "28d"): 2}
    node = {(s.labels["kind"], s.labels["window"]): s.value
            for s in got["gpu_node_episodes"].samples}
    assert node == {("xid", "1d"): 1, ("xid", "7d"): 2, ("xid", "28d"): 2,
                    ("ib_link_down", "1d"): 1, ("ib_link_down", "7d"): 1,
                    ("ib_link_down", "28d"): 1}
    assert got["gpu_node_history_start_timestamp_seconds"].samples[0].value == now
    h.stop()


def test_gpus_first_and_last_seen_boots_and_driver_versions(tmp_path):
    import dataclasses

    now = [1_790_000_000.0]
    h = history(tmp_path, now=lambda: now[0])
    snap = make_snapshot(2, time=now[0], driver_version="580.159")
    h.observe(snap)
    later = dataclasses.replace(snap, time=now[0] + 7200)
    h.observe(later)  # same identities, two hours on: last seen written once
    h.flush()
    h.stop()
    db = sqlite3.connect(tmp_path / FILE)
    gpus = db.execute("SELECT uuid, slot, first_seen, last_seen FROM gpus ORDER BY uuid").fetchall()
    boots = db.execute("SELECT uuid, driver FROM boots ORDER BY uuid").fetchall()
    db.close()
    assert gpus == [("GPU-00000000", "0000:00:00", now[0], now[0] + 7200),
                    ("GPU-00000001", "0000:01:00", now[0], now[0] + 7200)]
    assert boots == [("GPU-00000000", "580.159"), ("GPU-00000001", "580.159")]


def test_each_commit_is_synced_so_a_power_loss_loses_at_most_the_last_batch(tmp_path):
    """In WAL mode synchronous=NORMAL syncs only at checkpoints: a power loss may take
    every commit since the last one. FULL syncs the log at each commit."""
    store = Store(tmp_path)
    store.open()
    try:
        assert store.db.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
        assert store.db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    finally:
        store.close()


def test_a_burst_of_xids_is_counted_whole_in_one_episode(tmp_path):
    h = history(tmp_path)
    ledger, _ = xid_sources(h, make_snapshot(1))
    ledger.add([Occurrence(0, 13, 1_790_000_000.0, "nvml", 2)])
    ledger.add([Occurrence(0, 13, 1_790_000_010.0, "nvml", 5_000)])
    assert ledger.seen()[(0, 13)].count == 5_002
    assert [(e.kind, e.xid, e.count) for e in h.recent] == [("xid", 13, 5_002)]
    h.stop()
    again = history(tmp_path)
    assert again.xids[(("", "GPU-00000000"), 13)][0] == 5_002
    again.stop()


def test_a_burst_counts_once_what_the_kernel_log_saw_of_it(tmp_path):
    h = history(tmp_path)
    ledger, _ = xid_sources(h, make_snapshot(1))
    gpu = ("", "GPU-00000000")
    for i in range(3):  # the log's lines came first
        ledger.add([Occurrence(0, 31, 1_790_000_000.0 + i, "kmsg", slot="0000:00:00")])
    ledger.add([Occurrence(0, 31, 1_790_000_005.0, "nvml", 2_000)])
    assert h.xids[(gpu, 31)][0] == 2_000 and ledger.duplicates == 3
    ledger.add([Occurrence(0, 31, 1_790_000_006.0, "kmsg", slot="0000:00:00")])  # one more
    assert h.xids[(gpu, 31)][0] == 2_000 and ledger.duplicates == 4
    assert ledger.seen()[(0, 31)].count == 2_000
    h.stop()


def test_without_a_boot_id_the_log_is_read_from_the_start_of_the_process(tmp_path, caplog):
    """No boot id: no cursor can be stored, so the log is read from its end at each start,
    never again from its oldest record (which would count its XIDs once more)."""
    log = tmp_path / "kmsg"
    log.write_text("3,1,1000000,-;NVRM: Xid (PCI:0000:00:00): 13, pid=1, name=x, old\n")

    def start():
        store = Store(tmp_path / "state", lambda: 1_790_000_000.0)
        store.open()
        h = History(store, "node-a", clock=lambda: 1_790_000_000.0,
                    boot_id_path=str(tmp_path / "no-boot-id"))
        h.load()
        _, follower = xid_sources(h, make_snapshot(1), str(log))
        follower.tick()
        return h, follower

    with caplog.at_level(logging.INFO):
        h, follower = start()
    assert h.xids == {}
    assert any("read from its end (no boot id" in r.getMessage() for r in caplog.records)
    with open(log, "a") as f:
        f.write("3,2,2000000,-;NVRM: Xid (PCI:0000:00:00): 31, pid=1, name=x, new\n")
    follower.tick()
    assert {code: n for (_, code), (n, _) in h.xids.items()} == {31: 1}
    assert any("boot id" in p for p in h.problems())
    follower.finish()
    h.stop()
    again, follower = start()
    assert {code: n for (_, code), (n, _) in again.xids.items()} == {31: 1}
    follower.finish()
    again.stop()


def test_the_bounds_are_kept_at_open_and_hourly_not_in_every_transaction(tmp_path):
    now = [1_790_000_000.0]
    h = history(tmp_path, now=lambda: now[0])
    statements: list[str] = []
    h.store.db.set_trace_callback(statements.append)
    for minute in range(3):
        add_xid(h, now[0] + 60 * minute)
        assert h.flush()
    assert [s for s in statements if s.startswith("DELETE")] == []
    now[0] += 3600
    add_xid(h, now[0])
    assert h.flush()
    assert any(s.startswith("DELETE FROM episodes") for s in statements)
    h.stop()
    store = Store(tmp_path, lambda: now[0])
    store.open()  # and at open, before the first write
    try:
        assert store.db.execute("SELECT count(*) FROM episodes").fetchone()[0] == 2
        assert store.pruned == now[0]
    finally:
        store.close()


def test_the_three_newest_bad_files_are_kept(tmp_path):
    for i in range(5):
        (tmp_path / FILE).write_bytes(b"SQLite format 3\x00" + os.urandom(4096))
        store = Store(tmp_path, lambda i=i: 1_790_000_000.0 + 60 * i)
        store.open()
        store.close()
        os.utime(tmp_path / f"{FILE}.corrupt-{time_stamp(1_790_000_000.0 + 60 * i)}",
                 (1_790_000_000.0 + 60 * i,) * 2)
    aside = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(f"{FILE}."))
    assert aside == [f"{FILE}.corrupt-{time_stamp(1_790_000_000.0 + 60 * i)}"
                     for i in (2, 3, 4)]


def time_stamp(t: float) -> str:
    import time

    return time.strftime("%Y%m%dT%H%M%S", time.gmtime(t))


@pytest.mark.parametrize("flag", ["--since", "--until"])
@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "yesterday"])
def test_the_history_command_refuses_a_time_that_is_no_number(tmp_path, flag, value):
    result = subprocess.run([sys.executable, "-m", "exporter", "history", "--storage.path",
                             str(tmp_path), f"{flag}={value}"], capture_output=True, text=True,
                            cwd=REPO, timeout=60)
    assert result.returncode == 2 and value in result.stderr and not result.stdout
