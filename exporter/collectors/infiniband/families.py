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

from prometheus_client.metrics_core import CounterMetricFamily, Metric

from exporter.collectors.infiniband.reading import (
    SKIP_REASONS,
    InfinibandPort,
    InfinibandReading,
)
from exporter.families import FULL, MINIMAL, STANDARD, Family

__all__ = ["COUNTERS", "COUNTERS_EXT", "DECLARED", "HW_COUNTERS", "infiniband_families"]

PORT_LABELS = ("device", "port")
GENERIC_LABELS = ("device", "port", "counter")


def _c(file: str, name: str, unit: str, help_: str, profile: str = STANDARD,
       where: str = "counters") -> tuple[str, Family]:
    """(the sysfs file, the family of its counter)."""
    return file, Family(f"infiniband_port_{name}_total", "counter", help_, PORT_LABELS,
                        unit=unit, source=f"sysfs `ports/N/{where}/{file}`", profile=profile)


def _ext(file: str, name: str, unit: str, help_: str) -> tuple[str, Family]:
    return _c(file, f"ext_{name}", unit, f"{help_} (counters_ext).", FULL, "counters_ext")


def _hw(file: str, name: str, unit: str, help_: str) -> tuple[str, Family]:
    return _c(file, name, unit, help_, STANDARD, "hw_counters")


#: ``counters/<file>`` -> family (the IB PMA port counters).
COUNTERS: dict[str, Family] = dict((
    _c("port_xmit_data", "transmit_bytes", "bytes", "Data octets transmitted (words x 4).",
       MINIMAL),
    _c("port_rcv_data", "receive_bytes", "bytes", "Data octets received (words x 4).", MINIMAL),
    _c("port_xmit_packets", "transmit_packets", "packets", "Packets transmitted, all VLs."),
    _c("port_rcv_packets", "receive_packets", "packets", "Packets received, all VLs."),
    _c("unicast_xmit_packets", "unicast_transmit_packets", "packets", "Unicast sent.", FULL),
    _c("unicast_rcv_packets", "unicast_receive_packets", "packets", "Unicast received.", FULL),
    _c("multicast_xmit_packets", "multicast_transmit_packets", "packets", "Multicast sent.",
       FULL),
    _c("multicast_rcv_packets", "multicast_receive_packets", "packets", "Multicast received.",
       FULL),
    _c("symbol_error", "symbol_errors", "errors", "Minor link errors on physical lanes.",
       MINIMAL),
    _c("link_downed", "link_downed", "events", "Times the link failed to recover and went down.",
       MINIMAL),
    _c("link_error_recovery", "link_error_recovery", "events",
       "Times the link recovered from an error state."),
    _c("local_link_integrity_errors", "local_link_integrity_errors", "errors",
       "Times local physical errors exceeded the LocalPhyErrors threshold."),
    _c("excessive_buffer_overrun_errors", "excessive_buffer_overrun_errors", "errors",
       "Consecutive flow-control update periods with a buffer overrun."),
    _c("port_rcv_errors", "receive_errors", "packets", "Received packets with an error."),
    _c("port_rcv_remote_physical_errors", "receive_remote_physical_errors", "packets",
       "Received packets marked with the EBP delimiter."),
    _c("port_rcv_switch_relay_errors", "receive_switch_relay_errors", "packets",
       "Received packets the switch could not forward.", FULL),
    _c("port_rcv_discards", "receive_discards", "packets", "Inbound packets discarded."),
    _c("port_xmit_discards", "transmit_discards", "packets", "Outbound packets discarded."),
    _c("port_rcv_constraint_errors", "receive_constraint_errors", "packets",
       "Received packets discarded by partition/constraint checks.", FULL),
    _c("port_xmit_constraint_errors", "transmit_constraint_errors", "packets",
       "Packets not transmitted because of partition/constraint checks.", FULL),
    _c("port_xmit_wait", "transmit_wait", "ticks",
       "Ticks the port had data to send but sent none (congestion)."),
    _c("VL15_dropped", "vl15_dropped", "packets", "Incoming VL15 packets dropped.", FULL),
))

#: ``counters_ext/<file>`` -> family (the older extended 64-bit set).
COUNTERS_EXT: dict[str, Family] = dict((
    _ext("port_xmit_data_64", "transmit_bytes", "bytes", "Data octets sent"),
    _ext("port_rcv_data_64", "receive_bytes", "bytes", "Data octets received"),
    _ext("port_xmit_packets_64", "transmit_packets", "packets", "Packets sent"),
    _ext("port_rcv_packets_64", "receive_packets", "packets", "Packets received"),
    _ext("port_unicast_xmit_packets", "unicast_transmit_packets", "packets",
         "Unicast packets sent"),
    _ext("port_unicast_rcv_packets", "unicast_receive_packets", "packets",
         "Unicast packets received"),
    _ext("port_multicast_xmit_packets", "multicast_transmit_packets", "packets",
         "Multicast packets sent"),
    _ext("port_multicast_rcv_packets", "multicast_receive_packets", "packets",
         "Multicast packets received"),
))

#: ``hw_counters/<file>`` -> family, for the RoCE/transport counters that alerts use.
HW_COUNTERS: dict[str, Family] = dict((
    _hw("rnr_nak_retry_err", "rnr_nak_retry_errors", "events",
        "RNR NAK retries exceeded (receiver not ready): a QP went to error."),
    _hw("local_ack_timeout_err", "local_ack_timeout_errors", "events",
        "ACK timeouts on the sender (lost packets, retransmissions follow)."),
    _hw("out_of_sequence", "out_of_sequence_packets", "packets",
        "Packets received out of sequence (RoCE loss)."),
    _hw("packet_seq_err", "packet_sequence_errors", "events", "NAK sequence errors received."),
    _hw("out_of_buffer", "out_of_buffer_drops", "packets",
        "Packets dropped for lack of receive WQEs."),
    _hw("np_cnp_sent", "cnp_sent", "packets",
        "Congestion notification packets sent (notification point)."),
    _hw("rp_cnp_handled", "cnp_handled", "packets",
        "Congestion notification packets handled (reaction point)."),
    _hw("np_ecn_marked_roce_packets", "ecn_marked_packets", "packets",
        "RoCE packets received with an ECN mark."),
))

DEVICE_INFO = Family(
    "infiniband_device_info", "info", "InfiniBand/RoCE HCA identity.",
    ("device", "board_id", "firmware_version", "hca_type", "node_guid"),
    source="sysfs `board_id, fw_ver, hca_type, node_guid`", profile=FULL)
PORT_INFO = Family(
    "infiniband_port_info", "info", "Port link layer (InfiniBand or Ethernet) and state names.",
    ("device", "port", "link_layer", "state", "phys_state"),
    source="sysfs `ports/N/{link_layer,state,phys_state}`", profile=MINIMAL)
STATE_ID = Family(
    "infiniband_port_state_id", "gauge",
    "Logical port state (1 down, 2 init, 3 armed, 4 active, 5 active defer).", PORT_LABELS,
    source="sysfs `ports/N/state`", profile=MINIMAL)
PHYS_STATE_ID = Family(
    "infiniband_port_physical_state_id", "gauge",
    "Physical port state (1 sleep, 2 polling, 3 disabled, 4 training, 5 link up, "
    "6 error recovery, 7 phy test).", PORT_LABELS, source="sysfs `ports/N/phys_state`",
    profile=MINIMAL)
RATE = Family(
    "infiniband_port_rate_bytes_per_second", "gauge", "Negotiated port rate.", PORT_LABELS,
    unit="bytes/s", source="sysfs `ports/N/rate`")
LIFESPAN = Family(
    "infiniband_port_lifespan_seconds", "gauge",
    "How long the driver caches hw_counters values (lifespan, ms in sysfs).", PORT_LABELS,
    unit="seconds", source="sysfs `ports/N/hw_counters/lifespan`", profile=FULL)
# The generic families: a counter file without a family above, by file name
OTHER_COUNTERS = Family(
    "infiniband_port_events_total", "counter",
    "Port counters this exporter has no dedicated family for, by file name.", GENERIC_LABELS,
    source="sysfs `ports/N/counters/*, counters_ext/* without a family above`")
HW_EVENTS = Family(
    "infiniband_port_hw_events_total", "counter",
    "Driver hw_counters without a dedicated family, by file name.", GENERIC_LABELS,
    source="sysfs `ports/N/hw_counters/* without a family above`")
SKIPPED = Family(
    "cte_infiniband_skipped_values_total", "counter",
    "Sysfs InfiniBand files skipped since start, by reason (N/A, empty, garbage, "
    "negative, overflow, read error, vanished, bad name, not a directory).", ("reason",),
    source="exporter",
    doc="Sysfs InfiniBand files skipped since start, by reason (N/A, empty, garbage, "
        "negative, overflow, read error, vanished, bad name, not a directory, not a file: a "
        "FIFO or device where an attribute should be, skipped without blocking).")

#: Every family this module can emit, in output order (and the docs').
DECLARED: tuple[Family, ...] = (
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


def _port_counters(
    ports: list[InfinibandPort],
    field: str,
    known: Mapping[str, Family],
    generic: dict[tuple[str, str, str], float],
) -> Iterator[Metric]:
    families: dict[str, CounterMetricFamily] = {}
    for p in ports:
        labels = [p.device, str(p.port)]
        for name, value in getattr(p, field).items():
            declared = known.get(name)
            if declared is None:
                generic.setdefault((p.device, str(p.port), name), value)
                continue
            fam = families.get(name)
            if fam is None:
                fam = families[name] = declared.counter()
            fam.add_metric(labels, value)
    for name in known:  # stable order: the table's
        if name in families:
            yield families[name]


def infiniband_families(reading: InfinibandReading) -> Iterator[Metric]:
    """Metric families for one reading (families without samples are left out)."""
    ports = [p for d in reading.devices for p in d.ports]

    if reading.devices:
        info = DEVICE_INFO.info()  # every label in each series' dict
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
        pinfo = PORT_INFO.info()
        state, phys, rate = STATE_ID.gauge(), PHYS_STATE_ID.gauge(), RATE.gauge()
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
    for declared, values in ((HW_EVENTS, hw_other), (OTHER_COUNTERS, other)):
        if values:
            fam = declared.counter()
            for key, value in values.items():
                fam.add_metric(list(key), value)
            yield fam

    lifespan = LIFESPAN.gauge()
    for p in ports:
        if p.lifespan_seconds is not None:
            lifespan.add_metric([p.device, str(p.port)], p.lifespan_seconds)
    if lifespan.samples:
        yield lifespan

    yield SKIPPED.by_label(reading.skipped_total, SKIP_REASONS)
