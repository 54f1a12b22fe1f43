"""Hardware-health families: up/lost/hung GPUs, XIDs, memory errors, NVLink, clock events."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from exporter.gpu.fields import CLOCK_EVENT_REASONS
from exporter.gpu.health import GpuHealth
from exporter.gpu.xid import xid_class
from exporter.metrics.exposition import Rows
from exporter.metrics.gpu import GPU_LABELS
from exporter.sampling.snapshot import Snapshot


def _labels(snapshot: Snapshot, gpu: int) -> list[str]:
    ident = snapshot.identities[gpu] if 0 <= gpu < len(snapshot.identities) else None
    return [str(gpu) if gpu >= 0 else "", ident.uuid if ident is not None else ""]


def health_families(snapshot: Snapshot) -> Iterator[Metric]:
    up = GaugeMetricFamily("gpu_up", "1 if the GPU answers NVML; 0 if it is lost (fell off "
                           "the bus, GpuIsLost) or stuck in a call.", labels=GPU_LABELS)
    for gpu in range(snapshot.gpu_count):
        up.add_metric(_labels(snapshot, gpu), 1.0 if snapshot.up(gpu) else 0.0)
    yield up
    yield GaugeMetricFamily("gpu_expected_devices",
                            "GPUs this node should have (configured, else the count at start).",
                            value=snapshot.expected_gpus)

    xids = CounterMetricFamily("gpu_xid_errors", "XID events by code and severity class "
                               "(critical, warning, application, unknown).",
                               labels=[*GPU_LABELS, "xid", "class"])
    last = GaugeMetricFamily("gpu_xid_last_seen_timestamp_seconds",
                             "When an XID code was last seen on the GPU (Unix time).",
                             labels=[*GPU_LABELS, "xid", "class"])
    for (gpu, code), record in sorted(snapshot.xids.items()):
        labels = [*_labels(snapshot, gpu), str(code), xid_class(code)]
        xids.add_metric(labels, record.count)
        last.add_metric(labels, record.last_seen)
    yield xids
    yield last

    yield from _clock_event_families(snapshot)


def link_memory_families(snapshot: Snapshot) -> Iterator[Metric]:
    """Memory and NVLink state and errors (~800 series on an 8-GPU node, nearly all the
    same from one reading to the next): their rendering is cached while what they show
    is (link_memory_key). NVLink traffic, which changes with every reading, is
    nvlink_traffic_families."""
    yield from _memory_families(snapshot)
    yield from _nvlink_families(snapshot)


def link_memory_key(snapshot: Snapshot) -> tuple:
    """Everything link_memory_families renders: equal keys, equal text. By value, not by
    reading: a reading every 5 s against a scrape every 15-60 s would always miss."""
    readings = tuple(
        (gpu, tuple(h.ecc_errors.items()), tuple(h.retired_pages.items()),
         h.retired_pages_pending, tuple(h.remapped_rows.items()), h.row_remap_pending,
         h.row_remap_failure, h.recovery_action,
         tuple((link.link, link.up, tuple(link.errors.items())) for link in h.nvlinks))
        for gpu, h in sorted(snapshot.health.items()))
    return readings, snapshot.identities, snapshot.lost, tuple(snapshot.hung)


def _memory_families(snapshot: Snapshot) -> Iterator[Metric]:
    ecc = CounterMetricFamily("gpu_ecc_errors", "ECC errors: corrected (single-bit) or "
                              "uncorrected (double-bit); volatile since the last driver load, "
                              "aggregate over the GPU's life.",
                              labels=[*GPU_LABELS, "type", "scope"])
    retired = CounterMetricFamily("gpu_retired_pages", "Pages retired, by cause "
                                  "(single_bit, double_bit).", labels=[*GPU_LABELS, "cause"])
    retired_pending = GaugeMetricFamily("gpu_retired_pages_pending",
                                        "1 if a page waits for retirement (next reset).",
                                        labels=GPU_LABELS)
    remapped = CounterMetricFamily("gpu_remapped_rows", "HBM rows remapped, by the error "
                                   "that caused it (correctable, uncorrectable).",
                                   labels=[*GPU_LABELS, "type"])
    pending = GaugeMetricFamily("gpu_row_remap_pending",
                                "1 if a row remap waits for the next GPU reset.",
                                labels=GPU_LABELS)
    failure = GaugeMetricFamily("gpu_row_remap_failure",
                                "1 if a row remap failed: the GPU needs replacing (RMA).",
                                labels=GPU_LABELS)
    action = GaugeMetricFamily("gpu_recovery_action", "The recovery action NVML asks for; "
                               "value 1 on the current action (none, gpu_reset, node_reboot, "
                               "drain_p2p, drain_and_reset, ...).",
                               labels=[*GPU_LABELS, "action"])
    for gpu, h in sorted(snapshot.health.items()):
        labels = _labels(snapshot, gpu)
        for (kind, scope), value in sorted(h.ecc_errors.items()):
            ecc.add_metric([*labels, kind, scope], value)
        for cause, value in sorted(h.retired_pages.items()):
            retired.add_metric([*labels, cause], value)
        if h.retired_pages_pending is not None:
            retired_pending.add_metric(labels, h.retired_pages_pending)
        for kind, value in sorted(h.remapped_rows.items()):
            remapped.add_metric([*labels, kind], value)
        if h.row_remap_pending is not None:
            pending.add_metric(labels, h.row_remap_pending)
        if h.row_remap_failure is not None:
            failure.add_metric(labels, h.row_remap_failure)
        if h.recovery_action is not None:
            action.add_metric([*labels, h.recovery_action], 1.0)
    yield from (ecc, retired, retired_pending, remapped, pending, failure, action)


def _clock_event_families(snapshot: Snapshot) -> Iterator[Metric]:
    active = Rows("gpu_clock_event_active", "1 while a clock-event (throttle) reason holds "
                  "the clocks down.", "gauge", [*GPU_LABELS, "reason"])
    for gpu, state in sorted(snapshot.states.items()):
        reasons = state.get("clock_event_reasons")
        if reasons is None:
            continue
        labels = _labels(snapshot, gpu)
        for reason, bit in CLOCK_EVENT_REASONS.items():
            active.add((*labels, reason), 1.0 if int(reasons) & bit else 0.0)
    yield active
    seconds = Rows("gpu_clock_event_seconds", "Seconds a clock-event reason was active, "
                   "accumulated sweep to sweep.", "counter", [*GPU_LABELS, "reason"])
    for (gpu, reason), value in sorted(snapshot.clock_event_seconds.items()):
        seconds.add((*_labels(snapshot, gpu), reason), value)
    yield seconds


def _nvlink_families(snapshot: Snapshot) -> Iterator[Metric]:
    """Per GPU and link: ~1,000 series on an 8-GPU node with 18 links each, so they are
    kept as Rows (see exposition.Rows)."""
    link_labels = [*GPU_LABELS, "link"]
    expected = GaugeMetricFamily("gpu_nvlink_links_expected", "NVLinks the GPU has, which "
                                 "should all be active (NVML_FI_DEV_NVLINK_LINK_COUNT).",
                                 labels=GPU_LABELS)
    active = GaugeMetricFamily("gpu_nvlink_links_active", "NVLinks that are up.",
                               labels=GPU_LABELS)
    up = Rows("gpu_nvlink_link_up", "1 if the NVLink is active.", "gauge", link_labels)
    errors = Rows("gpu_nvlink_errors", "NVLink data-link errors by type: replay, recovery, "
                  "crc_flit, crc_data.", "counter", [*link_labels, "type"])
    for gpu, h in sorted(snapshot.health.items()):
        labels = _labels(snapshot, gpu)
        ident = snapshot.identities[gpu]
        if ident is not None and ident.nvlinks:
            expected.add_metric(labels, ident.nvlinks)
        states = [link.up for link in h.nvlinks if link.up is not None]
        if states:
            active.add_metric(labels, float(sum(states)))
        for link in h.nvlinks:
            ll = (*labels, str(link.link))
            if link.up is not None:
                up.add(ll, 1.0 if link.up else 0.0)
            for kind, value in sorted(link.errors.items()):
                errors.add((*ll, kind), value)
    yield from (expected, active, up, errors)


def nvlink_traffic_families(snapshot: Snapshot) -> Iterator[Metric]:
    """Bytes over each NVLink: new at every health reading, so rendered every time. Per
    GPU instead where the traffic was read for all links at once (a selection that sums
    the link away: exporter/metrics/selection.py)."""
    readings = sorted(snapshot.health.items())
    per_link = all(h.nvlink_traffic is None for _, h in readings)
    names = [*GPU_LABELS, "link"] if per_link else GPU_LABELS
    tx = Rows("gpu_nvlink_transmit_bytes", "Data bytes sent over the NVLink.", "counter",
              names)
    rx = Rows("gpu_nvlink_receive_bytes", "Data bytes received over the NVLink.", "counter",
              names)
    for gpu, h in readings:
        labels = _labels(snapshot, gpu)
        if not per_link:
            sent, received = h.nvlink_traffic or _summed_traffic(h)
            if sent is not None:
                tx.add(tuple(labels), sent)
            if received is not None:
                rx.add(tuple(labels), received)
            continue
        for link in h.nvlinks:
            ll = (*labels, str(link.link))
            if link.transmit_bytes is not None:
                tx.add(ll, link.transmit_bytes)
            if link.receive_bytes is not None:
                rx.add(ll, link.receive_bytes)
    yield from (tx, rx)


def _summed_traffic(h: GpuHealth) -> tuple[float | None, float | None]:
    """A reading taken per link (before a reload changed the reads), summed."""
    sent = [link.transmit_bytes for link in h.nvlinks if link.transmit_bytes is not None]
    received = [link.receive_bytes for link in h.nvlinks if link.receive_bytes is not None]
    return (sum(sent) if sent else None), (sum(received) if received else None)
