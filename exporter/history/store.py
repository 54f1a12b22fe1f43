"""The state directory's one store: sqlite3 in WAL mode, one file, written in batches.

Bounds (the file stays under about 16 MiB): at most MAX_EPISODES episodes (the oldest
go first), MAX_GPUS GPUs with their counters and boots (the longest unseen go first),
MAX_BOOTS boots, MAX_CURSORS kernel-log cursors, MAX_REPLACEMENTS replacements.
A bad file (corrupt, unreadable, or written by a newer version) is moved aside and the
store starts fresh; a file that cannot be opened for another reason (locked, an I/O
error, a full disk) is left alone and open() raises StoreError; a second process on the
same directory is refused (`StoreBusy`). A reader (`read_only`) never writes the file nor
creates one beside it, and may check it as a start does (`DamagedStore`).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import math
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from exporter.history.episodes import GAP_SECONDS, STICKY_GAP_SECONDS, Episode, GpuKey
from exporter.lazy import lazy_module

if TYPE_CHECKING:
    import sqlite3
else:  # loaded on first use: with no state directory (--fake) never
    sqlite3 = lazy_module("sqlite3")

log = logging.getLogger(__name__)

FILE = "history.sqlite3"
LOCK = "lock"
SCHEMA = 1
MAX_EPISODES = 50_000
MAX_GPUS = 256
MAX_BOOTS = 4_096
MAX_CURSORS = 64
MAX_REPLACEMENTS = 1_024
# The bounds are kept at open, hourly, and after each PRUNE_EPISODES new episodes (a flood
# in one hour stays within MAX_EPISODES + PRUNE_EPISODES); not in every 5-s transaction.
PRUNE_SECONDS = 3600.0
PRUNE_EPISODES = 5_000
MAX_ASIDE = 3  # moved-aside bad files kept (each with its -wal and -shm)
BOUND_BYTES = 16 * 1024 * 1024  # what the limits above keep the file under (tested)
MAX_TEXT = 4096  # characters in one stored text (a slot, a port, a UUID are far shorter)
INT64 = 2**63  # SQLite's integers: -INT64 to INT64 - 1

_TABLES = """
CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS gpus(serial TEXT NOT NULL, uuid TEXT NOT NULL, slot TEXT NOT NULL,
  first_seen REAL NOT NULL, last_seen REAL NOT NULL, PRIMARY KEY(serial, uuid));
CREATE TABLE IF NOT EXISTS boots(serial TEXT NOT NULL, uuid TEXT NOT NULL, boot_id TEXT NOT NULL,
  driver TEXT NOT NULL, first_seen REAL NOT NULL, PRIMARY KEY(serial, uuid, boot_id, driver));
CREATE TABLE IF NOT EXISTS episodes(id INTEGER PRIMARY KEY, serial TEXT NOT NULL,
  uuid TEXT NOT NULL, kind TEXT NOT NULL, xid INTEGER, detail TEXT NOT NULL,
  start REAL NOT NULL, end REAL NOT NULL, count INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS episodes_start ON episodes(start);
CREATE TABLE IF NOT EXISTS counters(serial TEXT NOT NULL, uuid TEXT NOT NULL, name TEXT NOT NULL,
  key TEXT NOT NULL, value REAL NOT NULL, last REAL NOT NULL,
  PRIMARY KEY(serial, uuid, name, key));
CREATE TABLE IF NOT EXISTS cursors(boot_id TEXT PRIMARY KEY, sequence INTEGER NOT NULL,
  time REAL NOT NULL);
CREATE TABLE IF NOT EXISTS slots(slot TEXT PRIMARY KEY, serial TEXT NOT NULL, uuid TEXT NOT NULL,
  since REAL NOT NULL);
CREATE TABLE IF NOT EXISTS replacements(id INTEGER PRIMARY KEY, time REAL NOT NULL,
  slot TEXT NOT NULL, old_serial TEXT NOT NULL, old_uuid TEXT NOT NULL,
  new_serial TEXT NOT NULL, new_uuid TEXT NOT NULL);
"""


class StoreBusy(RuntimeError):
    """Another process holds the state directory."""


class StoreError(RuntimeError):
    """The state directory cannot be used now (not creatable, the file locked or failing
    to read): the exporter runs without a history and leaves the file as it is."""


@dataclass(frozen=True)
class Replacement:
    time: float
    slot: str
    old: GpuKey
    new: GpuKey


@dataclass
class Batch:
    """Everything one transaction writes."""

    episodes: dict[int, Episode] = field(default_factory=dict)  # by id(): new or extended
    counters: dict[tuple[str, str, str, str], tuple[float, float]] = field(default_factory=dict)
    gpus: dict[GpuKey, tuple[str, float, float]] = field(default_factory=dict)  # slot, first, last
    boots: set[tuple[str, str, str, str, float]] = field(default_factory=set)
    cursors: dict[str, tuple[int, float]] = field(default_factory=dict)
    slots: dict[str, tuple[str, str, float]] = field(default_factory=dict)
    replacements: list[Replacement] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.episodes or self.counters or self.gpus or self.boots or self.cursors
                    or self.slots or self.replacements)

    def take_unstorable(self) -> list[str]:
        """Remove the rows SQLite would refuse (an integer past 64 bits, a NaN or infinite
        number, an absurdly long or unencodable text), each named; the rest is written."""
        out: list[str] = []
        for key, e in list(self.episodes.items()):
            if not storable((*e.gpu, e.kind, e.xid, e.detail, e.start, e.end, e.count)):
                del self.episodes[key]
                out.append(f"episode {e.kind} {e.xid if e.xid is not None else ''} of "
                           f"{e.gpu[1] or 'the node'} at {e.start!r}")
        rows: tuple[tuple[str, dict, Callable[[Any, Any], tuple]], ...] = (
            ("counter", self.counters, lambda k, v: (*k, *v)),
            ("GPU", self.gpus, lambda k, v: (*k, *v)),
            ("cursor", self.cursors, lambda k, v: (k, *v)),
            ("slot", self.slots, lambda k, v: (k, *v)))
        for name, table, row in rows:
            for key, value in list(table.items()):
                if not storable(row(key, value)):
                    del table[key]
                    out.append(f"{name} {_shown(row(key, value))}")
        for boot in [b for b in self.boots if not storable(b)]:
            self.boots.discard(boot)
            out.append(f"boot {_shown(boot)}")
        for r in [r for r in self.replacements if not storable((r.time, r.slot, *r.old,
                                                                *r.new))]:
            self.replacements.remove(r)
            out.append(f"replacement in slot {_shown((r.slot,))} at {r.time!r}")
        return out

    def absorb(self, older: Batch) -> None:
        """Take a failed batch back in, under this newer one."""
        self.episodes = {**older.episodes, **self.episodes}
        # the newer value of a key wins
        self.counters = {**older.counters, **self.counters}
        self.gpus = {**older.gpus, **self.gpus}
        self.cursors = {**older.cursors, **self.cursors}
        self.slots = {**older.slots, **self.slots}
        self.boots |= older.boots
        self.replacements[:0] = older.replacements


@dataclass
class Loaded:
    """What a start needs from the store."""

    created: float
    counters: dict[tuple[str, str, str, str], tuple[float, float]]
    episodes: list[Episode]  # those that started within `since`, or may still merge
    slots: dict[str, tuple[str, str, float]]
    cursors: dict[str, tuple[int, float]]  # boot id -> (sequence, when it was stored)
    replacements: list[Replacement]


def storable(values: tuple) -> bool:
    """Whether SQLite takes each value as it is: None, an integer in 64 bits, a finite
    number, a text of at most MAX_TEXT characters that UTF-8 can encode."""
    for v in values:
        if v is None or isinstance(v, bool):
            continue
        if isinstance(v, int):
            if not -INT64 <= v < INT64:
                return False
        elif isinstance(v, float):
            if not math.isfinite(v):
                return False
        elif isinstance(v, str):
            if len(v) > MAX_TEXT or not _encodable(v):
                return False
        else:
            return False
    return True


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _shown(values: tuple) -> str:
    """A refused row in a log line: each value cut short."""
    return " ".join(repr(v)[:40] for v in values)


def _episode(row: tuple) -> Episode:
    id_, serial, uuid, kind, xid, detail, start, end, count = row
    return Episode((serial, uuid), kind, xid, detail, start, end, count, id_)


class Store:
    def __init__(self, directory: str | Path, now=time.time):
        self.directory = Path(directory)
        self.path = self.directory / FILE
        self.now = now
        self.resets: dict[str, int] = {}  # bad files moved aside at open, by reason
        self.db: sqlite3.Connection | None = None
        self._lock_fd: int | None = None
        self.pruned = 0.0  # when the bounds were last kept
        self._new_since_pruned = 0  # episodes inserted since

    # -- opening ----------------------------------------------------------------
    def open(self) -> None:
        """Lock the directory, then open (or start afresh) the file. Raises StoreBusy or
        StoreError."""
        try:
            self.directory.mkdir(parents=True, exist_ok=True, mode=0o750)
        except OSError as exc:
            raise StoreError(f"cannot create {self.directory}: {exc.strerror or exc}") from None
        self._lock()
        try:
            self.db = self._connect()
        except sqlite3.Error as exc:
            self.close()
            raise StoreError(f"cannot open {self.path}: {exc}") from None
        try:  # a full disk may refuse it: the next write's prune tries again
            self.db.execute("BEGIN IMMEDIATE")
            self._prune(self.db)
            self.db.execute("COMMIT")
            self.pruned = self.now()
        except sqlite3.Error as exc:
            log.warning("history: keeping the store's bounds failed (%s)", exc)
            with contextlib.suppress(sqlite3.Error):
                self.db.execute("ROLLBACK")

    def _lock(self) -> None:
        path = self.directory / LOCK
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o640)
        except OSError as exc:
            raise StoreError(f"cannot open {path}: {exc.strerror or exc}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise StoreBusy(f"state directory {self.directory} is in use by another exporter "
                            f"(pid {holder}); give each its own --storage.path") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._lock_fd = fd

    def _connect(self) -> sqlite3.Connection:
        problem = self._check()
        if problem is not None:
            self._move_aside(problem)
        db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        db.execute("PRAGMA journal_mode=WAL")
        # FULL: each commit syncs the write-ahead log, so a power loss loses at most the
        # transaction in flight (NORMAL syncs only at checkpoints: a power loss could roll
        # back every commit since the last one). The recorder commits at most every 5 s.
        db.execute("PRAGMA synchronous=FULL")
        db.execute("PRAGMA journal_size_limit=4194304")
        db.executescript(_TABLES)
        db.execute(f"PRAGMA user_version={SCHEMA}")
        now = self.now()
        db.execute("INSERT OR IGNORE INTO meta VALUES('created', ?)", (repr(now),))
        return db

    def _check(self) -> str | None:
        """Why the file cannot be used ('corrupt', 'unreadable', 'future'), or None. Any
        other error (locked, an I/O error, a full disk) raises sqlite3.Error: the file may
        well be good, so it stays where it is and open() fails (StoreError)."""
        if not self.path.exists():
            return None
        try:
            with open(self.path, "rb") as f:
                f.read(100)
            db = sqlite3.connect(f"file:{self.path}?mode=rw", uri=True, isolation_level=None)
            try:
                problem = file_problem(db)
                row = db.execute("SELECT value FROM meta WHERE key='created'").fetchone() \
                    if problem is None and db.execute("PRAGMA user_version").fetchone()[0] \
                    else None
                if row is not None and float(row[0]) > self.now() + 86_400:
                    # this clock (or the one that wrote it) is wrong, not the file
                    log.warning("history: %s says it was created at %s, more than a day "
                                "after now (%s): is the clock right?", self.path,
                                _utc(float(row[0])), _utc(self.now()))
            finally:
                db.close()
        except OSError:  # PermissionError among them
            return "unreadable"
        return problem

    def _move_aside(self, reason: str) -> None:
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(self.now()))
        aside = self.path.with_name(f"{FILE}.{reason}-{stamp}")
        for suffix in ("", "-wal", "-shm"):
            source = Path(f"{self.path}{suffix}")
            if source.exists():
                try:
                    os.replace(source, f"{aside}{suffix}")
                except OSError:
                    source.unlink(missing_ok=True)
        # the MAX_ASIDE newest bad files, each with its -wal and -shm
        files = list(self.directory.glob(f"{FILE}.*-2*"))
        groups: dict[str, float] = {}
        for path in files:
            name = path.name.removesuffix("-wal").removesuffix("-shm")
            with contextlib.suppress(OSError):
                groups[name] = max(groups.get(name, 0.0), path.stat().st_mtime)
        gone = set(sorted(groups, key=groups.__getitem__)[:-MAX_ASIDE])
        for path in files:
            if path.name.removesuffix("-wal").removesuffix("-shm") in gone:
                path.unlink(missing_ok=True)
        self.resets[reason] = self.resets.get(reason, 0) + 1
        log.warning("history: %s was %s; moved aside to %s, starting afresh", self.path,
                    {"future": "written by a newer version"}.get(reason, reason), aside.name)

    def close(self) -> None:
        if self.db is not None:
            with contextlib.suppress(sqlite3.Error):
                self.db.close()
            self.db = None
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def set_node(self, node: str) -> None:
        """The node's name, as `history` prints it."""
        with contextlib.suppress(sqlite3.Error):
            self._db().execute("INSERT OR REPLACE INTO meta VALUES('node', ?)", (node,))

    # -- reading ----------------------------------------------------------------
    def load(self, since: float) -> Loaded:
        db = self._db()
        created = float(db.execute("SELECT value FROM meta WHERE key='created'").fetchone()[0])
        counters = {tuple(r[:4]): (r[4], r[5]) for r in db.execute(
            "SELECT serial, uuid, name, key, value, last FROM counters")}
        episodes = [_episode(r) for r in db.execute(
            "SELECT id, serial, uuid, kind, xid, detail, start, end, count FROM episodes "
            "WHERE start >= ? OR end >= ? ORDER BY start",
            (since, self.now() - max(GAP_SECONDS, STICKY_GAP_SECONDS)))]
        slots = {r[0]: (r[1], r[2], r[3]) for r in db.execute("SELECT * FROM slots")}
        cursors = {r[0]: (r[1], r[2]) for r in db.execute(
            "SELECT boot_id, sequence, time FROM cursors")}
        return Loaded(created, counters, episodes, slots, cursors, self.replacements())

    def replacements(self) -> list[Replacement]:
        return [Replacement(r[0], r[1], (r[2], r[3]), (r[4], r[5])) for r in self._db().execute(
            "SELECT time, slot, old_serial, old_uuid, new_serial, new_uuid FROM replacements "
            "ORDER BY time")]

    def _db(self) -> sqlite3.Connection:
        if self.db is None:
            raise StoreError("the store is not open")
        return self.db

    # -- writing ----------------------------------------------------------------
    def write(self, batch: Batch) -> list[str]:
        """One transaction; the rows it cannot store are taken out of the batch first and
        returned, named. On any error nothing of it is stored (raises sqlite3.Error,
        OSError) and episodes keep no row id."""
        db = self._db()
        refused = batch.take_unstorable()
        new = [e for e in batch.episodes.values() if e.id is None]
        try:
            db.execute("BEGIN IMMEDIATE")
            for e in batch.episodes.values():
                if e.id is None:
                    e.id = db.execute(
                        "INSERT INTO episodes(serial, uuid, kind, xid, detail, start, end, count)"
                        " VALUES(?,?,?,?,?,?,?,?)", (*e.gpu, e.kind, e.xid, e.detail, e.start,
                                                     e.end, e.count)).lastrowid
                else:
                    db.execute("UPDATE episodes SET end=?, count=? WHERE id=?",
                               (e.end, e.count, e.id))
            db.executemany("INSERT OR REPLACE INTO counters VALUES(?,?,?,?,?,?)",
                           [(*k, v, last) for k, (v, last) in batch.counters.items()])
            db.executemany(
                "INSERT INTO gpus VALUES(?,?,?,?,?) ON CONFLICT(serial, uuid) DO UPDATE SET "
                "slot=excluded.slot, last_seen=max(last_seen, excluded.last_seen)",
                [(*k, slot, first, last) for k, (slot, first, last) in batch.gpus.items()])
            db.executemany("INSERT OR IGNORE INTO boots VALUES(?,?,?,?,?)", sorted(batch.boots))
            db.executemany("INSERT OR REPLACE INTO cursors VALUES(?,?,?)",
                           [(b, s, t) for b, (s, t) in batch.cursors.items()])
            db.executemany("INSERT OR REPLACE INTO slots VALUES(?,?,?,?)",
                           [(k, *v) for k, v in batch.slots.items()])
            db.executemany("INSERT INTO replacements(time, slot, old_serial, old_uuid, "
                           "new_serial, new_uuid) VALUES(?,?,?,?,?,?)",
                           [(r.time, r.slot, *r.old, *r.new) for r in batch.replacements])
            due = (self.now() - self.pruned >= PRUNE_SECONDS
                   or self._new_since_pruned + len(new) >= PRUNE_EPISODES)
            if due:
                self._prune(db)
            db.execute("COMMIT")
        except BaseException:
            for e in new:
                e.id = None
            with contextlib.suppress(sqlite3.Error):
                db.execute("ROLLBACK")
            raise
        self._new_since_pruned = 0 if due else self._new_since_pruned + len(new)
        if due:
            self.pruned = self.now()
        return refused

    def _prune(self, db: sqlite3.Connection) -> None:
        """Keep the bounds (in the caller's transaction)."""
        db.execute("DELETE FROM episodes WHERE id <= (SELECT id FROM episodes ORDER BY id DESC "
                   "LIMIT 1 OFFSET ?)", (MAX_EPISODES,))
        gone = db.execute("DELETE FROM gpus WHERE rowid IN (SELECT rowid FROM gpus ORDER BY "
                          "last_seen DESC LIMIT -1 OFFSET ?)", (MAX_GPUS,)).rowcount
        for table in ("counters", "boots") if gone > 0 else ():  # the GPUs just forgotten
            db.execute(f"DELETE FROM {table} WHERE NOT EXISTS (SELECT 1 FROM gpus g WHERE "
                       f"g.serial={table}.serial AND g.uuid={table}.uuid) AND serial != ''")
        db.execute("DELETE FROM boots WHERE rowid IN (SELECT rowid FROM boots ORDER BY "
                   "first_seen DESC LIMIT -1 OFFSET ?)", (MAX_BOOTS,))
        db.execute("DELETE FROM cursors WHERE rowid IN (SELECT rowid FROM cursors ORDER BY "
                   "time DESC LIMIT -1 OFFSET ?)", (MAX_CURSORS,))
        db.execute("DELETE FROM replacements WHERE id <= (SELECT id FROM replacements ORDER BY "
                   "id DESC LIMIT 1 OFFSET ?)", (MAX_REPLACEMENTS,))


def file_problem(db: sqlite3.Connection) -> str | None:
    """Why an open store file cannot be used as it is: 'future' (a newer schema), 'corrupt'
    (SQLite says so, its quick check fails, or `created` is no number), or None. Any other
    error (locked, an I/O error) raises sqlite3.Error: it says nothing of the file."""
    try:
        version = db.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA:
            return "future"
        if db.execute("PRAGMA quick_check").fetchone()[0] != "ok":
            return "corrupt"
        row = db.execute("SELECT value FROM meta WHERE key='created'").fetchone() \
            if version else None
        if row is not None:
            float(row[0])
    except sqlite3.DatabaseError as exc:
        # the primary code (the low byte: SQLITE_CORRUPT_INDEX is still corrupt)
        if (getattr(exc, "sqlite_errorcode", 0) & 0xFF) in (sqlite3.SQLITE_CORRUPT,
                                                            sqlite3.SQLITE_NOTADB):
            return "corrupt"
        raise
    except (ValueError, TypeError):  # `created` is not a number: the quick check cannot see it
        return "corrupt"
    return None


def _utc(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


class DamagedStore(RuntimeError):
    """A reader found the store's file damaged (or written by a newer version)."""


def read_only(directory: str | Path, check: bool = False) -> sqlite3.Connection:
    """A reader's connection (the `history` command, the API): it never changes the file
    nor creates one beside it (no -wal, no -shm), and another process may be writing.
    `check`: SQLite's quick check first, as an exporter's start does (DamagedStore where it
    would move the file aside). Raises sqlite3.Error, FileNotFoundError, DamagedStore."""
    path = Path(directory) / FILE
    if not path.is_file():
        raise FileNotFoundError(f"no history in {directory} ({FILE} not found)")
    uri = f"file:{quote(str(path.absolute()))}"
    if not Path(f"{path}-wal").exists():
        # no write-ahead log, so no writer has it open (a clean stop leaves none): all is
        # in the file, read as immutable, for which SQLite creates no -wal or -shm
        db = sqlite3.connect(f"{uri}?immutable=1", uri=True)
    elif Path(f"{path}-shm").exists():
        # a writer has it open (or was killed): read through its log and the log's index
        db = sqlite3.connect(f"{uri}?mode=ro", uri=True)
    else:
        db = _recovered_copy(path)  # a log without its index, which SQLite would create
    if check:
        try:
            problem = file_problem(db)
        except BaseException:
            db.close()
            raise
        if problem is not None:
            db.close()
            raise DamagedStore(
                f"{path} is damaged (SQLite's quick check fails); an exporter starting on "
                "it moves it aside and starts afresh" if problem == "corrupt" else
                f"{path} was written by a newer version of the exporter")
    return db


def _recovered_copy(path: Path) -> sqlite3.Connection:
    """The file and its write-ahead log, copied aside and the log applied there: the result,
    in memory."""
    with tempfile.TemporaryDirectory(prefix="cte-history-") as tmp:
        copy = Path(tmp) / FILE
        shutil.copyfile(path, copy)
        shutil.copyfile(f"{path}-wal", f"{copy}-wal")
        source = sqlite3.connect(copy)
        try:
            db = sqlite3.connect(":memory:")
            source.backup(db)
        finally:
            source.close()
    return db


def query_episodes(db: sqlite3.Connection, since: float | None = None,
                   until: float | None = None, gpu: str | None = None,
                   after: tuple[float, int] | None = None,
                   limit: int | None = None) -> list[Episode]:
    """Stored episodes in [since, until), oldest first (by start, then row id). `gpu`: a
    UUID or a serial, "" for the node's own; `after`: only those past this (start, id);
    `limit`: at most this many."""
    return [_episode(r) for r in db.execute(*episode_query(since, until, gpu, after, limit))]


def stored_gpus(db: sqlite3.Connection) -> list[dict[str, object]]:
    """Every GPU the node has had: serial, UUID, slot, first and last seen, its boots and
    the driver versions it ran."""
    drivers: dict[tuple[str, str], list[str]] = {}
    boots: dict[tuple[str, str], set[str]] = {}
    for serial, uuid, boot, driver in db.execute(
            "SELECT serial, uuid, boot_id, driver FROM boots ORDER BY first_seen"):
        seen = drivers.setdefault((serial, uuid), [])
        if driver not in seen:
            seen.append(driver)
        boots.setdefault((serial, uuid), set()).add(boot)
    return [{"serial": serial, "uuid": uuid, "slot": slot, "first_seen": first,
             "last_seen": last, "boots": len(boots.get((serial, uuid), ())),
             "drivers": drivers.get((serial, uuid), [])}
            for serial, uuid, slot, first, last in db.execute(
                "SELECT serial, uuid, slot, first_seen, last_seen FROM gpus "
                "ORDER BY slot, first_seen")]


def stored_node(db: sqlite3.Connection) -> str:
    row = db.execute("SELECT value FROM meta WHERE key='node'").fetchone()
    return row[0] if row else ""


def episode_query(since: float | None, until: float | None, gpu: str | None,
                  after: tuple[float, int] | None = None, limit: int | None = None
                  ) -> tuple[str, tuple]:
    where: list[str] = []
    args: list[object] = []
    if since is not None:
        where.append("start >= ?")
        args.append(since)
    if until is not None:
        where.append("start < ?")
        args.append(until)
    if gpu is not None:
        where.append("(uuid = ? OR serial = ?)" if gpu else "serial = '' AND uuid = ''")
        args += [gpu, gpu] if gpu else []
    if after is not None:
        where.append("(start > ? OR (start = ? AND id > ?))")
        args += [after[0], after[0], after[1]]
    sql = ("SELECT id, serial, uuid, kind, xid, detail, start, end, count FROM episodes"
           + (" WHERE " + " AND ".join(where) if where else "") + " ORDER BY start, id")
    if limit is not None:
        sql += " LIMIT ?"
        args.append(limit)
    return sql, tuple(args)
