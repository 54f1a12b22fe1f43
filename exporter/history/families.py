"""The history's metric families: episode counts in windows, when the history begins,
GPU replacements, and the store's own figures.

A kind's `gpu_episodes` / `gpu_node_episodes` series are written only while it has an
episode within 28 days (so the series stay few); an absent series means 0.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from exporter.history.episodes import NODE
from exporter.history.recorder import KEEP_SECONDS, WINDOW_SECONDS, History


def history_families(history: History, now: float) -> Iterator[Metric]:
    episodes = history.episodes_since(now - KEEP_SECONDS)
    gpu = GaugeMetricFamily("gpu_episodes", "Fault episodes of the GPU that started within "
                            "the window (1d, 7d, 28d), by kind; from the node's stored history, "
                            "so past restarts and Prometheus' retention. Absent: 0.",
                            labels=["gpu", "uuid", "kind", "window"])
    node = GaugeMetricFamily("gpu_node_episodes", "Fault episodes on the node (its GPUs' and "
                             "its own: InfiniBand ports, ...) that started within the window, "
                             "by kind. Absent: 0.", labels=["kind", "window"])
    per_gpu: Counter = Counter()
    per_node: Counter = Counter()
    for e in episodes:
        age = now - e.start
        for window, seconds in WINDOW_SECONDS.items():
            inside = age <= seconds
            per_node[(e.kind, window)] += inside
            if e.gpu != NODE:
                per_gpu[(e.gpu, e.kind, window)] += inside
    for (key, kind, window), count in sorted(per_gpu.items()):
        index = history.index_of.get(key)
        if index is not None:
            gpu.add_metric([str(index), key[1], kind, window], count)
    for (kind, window), count in sorted(per_node.items()):
        node.add_metric([kind, window], count)
    yield gpu
    yield node
    stats = history.stats()
    yield GaugeMetricFamily("gpu_node_history_start_timestamp_seconds", "When the node's "
                            "stored history begins (the state directory was first used): the "
                            "time its episode counts are exposed over.", value=stats.created)
    yield CounterMetricFamily("gpu_node_gpu_replacements", "GPUs found replaced in their slot "
                              "(another serial number at the same PCI address).",
                              value=stats.replacements)
    yield CounterMetricFamily("cte_history_transactions", "Transactions written to the state "
                              "directory's store.", value=stats.transactions)
    yield CounterMetricFamily("cte_history_write_failures", "Writes to the store that failed "
                              "(a full or read-only disk); what they held is kept in memory and "
                              "written later.", value=stats.write_failures)
    yield CounterMetricFamily("cte_history_dropped_episodes", "Episodes dropped from memory "
                              "while writes kept failing.", value=stats.dropped)
    resets = CounterMetricFamily("cte_history_state_resets", "Store files moved aside at start "
                                 "(corrupt, unreadable, or from the future), each replaced by "
                                 "a fresh one.", labels=["reason"])
    for reason in ("corrupt", "unreadable", "future"):
        resets.add_metric([reason], stats.resets.get(reason, 0))
    yield resets
    yield CounterMetricFamily("cte_history_xid_duplicates", "XIDs seen both by NVML's events "
                              "and in the kernel log, counted once.", value=stats.duplicates)
    yield CounterMetricFamily("cte_kmsg_xids", "XID lines read from the kernel log.",
                              value=stats.kmsg_xids)
    if history.reader.path:  # not when the log is turned off
        yield GaugeMetricFamily("cte_kmsg_readable", "1 if the kernel log (/dev/kmsg) can be read "
                                "for XIDs, 0 if not (no CAP_SYSLOG under "
                                "kernel.dmesg_restrict).",
                                value=0.0 if stats.kmsg_readable is False else 1.0)
