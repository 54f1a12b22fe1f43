"""InfiniBand / RoCE reading -> Prometheus metric families.

Every port series carries ``device`` and ``port``; identity strings live only on
the ``_info`` families. Known counters get one family each (named in base
units: data counters are already bytes); counter files we have no name for are
still exported, under ``infiniband_port_events_total`` (``counters/`` and
``counters_ext/``) or ``infiniband_port_hw_events_total`` (``hw_counters/``),
with the file name as the ``counter`` label, so a new driver needs no code change.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily
from prometheus_client.metrics_core import Metric

from exporter.collectors.infiniband.reading import (
    SKIP_REASONS,
    InfinibandPort,
    InfinibandReading,
)
from exporter.collectors.registry import counts_by

__all__ = ["FAMILIES", "FamilySpec", "infiniband_families"]

PORT_LABELS = ("device", "port")
GENERIC_LABELS = ("device", "port", "counter")


@dataclass(frozen=True)
class FamilySpec:
    """One exported family, as listed in ``docs/metrics.md``."""

    name: str  # as exposed (counters end in _total, info in _info)
    type: str  # counter, gauge or info
    unit: str
    labels: tuple[str, ...]
    source: str
    help: str


def _c(file: str, name: str, unit: str, help_: str, where: str = "counters") -> FamilySpec:
    return FamilySpec(
        f"infiniband_port_{name}_total", "counter", unit, PORT_LABELS, f"{where}/{file}", help_
    )


#: ``counters/<file>`` -> family (the IB PMA port counters).
COUNTERS: dict[str, FamilySpec] = {
    s.source.split("/", 1)[1]: s
    for s in (
        _c("port_xmit_data", "transmit_bytes", "bytes", "Data octets transmitted (words x 4)."),
        _c("port_rcv_data", "receive_bytes", "bytes", "Data octets received (words x 4)."),
        _c("port_xmit_packets", "transmit_packets", "packets", "Packets transmitted, all VLs."),
        _c("port_rcv_packets", "receive_packets", "packets", "Packets received, all VLs."),
        _c("unicast_xmit_packets", "unicast_transmit_packets", "packets", "Unicast sent."),
        _c("unicast_rcv_packets", "unicast_receive_packets", "packets", "Unicast received."),
        _c("multicast_xmit_packets", "multicast_transmit_packets", "packets", "Multicast sent."),
        _c("multicast_rcv_packets", "multicast_receive_packets", "packets", "Multicast received."),
        _c("symbol_error", "symbol_errors", "errors", "Minor link errors on physical lanes."),
        _c(
            "link_downed",
            "link_downed",
            "events",
            "Times the link failed to recover and went down.",
        ),
        _c(
            "link_error_recovery",
            "link_error_recovery",
            "events",
            "Times the link recovered from an error state.",
        ),
        _c(
            "local_link_integrity_errors",
            "local_link_integrity_errors",
            "errors",
            "Times local physical errors exceeded the LocalPhyErrors threshold.",
        ),
        _c(
            "excessive_buffer_overrun_errors",
            "excessive_buffer_overrun_errors",
            "errors",
            "Consecutive flow-control update periods with a buffer overrun.",
        ),
        _c("port_rcv_errors", "receive_errors", "packets", "Received packets with an error."),
        _c(
            "port_rcv_remote_physical_errors",
            "receive_remote_physical_errors",
            "packets",
            "Received packets marked with the EBP delimiter.",
        ),
        _c(
            "port_rcv_switch_relay_errors",
            "receive_switch_relay_errors",
            "packets",
            "Received packets the switch could not forward.",
        ),
        _c("port_rcv_discards", "receive_discards", "packets", "Inbound packets discarded."),
        _c("port_xmit_discards", "transmit_discards", "packets", "Outbound packets discarded."),
        _c(
            "port_rcv_constraint_errors",
            "receive_constraint_errors",
            "packets",
            "Received packets discarded by partition/constraint checks.",
        ),
        _c(
            "port_xmit_constraint_errors",
            "transmit_constraint_errors",
            "packets",
            "Packets not transmitted because of partition/constraint checks.",
        ),
        _c(
            "port_xmit_wait",
            "transmit_wait",
            "ticks",
            "Ticks the port had data to send but sent none (congestion).",
        ),
        _c("VL15_dropped", "vl15_dropped", "packets", "Incoming VL15 packets dropped."),
    )
}

#: ``counters_ext/<file>`` -> family (the older extended 64-bit set).
COUNTERS_EXT: dict[str, FamilySpec] = {
    s.source.split("/", 1)[1]: s
    for s in (
        _c(
            "port_xmit_data_64",
            "ext_transmit_bytes",
            "bytes",
            "Data octets sent (counters_ext).",
            "counters_ext",
        ),
        _c(
            "port_rcv_data_64",
            "ext_receive_bytes",
            "bytes",
            "Data octets received (counters_ext).",
            "counters_ext",
        ),
        _c(
            "port_xmit_packets_64",
            "ext_transmit_packets",
            "packets",
            "Packets sent (counters_ext).",
            "counters_ext",
        ),
        _c(
            "port_rcv_packets_64",
            "ext_receive_packets",
            "packets",
            "Packets received (counters_ext).",
            "counters_ext",
        ),
        _c(
            "port_unicast_xmit_packets",
            "ext_unicast_transmit_packets",
            "packets",
            "Unicast packets sent (counters_ext).",
            "counters_ext",
        ),
        _c(
            "port_unicast_rcv_packets",
            "ext_unicast_receive_packets",
            "packets",
            "Unicast packets received (counters_ext).",
            "counters_ext",
        ),
        _c(
            "port_multicast_xmit_packets",
            "ext_multicast_transmit_packets",
            "packets",
            "Multicast packets sent (counters_ext).",
            "counters_ext",
        ),
        _c(
            "port_multicast_rcv_packets",
            "ext_multicast_receive_packets",
            "packets",
            "Multicast packets received (counters_ext).",
            "counters_ext",
        ),
    )
}

#: ``hw_counters/<file>`` -> family, for the RoCE/transport counters that alerts use.
HW_COUNTERS: dict[str, FamilySpec] = {
    s.source.split("/", 1)[1]: s
    for s in (
        _c(
            "rnr_nak_retry_err",
            "rnr_nak_retry_errors",
            "events",
            "RNR NAK retries exceeded (receiver not ready): a QP went to error.",
            "hw_counters",
        ),
        _c(
            "local_ack_timeout_err",
            "local_ack_timeout_errors",
            "events",
            "ACK timeouts on the sender (lost packets, retransmissions follow).",
            "hw_counters",
        ),
        _c(
            "out_of_sequence",
            "out_of_sequence_packets",
            "packets",
            "Packets received out of sequence (RoCE loss).",
            "hw_counters",
        ),
        _c(
            "packet_seq_err",
            "packet_sequence_errors",
            "events",
            "NAK sequence errors received.",
            "hw_counters",
        ),
        _c(
            "out_of_buffer",
            "out_of_buffer_drops",
            "packets",
            "Packets dropped for lack of receive WQEs.",
            "hw_counters",
        ),
        _c(
            "np_cnp_sent",
            "cnp_sent",
            "packets",
            "Congestion notification packets sent (notification point).",
            "hw_counters",
        ),
        _c(
            "rp_cnp_handled",
            "cnp_handled",
            "packets",
            "Congestion notification packets handled (reaction point).",
            "hw_counters",
        ),
        _c(
            "np_ecn_marked_roce_packets",
            "ecn_marked_packets",
            "packets",
            "RoCE packets received with an ECN mark.",
            "hw_counters",
        ),
    )
}

DEVICE_INFO = FamilySpec(
    "infiniband_device_info",
    "info",
    "-",
    ("device", "board_id", "firmware_version", "hca_type", "node_guid"),
    "board_id, fw_ver, hca_type, node_guid",
    "InfiniBand/RoCE HCA identity.",
)
PORT_INFO = FamilySpec(
    "infiniband_port_info",
    "info",
    "-",
    ("device", "port", "link_layer", "state", "phys_state"),
    "ports/N/{link_layer,state,phys_state}",
    "Port link layer (InfiniBand or Ethernet) and state names.",
)
STATE_ID = FamilySpec(
    "infiniband_port_state_id",
    "gauge",
    "-",
    PORT_LABELS,
    "ports/N/state",
    "Logical port state (1 down, 2 init, 3 armed, 4 active, 5 active defer).",
)
PHYS_STATE_ID = FamilySpec(
    "infiniband_port_physical_state_id",
    "gauge",
    "-",
    PORT_LABELS,
    "ports/N/phys_state",
    "Physical port state (1 sleep, 2 polling, 3 disabled, 4 training, 5 link up, "
    "6 error recovery, 7 phy test).",
)
RATE = FamilySpec(
    "infiniband_port_rate_bytes_per_second",
    "gauge",
    "bytes/s",
    PORT_LABELS,
    "ports/N/rate",
    "Negotiated port rate.",
)
LIFESPAN = FamilySpec(
    "infiniband_port_lifespan_seconds",
    "gauge",
    "seconds",
    PORT_LABELS,
    "hw_counters/lifespan",
    "How long the driver caches hw_counters values (lifespan, ms in sysfs).",
)
OTHER_COUNTERS = FamilySpec(
    "infiniband_port_events_total",
    "counter",
    "-",
    GENERIC_LABELS,
    "counters/*, counters_ext/* without a family above",
    "Port counters this exporter has no dedicated family for, by file name.",
)
HW_EVENTS = FamilySpec(
    "infiniband_port_hw_events_total",
    "counter",
    "-",
    GENERIC_LABELS,
    "hw_counters/* without a family above",
    "Driver hw_counters without a dedicated family, by file name.",
)
SKIPPED = FamilySpec(
    "cte_infiniband_skipped_values_total",
    "counter",
    "-",
    ("reason",),
    "exporter",
    "Sysfs InfiniBand files skipped since start, by reason (N/A, empty, garbage, "
    "negative, overflow, read error, vanished, bad name, not a directory).",
)

#: Every family this module can emit, in output order.
FAMILIES: tuple[FamilySpec, ...] = (
    DEVICE_INFO,
    PORT_INFO,
    STATE_ID,
    PHYS_STATE_ID,
    RATE,
    *COUNTERS.values(),
    *COUNTERS_EXT.values(),
    *HW_COUNTERS.values(),
    HW_EVENTS,
    OTHER_COUNTERS,
    LIFESPAN,
    SKIPPED,
)


Family = CounterMetricFamily | GaugeMetricFamily  # one number per sample


def _new(spec: FamilySpec) -> Family:
    if spec.type == "counter":
        return CounterMetricFamily(spec.name, spec.help, labels=list(spec.labels))
    assert spec.type == "gauge", spec.name
    return GaugeMetricFamily(spec.name, spec.help, labels=list(spec.labels))


def _new_info(spec: FamilySpec) -> InfoMetricFamily:
    """An info family whose samples carry every label themselves."""
    assert spec.type == "info", spec.name
    return InfoMetricFamily(spec.name.removesuffix("_info"), spec.help, labels=[])


def _port_counters(
    ports: list[InfinibandPort],
    field: str,
    known: Mapping[str, FamilySpec],
    generic: dict[tuple[str, str, str], float],
) -> Iterator[Metric]:
    families: dict[str, Family] = {}
    for p in ports:
        labels = [p.device, str(p.port)]
        for name, value in getattr(p, field).items():
            spec = known.get(name)
            if spec is None:
                generic.setdefault((p.device, str(p.port), name), value)
                continue
            fam = families.get(name)
            if fam is None:
                fam = families[name] = _new(spec)
            fam.add_metric(labels, value)
    for name in known:  # stable order: the table's
        if name in families:
            yield families[name]


def infiniband_families(reading: InfinibandReading) -> Iterator[Metric]:
    """Metric families for one reading (families without samples are left out)."""
    ports = [p for d in reading.devices for p in d.ports]

    if reading.devices:
        info = _new_info(DEVICE_INFO)
        for d in reading.devices:
            info.add_metric(
                [],
                {
                    "device": d.name,
                    "board_id": d.board_id,
                    "firmware_version": d.fw_ver,
                    "hca_type": d.hca_type,
                    "node_guid": d.node_guid,
                },
            )
        yield info

    if ports:
        pinfo = _new_info(PORT_INFO)
        state, phys, rate = _new(STATE_ID), _new(PHYS_STATE_ID), _new(RATE)
        for p in ports:
            labels = [p.device, str(p.port)]
            pinfo.add_metric(
                [],
                {
                    "device": p.device,
                    "port": str(p.port),
                    "link_layer": p.link_layer or "",
                    "state": p.state or "",
                    "phys_state": p.phys_state or "",
                },
            )
            if p.state_id is not None:
                state.add_metric(labels, p.state_id)
            if p.phys_state_id is not None:
                phys.add_metric(labels, p.phys_state_id)
            if p.rate_bytes_per_second is not None:
                rate.add_metric(labels, p.rate_bytes_per_second)
        yield from (f for f in (pinfo, state, phys, rate) if f.samples)

    other: dict[tuple[str, str, str], float] = {}
    hw_other: dict[tuple[str, str, str], float] = {}
    yield from _port_counters(ports, "counters", COUNTERS, other)
    yield from _port_counters(ports, "counters_ext", COUNTERS_EXT, other)
    yield from _port_counters(ports, "hw_counters", HW_COUNTERS, hw_other)
    for spec, values in ((HW_EVENTS, hw_other), (OTHER_COUNTERS, other)):
        if values:
            fam = _new(spec)
            for key, value in values.items():
                fam.add_metric(list(key), value)
            yield fam

    lifespan = _new(LIFESPAN)
    for p in ports:
        if p.lifespan_seconds is not None:
            lifespan.add_metric([p.device, str(p.port)], p.lifespan_seconds)
    if lifespan.samples:
        yield lifespan

    yield counts_by(SKIPPED.name, SKIPPED.help, "reason", SKIP_REASONS, reading.skipped_total)
