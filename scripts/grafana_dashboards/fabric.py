"""GPU cluster fabric: InfiniBand/RoCE per port, host network, NVLink."""

from __future__ import annotations

from .common import (
    RI,
    G,
    Item,
    N,
    dashboard,
    query_var,
    row,
    table,
    timeline,
    ts,
    value_map,
    variables,
)

FILE = "fabric.json"

P = f'{N}, device=~"$device"'  # one HCA port's series, filtered by the HCA variable
LABEL = "{{instance}} {{device}}/{{port}}"

PORT_STATE = value_map(("1", "down", "red"), ("2", "init", "orange"), ("3", "armed", "yellow"),
                       ("4", "active", "green"), ("5", "active defer", "blue"))
PHYS_STATE = value_map(("1", "sleep", "purple"), ("2", "polling", "orange"),
                       ("3", "disabled", "red"), ("4", "training", "yellow"),
                       ("5", "link up", "green"), ("6", "error recovery", "orange"),
                       ("7", "phy test", "blue"))


def rate(metric: str) -> str:
    return f"rate({metric}{{{P}}}[{RI}])"


def throughput() -> list[Item]:
    return [
        row("Throughput"),
        ts("Transmit per port", (rate("infiniband_port_transmit_bytes_total"), LABEL),
           unit="Bps"),
        ts("Receive per port", (rate("infiniband_port_receive_bytes_total"), LABEL),
           unit="Bps"),
        ts("Transmit as share of port rate",
           (f"{rate('infiniband_port_transmit_bytes_total')} / "
            f"infiniband_port_rate_bytes_per_second{{{P}}}", LABEL),
           unit="percentunit", minimum=0),
        ts("Packets per port", (rate("infiniband_port_transmit_packets_total"), f"{LABEL} tx"),
           (rate("infiniband_port_receive_packets_total"), f"{LABEL} rx"), unit="pps"),
    ]


def link_state() -> list[Item]:
    return [
        row("Link state"),
        table("Ports", (f"infiniband_port_info{{{P}}}", ""),
              (f"infiniband_port_rate_bytes_per_second{{{P}}} * 8", ""), merge=True,
              hide=("Time", "__name__", "job", "Value #A"), w=24, h=7,
              description="Value #B: negotiated rate in bit/s."),
        timeline("Logical port state", (f"infiniband_port_state_id{{{P}}}", LABEL),
                 mappings=PORT_STATE),
        timeline("Physical port state", (f"infiniband_port_physical_state_id{{{P}}}", LABEL),
                 mappings=PHYS_STATE),
    ]


def errors() -> list[Item]:
    return [
        row("Errors"),
        ts("Link errors", (rate("infiniband_port_symbol_errors_total"), f"{LABEL} symbol"),
           (rate("infiniband_port_link_error_recovery_total"), f"{LABEL} error recovery"),
           (rate("infiniband_port_link_downed_total"), f"{LABEL} link downed"),
           (rate("infiniband_port_local_link_integrity_errors_total"),
            f"{LABEL} local link integrity"), unit="cps"),
        ts("Receive errors and discards",
           (rate("infiniband_port_receive_errors_total"), f"{LABEL} rcv errors"),
           (rate("infiniband_port_receive_discards_total"), f"{LABEL} rcv discards"),
           (rate("infiniband_port_transmit_discards_total"), f"{LABEL} xmit discards"),
           (rate("infiniband_port_receive_remote_physical_errors_total"),
            f"{LABEL} remote physical"), unit="cps"),
        ts("Congestion: transmit wait", (rate("infiniband_port_transmit_wait_total"), LABEL),
           description="Ticks per second the port had data but could not send."),
        ts("RoCE congestion control: CNP and ECN",
           (rate("infiniband_port_cnp_sent_total"), f"{LABEL} CNP sent"),
           (rate("infiniband_port_cnp_handled_total"), f"{LABEL} CNP handled"),
           (rate("infiniband_port_ecn_marked_packets_total"), f"{LABEL} ECN marked"), unit="pps"),
        ts("RoCE loss and retransmission",
           (rate("infiniband_port_local_ack_timeout_errors_total"), f"{LABEL} ack timeout"),
           (rate("infiniband_port_out_of_sequence_packets_total"), f"{LABEL} out of sequence"),
           (rate("infiniband_port_packet_sequence_errors_total"), f"{LABEL} seq NAK"),
           (rate("infiniband_port_rnr_nak_retry_errors_total"), f"{LABEL} RNR NAK retry"),
           (rate("infiniband_port_out_of_buffer_drops_total"), f"{LABEL} out of buffer"),
           unit="cps"),
        table("Link downed (since counters reset)",
              (f"infiniband_port_link_downed_total{{{P}}}", ""),
              hide=("Time", "__name__", "job")),
    ]


def host_network() -> list[Item]:
    def host(metric: str) -> str:
        return f"rate(host_network_{metric}_total{{{N}}}[{RI}])"

    iface = "{{instance}} {{interface}}"
    return [
        row("Host network"),
        ts("Host network throughput", (host("transmit_bytes"), f"{iface} tx"),
           (host("receive_bytes"), f"{iface} rx"), unit="Bps"),
        ts("Host network errors and drops",
           (host("receive_errors"), f"{iface} rx errors"),
           (host("transmit_errors"), f"{iface} tx errors"),
           (host("receive_drops"), f"{iface} rx drops"),
           (host("transmit_drops"), f"{iface} tx drops"), unit="cps"),
    ]


def nvlink() -> list[Item]:
    return [
        row("NVLink (scale-up fabric)"),
        ts("NVLink throughput per GPU",
           (f"sum by (instance, gpu) (rate(gpu_nvlink_transmit_bytes_total{{{G}}}[{RI}]))",
            "{{instance}} GPU {{gpu}} tx"),
           (f"sum by (instance, gpu) (rate(gpu_nvlink_receive_bytes_total{{{G}}}[{RI}]))",
            "{{instance}} GPU {{gpu}} rx"), unit="Bps"),
        ts("NVLink links active vs expected",
           (f"sum by (instance) (gpu_nvlink_links_active{{{G}}})", "{{instance}} active"),
           (f"sum by (instance) (gpu_nvlink_links_expected{{{G}}})", "{{instance}} expected")),
    ]


def board():
    device = query_var("device", "HCA", f"label_values(infiniband_port_info{{{N}}}, device)")
    return dashboard(
        "cte-fabric", "GPU cluster fabric",
        "InfiniBand/RoCE throughput, errors and link state per port; host network; "
        "NVLink.", [*throughput(), *link_state(), *errors(), *host_network(), *nvlink()],
        variables(extra=(device,)))
