"""GPU hardware families: up/lost/hung GPUs, XIDs, memory errors, NVLink, clock events.

The memory errors are the catalogue's, rendered from it (exporter/gpu/catalogue.py says
where a per-GPU value lives). Written here by hand: up and lost are the sampler's
verdict, XIDs arrive as events, clock-event bits are one mask split per reason, the
recovery action is a code served as a label, and the NVLink families (their fields are
the catalogue's per-link entries) come from the device read's links, with the count of
active links and, where a profile sums the link away, the driver's all-links traffic.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.metrics_core import Metric

from exporter.families import MINIMAL, Family
from exporter.gpu import catalogue
from exporter.gpu.catalogue import (
    LINK_UP,
    NVLINK_ERRORS,
    NVLINK_RX,
    NVLINK_TX,
    per_gpu,
)
from exporter.gpu.device_read import DeviceRead
from exporter.gpu.fields import CLOCK_EVENT_REASONS
from exporter.gpu.xid import xid_class
from exporter.metrics.exposition import Rows
from exporter.metrics.gpu import (
    WITH_HARDWARE,
    catalogue_family,
    gpu_labels,
    identified,
)
from exporter.sampling.snapshot import Snapshot

UP = per_gpu(
    "gpu_up", "gauge", "1 if the GPU answers NVML; 0 if it is lost (fell off the bus, "
    "GpuIsLost) or stuck in a call.", source="sampler", profile=MINIMAL,
    doc="1 if the GPU answers NVML; 0 if it is lost (`GpuIsLost`, fell off the bus) or "
        "stuck in an NVML call.")
EXPECTED = Family(
    "gpu_expected_devices", "gauge",
    "GPUs this node should have (configured, else the count at start).",
    source="config `expected_gpus`, else `nvmlDeviceGetCount` at start", profile=MINIMAL,
    doc="GPUs the node should have: `count(gpu_up == 1) < gpu_expected_devices` finds a "
        "vanished GPU.")
XIDS = per_gpu(
    "gpu_xid_errors_total", "counter", "XID events by code and severity class (critical, "
    "warning, application, unknown).", "xid", "class", profile=MINIMAL,
    source="`nvmlEventSetWait`; the kernel log (`/dev/kmsg`)",
    doc="XID events by code and severity class, from NVML's events and the kernel log, an "
        "XID both saw counted once. An XID whose GPU cannot be identified has empty "
        "`gpu`/`uuid`. With a state directory ([history.md](history.md)) the count "
        "continues across restarts and reboots, and XIDs the kernel log holds from before "
        "the start are counted; without one it starts at the start, the log read from its "
        "end.")
XID_LAST_SEEN = per_gpu(
    "gpu_xid_last_seen_timestamp_seconds", "gauge",
    "When an XID code was last seen on the GPU (Unix time).", "xid", "class", unit="s",
    source="`nvmlEventSetWait`; the kernel log (`/dev/kmsg`)", profile=MINIMAL,
    doc="When that code was last seen on the GPU (Unix time).")
RECOVERY_ACTION = per_gpu(
    "gpu_recovery_action", "gauge", "The recovery action NVML asks for; value 1 on the "
    "current action (none, gpu_reset, node_reboot, drain_p2p, drain_and_reset, ...).",
    "action", source="field 230 (`GET_GPU_RECOVERY_ACTION`)", profile=MINIMAL,
    doc="1 on the action NVML asks for: `none`, `gpu_reset`, `node_reboot`, `drain_p2p`, "
        "`drain_and_reset`, ...")
CLOCK_EVENT_ACTIVE = per_gpu(
    "gpu_clock_event_active", "gauge",
    "1 while a clock-event (throttle) reason holds the clocks down.", "reason",
    source="`nvmlDeviceGetCurrentClocksEventReasons`",
    doc="1 while a reason holds clocks down: `gpu_idle`, `applications_clocks_setting`, "
        "`sw_power_cap`, `hw_slowdown`, `sync_boost`, `sw_thermal_slowdown`, "
        "`hw_thermal_slowdown`, `hw_power_brake_slowdown`, `display_clock_setting`.")
CLOCK_EVENT_SECONDS = per_gpu(
    "gpu_clock_event_seconds_total", "counter",
    "Seconds a clock-event reason was active, accumulated sweep to sweep.", "reason",
    unit="s", source="sampler",
    doc="Seconds each reason was active, accumulated sweep to sweep (gaps over 3 sweeps "
        "are not counted).")
LINKS_EXPECTED = per_gpu(
    "gpu_nvlink_links_expected", "gauge", "NVLinks the GPU has, which should all be active "
    "(NVML_FI_DEV_NVLINK_LINK_COUNT).", source="field 91 (`NVLINK_LINK_COUNT`)",
    profile=MINIMAL,
    doc="NVLinks the GPU has, which should all be active (18 on H100 SXM).")
LINKS_ACTIVE = per_gpu(
    "gpu_nvlink_links_active", "gauge", "NVLinks that are up.",
    source="field 165 per link", profile=MINIMAL, doc="NVLinks up.")
# docs/metrics.md "GPU hardware", with the catalogue's families rendered here (WITH_HARDWARE)
DECLARED: tuple[Family, ...] = (
    UP, EXPECTED, XIDS, XID_LAST_SEEN, *WITH_HARDWARE, RECOVERY_ACTION,
    CLOCK_EVENT_ACTIVE, CLOCK_EVENT_SECONDS, LINKS_EXPECTED,
    LINKS_ACTIVE, LINK_UP, NVLINK_TX, NVLINK_RX, NVLINK_ERRORS)


def _labels(snapshot: Snapshot, gpu: int) -> list[str]:
    ident = snapshot.identities[gpu] if 0 <= gpu < len(snapshot.identities) else None
    return [str(gpu) if gpu >= 0 else "", ident.uuid if ident is not None else ""]


def up_families(snapshot: Snapshot) -> Iterator[Metric]:
    """Which GPUs answer NVML, and how many the node should have."""
    up = UP.gauge()
    for gpu in range(snapshot.gpu_count):
        up.add_metric(_labels(snapshot, gpu), 1.0 if snapshot.up(gpu) else 0.0)
    yield up
    yield EXPECTED.gauge(snapshot.expected_gpus)


def xid_families(snapshot: Snapshot) -> Iterator[Metric]:
    """The XID counts and when each code was last seen, by code and class."""
    xids = XIDS.counter()
    last = XID_LAST_SEEN.gauge()
    for (gpu, code), record in sorted(snapshot.xids.items()):
        labels = [*_labels(snapshot, gpu), str(code), xid_class(code)]
        xids.add_metric(labels, record.count)
        last.add_metric(labels, record.last_seen)
    yield xids
    yield last


def link_memory_families(snapshot: Snapshot) -> Iterator[Metric]:
    """Memory and NVLink state and errors (~800 series on an 8-GPU node, nearly all the
    same from one reading to the next): their rendering is cached while what they show
    is (link_memory_key). NVLink traffic, which changes with every reading, is
    nvlink_traffic_families."""
    yield from _memory_families(snapshot)
    yield from _nvlink_families(snapshot)


# the memory families' entries: their values in the sweep's readings are what is rendered
_MEMORY_KEYS = tuple(e.key for f in WITH_HARDWARE for e in catalogue.FAMILIES[f])


def link_memory_key(snapshot: Snapshot) -> tuple:
    """Everything link_memory_families renders: equal keys, equal text. By value, not by
    reading: most new device reads (every --sweep.health-interval) render the same text."""
    memory = tuple((gpu, tuple(reading.get(key) for key in _MEMORY_KEYS))
                   for gpu, reading in sorted(snapshot.readings.items()))
    readings = tuple(
        (gpu, h.recovery_action,
         tuple((link.link, link.up, tuple(link.errors.items())) for link in h.nvlinks))
        for gpu, h in sorted(snapshot.device_reads.items()))
    return memory, readings, snapshot.identities, snapshot.lost, tuple(snapshot.hung)


def _memory_families(snapshot: Snapshot) -> Iterator[Metric]:
    identities, labels = identified(snapshot), gpu_labels(snapshot)
    for family in WITH_HARDWARE:
        yield catalogue_family(family, snapshot, identities, labels)
    # written by hand: the value is an action's code, served as its name in a label
    action = RECOVERY_ACTION.gauge()
    for gpu, h in sorted(snapshot.device_reads.items()):
        if h.recovery_action is not None:
            action.add_metric([*_labels(snapshot, gpu), h.recovery_action], 1.0)
    yield action


def clock_event_families(snapshot: Snapshot) -> Iterator[Metric]:
    active = Rows.of(CLOCK_EVENT_ACTIVE)
    for gpu, reading in sorted(snapshot.readings.items()):
        reasons = reading.get("clock_event_reasons")
        if reasons is None:
            continue
        labels = _labels(snapshot, gpu)
        for reason, bit in CLOCK_EVENT_REASONS.items():
            active.add((*labels, reason), 1.0 if int(reasons) & bit else 0.0)
    yield active
    seconds = Rows.of(CLOCK_EVENT_SECONDS)
    for (gpu, reason), value in sorted(snapshot.clock_event_seconds.items()):
        seconds.add((*_labels(snapshot, gpu), reason), value)
    yield seconds


def _nvlink_families(snapshot: Snapshot) -> Iterator[Metric]:
    """Per GPU and link: ~1,000 series on an 8-GPU node with 18 links each, so they are
    kept as Rows (see exposition.Rows)."""
    expected = LINKS_EXPECTED.gauge()
    active = LINKS_ACTIVE.gauge()
    up = Rows.of(LINK_UP)
    errors = Rows.of(NVLINK_ERRORS)
    for gpu, h in sorted(snapshot.device_reads.items()):
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
    """Bytes over each NVLink: new at every device reading, so rendered every time. Per
    GPU instead where the traffic was read for all links at once (a selection that sums
    the link away: exporter/metrics/selection.py)."""
    readings = sorted(snapshot.device_reads.items())
    per_link = all(h.nvlink_traffic is None for _, h in readings)
    tx, rx = (Rows.of(f if per_link else f.without("link")) for f in (NVLINK_TX, NVLINK_RX))
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


def _summed_traffic(h: DeviceRead) -> tuple[float | None, float | None]:
    """A reading taken per link (before a reload changed the reads), summed."""
    sent = [link.transmit_bytes for link in h.nvlinks if link.transmit_bytes is not None]
    received = [link.receive_bytes for link in h.nvlinks if link.receive_bytes is not None]
    return (sum(sent) if sent else None), (sum(received) if received else None)
