"""The history's metric families: episode counts in windows, when the history begins,
GPU replacements, and the store's own figures.

A kind's `gpu_episodes` / `gpu_node_episodes` series are written only while it has an
episode within 28 days (so the series stay few); an absent series means 0.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

from prometheus_client.metrics_core import Metric

from exporter.families import MINIMAL, Family
from exporter.health.faults import xid_judgement
from exporter.history.episodes import NODE
from exporter.history.recorder import KEEP_SECONDS, WINDOW_SECONDS, History
from exporter.history.writer import MAX_PENDING_EPISODES, REFUSED_REASONS

_KEPT = " (present only when a state directory is kept)"

GPU_EPISODES = Family(
    "gpu_episodes", "gauge",
    "Fault episodes of the GPU that started within the window (1d, 7d, 28d), by kind; from "
    "the node's stored history, so past restarts and Prometheus' retention. Absent: 0.",
    ("gpu", "uuid", "kind", "window"), source="state directory", profile=MINIMAL,
    doc="Fault episodes of the GPU that started within the window (`1d`, `7d`, `28d`), by "
        "kind: history past restarts and Prometheus' retention. (present only when a state "
        "directory is kept and the GPU had an episode in 28 days)")
NODE_EPISODES = Family(
    "gpu_node_episodes", "gauge",
    "Fault episodes on the node (its GPUs' and its own: InfiniBand ports, ...) that started "
    "within the window, by kind. Absent: 0.", ("kind", "window"), source="state directory",
    profile=MINIMAL,
    doc="Fault episodes on the node that started within the window: its GPUs' (also GPUs "
        "since replaced) and its own kinds (`ib_link_down`, `ib_degraded`, ...). (present "
        "only when a state directory is kept and the node had an episode in 28 days)")
XID_EPISODES = Family(
    "gpu_xid_episodes", "gauge",
    "XID episodes of the GPU that started within the window (1d, 7d, 28d), by the action "
    "the XID table asks for (the lemon score counts reset_gpu, reboot_node and "
    "drain_and_service). Absent: 0.", ("gpu", "uuid", "action", "window"),
    source="state directory", profile=MINIMAL,
    doc="The `xid` episodes of `gpu_episodes` by the action the XID table "
        "(docs/health.md) asks for: `none`, `restart_application`, `reset_gpu`, "
        "`reboot_node`, `drain_and_service`; the lemon score's rules count the last three. "
        "(present only when a state directory is kept and the GPU had an XID in 28 days)")
NODE_XID_EPISODES = Family(
    "gpu_node_xid_episodes", "gauge",
    "XID episodes on the node that started within the window, by the action the XID table "
    "asks for. Absent: 0.", ("action", "window"), source="state directory", profile=MINIMAL,
    doc="The node's `xid` episodes (its GPUs', also GPUs since replaced) by the action the "
        "XID table asks for, as `gpu_xid_episodes`. (present only when a state directory is "
        "kept and the node had an XID in 28 days)")
HISTORY_START = Family(
    "gpu_node_history_start_timestamp_seconds", "gauge",
    "When the node's stored history begins (the state directory was first used): the time "
    "its episode counts are exposed over.", unit="s", source="state directory",
    profile=MINIMAL,
    doc="When the node's stored history begins (the state directory was first used): the "
        "time its episodes are counted over, the exposure." + _KEPT)
REPLACEMENTS = Family(
    "gpu_node_gpu_replacements_total", "counter",
    "GPUs found replaced in their slot (another serial number at the same PCI address).",
    source="state directory",
    doc="GPUs found replaced in their slot: another serial number at the same PCI address; "
        "continues across restarts." + _KEPT)
TRANSACTIONS = Family(
    "cte_history_transactions_total", "counter",
    "Transactions written to the state directory's store.", source="state directory",
    doc="Transactions written (at most one every 5 s, none when nothing happened)." + _KEPT)
WRITE_FAILURES = Family(
    "cte_history_write_failures_total", "counter",
    "Writes to the store that failed (a full or read-only disk); what they held is kept in "
    "memory and written later.", source="state directory",
    doc="Writes that failed (a full or read-only disk); what they held stays in memory and "
        "is written once a write succeeds." + _KEPT)
DROPPED = Family(
    "cte_history_dropped_episodes_total", "counter",
    "Episodes dropped from memory while writes kept failing.", source="state directory",
    doc=f"Episodes dropped from memory while writes kept failing (past "
        f"{MAX_PENDING_EPISODES:,} waiting)."
        + _KEPT)
RESETS = Family(
    "cte_history_state_resets_total", "counter",
    "Store files moved aside at start (corrupt, unreadable, or from the future), each "
    "replaced by a fresh one.", ("reason",), source="state directory",
    doc="Store files moved aside at start and replaced by a fresh one: `corrupt`, "
        "`unreadable`, `future` (a newer schema, or dated more than a day ahead)." + _KEPT)
REFUSED = Family(
    "cte_history_refused_records_total", "counter",
    "Records refused alone, neither stored nor served (the rest of their batch is), by "
    "reason: an XID code outside NVML's range, a kernel-log XID for a PCI slot not on this "
    "node, a row the store cannot hold.", ("reason",), source="state directory",
    doc="Records refused alone, each named in a log line; the batch around them is written: "
        "`xid_code` (an XID code outside NVML's 1-999), `not_on_this_node` (a kernel-log "
        "XID for a PCI slot where the node never had a GPU), `unstorable` (a value the "
        "store cannot hold)." + _KEPT)
DECLARED = (GPU_EPISODES, NODE_EPISODES, XID_EPISODES, NODE_XID_EPISODES, HISTORY_START,
            REPLACEMENTS, TRANSACTIONS, WRITE_FAILURES, DROPPED, RESETS, REFUSED)


def history_families(history: History, now: float) -> Iterator[Metric]:
    episodes = history.episodes_since(now - KEEP_SECONDS)
    gpu = GPU_EPISODES.gauge()
    node = NODE_EPISODES.gauge()
    xid_gpu = XID_EPISODES.gauge()
    xid_node = NODE_XID_EPISODES.gauge()
    per_gpu: Counter = Counter()
    per_node: Counter = Counter()
    for e in episodes:
        age = now - e.start
        # an XID also by its action (the fault table's), which its kind does not carry
        groups = [e.kind] + ([f"xid:{xid_judgement(e.xid).action}"] if e.kind == "xid"
                             and e.xid is not None else [])
        for window, seconds in WINDOW_SECONDS.items():
            inside = age <= seconds
            for group in groups:
                per_node[(group, window)] += inside
                if e.gpu != NODE:
                    per_gpu[(e.gpu, group, window)] += inside
    for (key, group, window), count in sorted(per_gpu.items()):
        index = history.gpus.index_of.get(key)
        if index is not None:
            family, what = (xid_gpu, group[4:]) if group.startswith("xid:") else (gpu, group)
            family.add_metric([str(index), key[1], what, window], count)
    for (group, window), count in sorted(per_node.items()):
        family, what = (xid_node, group[4:]) if group.startswith("xid:") else (node, group)
        family.add_metric([what, window], count)
    yield gpu
    yield node
    yield xid_gpu
    yield xid_node
    stats = history.stats()
    yield HISTORY_START.gauge(stats.created)
    yield REPLACEMENTS.counter(stats.replacements)
    yield TRANSACTIONS.counter(stats.transactions)
    yield WRITE_FAILURES.counter(stats.write_failures)
    yield DROPPED.counter(stats.dropped)
    yield RESETS.by_label({r: stats.resets.get(r, 0) for r in ("corrupt", "unreadable", "future")})
    yield REFUSED.by_label({r: stats.refused.get(r, 0) for r in REFUSED_REASONS})
