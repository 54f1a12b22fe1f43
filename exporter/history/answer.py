"""`/api/v1/history` and the `history` command's lines: stored episodes with those not
written yet, in time bounds, for one GPU or the node."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from typing import TYPE_CHECKING

from exporter.events import Event
from exporter.history.episodes import NODE, Episode
from exporter.history.recorder import History
from exporter.history.store import INT64, query_episodes, read_only, stored_gpus, stored_node
from exporter.lazy import lazy_module

if TYPE_CHECKING:
    import sqlite3
else:  # loaded on first use: with no state directory (--fake) never
    sqlite3 = lazy_module("sqlite3")

DEFAULT_PAGE = 1_000  # episodes in one answer unless `limit` says otherwise
MAX_PAGE = 10_000


def gpu_filter(history: History, gpu: str | None) -> str | None:
    """A GPU's UUID for `gpu` (an index, a UUID or a serial), "" for "node" (the node's own
    episodes), None for all. One rule for any other value, a number or not: ValueError
    unless it names a GPU on the node or stored."""
    if gpu is None:
        return None
    if gpu == "node":
        return ""
    if gpu.isascii() and gpu.isdigit() and len(gpu) <= 4:
        key = history.gpus.key_of.get(int(gpu))
        if key is not None:
            return key[1]
    # NVIDIA's serial numbers are all digits too (1652221000005)
    if gpu not in _known(history):
        raise ValueError(f"no GPU {gpu[:64]!r} on this node or stored (an index, a UUID, a "
                         "serial, or node)")
    return gpu


def _known(history: History) -> set[str]:
    """The UUIDs and serials of the GPUs on the node and of those stored."""
    known = {name for key in history.gpus.key_of.values() for name in key if name}
    try:
        db = read_only(history.store.directory)
        try:
            known |= {str(g[k]) for g in stored_gpus(db) for k in ("serial", "uuid") if g[k]}
        finally:
            db.close()
    except (sqlite3.Error, OSError):
        pass
    return known


def _order(e: Episode) -> tuple[float, int]:
    """An episode's place in the answer, and the cursor `after` names: its start, then its
    row id (one not written yet, negative, after none of the stored ones it ties with)."""
    return e.start, e.id if e.id is not None else -id(e)


def parse_after(text: str) -> tuple[float, int]:
    """The `after` cursor, START:ID as an answer's `next` gives it; ValueError else (also
    for an ID past the 64-bit integers SQLite holds, which it could not compare)."""
    start, sep, row = text.partition(":")
    try:
        cursor = float(start), int(row)
    except ValueError:
        cursor = None
    if (not sep or cursor is None or not math.isfinite(cursor[0])
            or not -INT64 <= cursor[1] < INT64):
        raise ValueError(f"after: expected the `next` of the previous answer, got "
                         f"{text[:40]!r}")
    return cursor


def episodes(history: History, since: float | None, until: float | None,
             gpu: str | None, after: tuple[float, int] | None = None,
             limit: int = DEFAULT_PAGE
             ) -> tuple[list[Episode], bool, list[dict[str, object]]]:
    """A page of episodes past `after`: the stored ones, updated and completed by those in
    memory; whether more follow; and the stored GPUs."""
    gpus: list[dict[str, object]] = []
    try:
        db = read_only(history.store.directory)
        try:
            found = {e.id: e for e in query_episodes(db, since, until, gpu, after, limit + 1)}
            gpus = stored_gpus(db)
        finally:
            db.close()
    except (sqlite3.Error, OSError):
        found = {}
    for e in history.episodes_since(since if since is not None else 0.0):
        if until is not None and e.start >= until:
            continue
        if gpu is not None and (gpu != "" and gpu not in e.gpu or gpu == "" and e.gpu != NODE):
            continue
        if after is not None and _order(e) <= after:
            continue
        found[_order(e)[1]] = e
    ordered = sorted(found.values(), key=_order)
    return ordered[:limit], len(ordered) > limit, gpus


def history_body(history: History, since: float | None, until: float | None,
                 gpu: str | None, after: str | None = None,
                 limit: int = DEFAULT_PAGE) -> bytes:
    uuid = gpu_filter(history, gpu)
    cursor = parse_after(after) if after else None
    stats = history.stats()
    rows = []
    found, more, gpus = episodes(history, since, until, uuid, cursor, limit)
    for e in found:
        row: dict[str, object] = {"time": e.start, "end": e.end, "count": e.count,
                                  "kind": e.kind}
        if e.xid is not None:
            row["xid"] = e.xid
        if e.gpu != NODE:
            row["gpu"] = history.gpus.index_of.get(e.gpu)
            row["uuid"], row["serial"] = e.gpu[1], e.gpu[0]
        if e.detail:
            row["detail"] = e.detail
        rows.append(row)
    last = _order(found[-1]) if found and more else None
    replacements = [{"time": r.time, "slot": r.slot,
                     "old": {"serial": r.old[0], "uuid": r.old[1]},
                     "new": {"serial": r.new[0], "uuid": r.new[1]}}
                    for r in history.gpus.replacements
                    if (since is None or r.time >= since) and (until is None or r.time < until)]
    return json.dumps({"node": history.node, "history_start": stats.created,
                       "since": since, "until": until, "gpu": gpu, "limit": limit,
                       "after": after, "episodes": rows,
                       "next": f"{last[0]!r}:{last[1]}" if last else None,
                       "replacements": replacements, "gpus": gpus}).encode()


REPLACEMENT_FINDING_SECONDS = 7 * 86_400.0


def replacement_findings(history: History, now: float) -> list[dict[str, object]]:
    """The live page's findings: each GPU replaced in its slot in the past week."""
    out: list[dict[str, object]] = []
    for r in history.gpus.replacements:
        if now - r.time > REPLACEMENT_FINDING_SECONDS:
            continue
        gpu = history.gpus.index_of.get(r.new)
        out.append({"kind": "gpu_replaced", "severity": "info", "gpu": gpu, "time": r.time,
                    "since": None,
                    "message": f"GPU {gpu if gpu is not None else '?'} in slot {r.slot} was "
                               f"replaced: serial {r.old[0] or '?'} is now {r.new[0] or '?'} "
                               "(the old GPU's history is kept under its serial)",
                    "details": {"slot": r.slot, "old_serial": r.old[0], "old_uuid": r.old[1],
                                "new_serial": r.new[0], "new_uuid": r.new[1]}})
    return out


def jsonl_lines(directory: str, since: float | None = None, until: float | None = None,
                gpu: str | None = None) -> Iterator[str]:
    """The stored episodes as the fault-event JSON lines (exporter/events.py), one an
    episode at its start, once SQLite's quick check passed. Raises sqlite3.Error, OSError,
    DamagedStore."""
    db = read_only(directory, check=True)
    try:
        node = stored_node(db) or "unknown"
        for e in query_episodes(db, since, until, gpu):
            yield Event(e.start, node, e.kind, e.gpu[1] or None if e.gpu != NODE else None,
                        e.xid if e.kind == "xid" else None).to_json()
    finally:
        db.close()
