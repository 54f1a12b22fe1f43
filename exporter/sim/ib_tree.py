"""Build hand-made ``/sys/class/infiniband`` trees for tests and benchmarks.

Values are written exactly as the kernel prints them (one line, ``\\n``); a test
can pass any string (``"N/A (no PMA)"``, ``"-1"``, ...) to model a bad file.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

# counters/ of an mlx5 port on a recent kernel (64-bit PMA set).
IB_COUNTERS: dict[str, int] = {
    "VL15_dropped": 0,
    "excessive_buffer_overrun_errors": 0,
    "link_downed": 1,
    "link_error_recovery": 2,
    "local_link_integrity_errors": 0,
    "multicast_rcv_packets": 1_204,
    "multicast_xmit_packets": 602,
    "port_rcv_constraint_errors": 0,
    "port_rcv_data": 912_345_678_901,
    "port_rcv_discards": 3,
    "port_rcv_errors": 0,
    "port_rcv_packets": 3_456_789_012,
    "port_rcv_remote_physical_errors": 0,
    "port_rcv_switch_relay_errors": 0,
    "port_xmit_constraint_errors": 0,
    "port_xmit_data": 876_543_210_987,
    "port_xmit_discards": 0,
    "port_xmit_packets": 3_123_456_789,
    "port_xmit_wait": 42_000,
    "symbol_error": 17,
    "unicast_rcv_packets": 3_456_000_000,
    "unicast_xmit_packets": 3_123_000_000,
}

# counters_ext/ (the older 64-bit set).
IB_COUNTERS_EXT: dict[str, int] = {
    "port_multicast_rcv_packets": 1_204,
    "port_multicast_xmit_packets": 602,
    "port_rcv_data_64": 912_345_678_901,
    "port_rcv_packets_64": 3_456_789_012,
    "port_unicast_rcv_packets": 3_456_000_000,
    "port_unicast_xmit_packets": 3_123_000_000,
    "port_xmit_data_64": 876_543_210_987,
    "port_xmit_packets_64": 3_123_456_789,
}

# hw_counters/ of an mlx5 RoCE port (ConnectX-7, kernel 6.x), ~40 files.
ROCE_HW_COUNTERS: dict[str, int] = {
    "duplicate_request": 0,
    "implied_nak_seq_err": 0,
    "lifespan": 10,
    "local_ack_timeout_err": 4,
    "np_cnp_sent": 1_500,
    "np_ecn_marked_roce_packets": 1_700,
    "out_of_buffer": 0,
    "out_of_sequence": 12,
    "packet_seq_err": 0,
    "req_cqe_error": 0,
    "req_cqe_flush_error": 0,
    "req_remote_access_errors": 0,
    "req_remote_invalid_request": 0,
    "req_rnr_retries_exceeded": 0,
    "req_transport_retries_exceeded": 0,
    "resp_cqe_error": 0,
    "resp_cqe_flush_error": 0,
    "resp_local_length_error": 0,
    "resp_remote_access_errors": 0,
    "rnr_nak_retry_err": 1,
    "roce_adp_retrans": 5,
    "roce_adp_retrans_to": 0,
    "roce_slow_restart": 0,
    "roce_slow_restart_cnps": 0,
    "roce_slow_restart_trans": 0,
    "rp_cnp_handled": 1_450,
    "rp_cnp_ignored": 0,
    "rx_atomic_requests": 0,
    "rx_dct_connect": 0,
    "rx_icrc_encapsulated": 0,
    "rx_read_requests": 88_000,
    "rx_write_requests": 990_000,
    "resp_rnr_nak": 0,
    "req_cqe_error_ext": 0,
    "roce_cc_cnp_tx": 0,
    "dc_connect": 0,
    "bind_mw_ops": 0,
    "new_counter_from_a_future_driver": 7,
}


def write(path: Path, value: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"{value}\n")


def add_device(
    sysfs: Path,
    name: str,
    *,
    fw_ver: str = "28.39.1002",
    board_id: str | None = "MT_0000000838",
    hca_type: str | None = "MT4129",
    node_guid: str = "b83f:d203:00a1:2b3c",
) -> Path:
    dev = sysfs / "class" / "infiniband" / name
    dev.mkdir(parents=True, exist_ok=True)
    write(dev / "fw_ver", fw_ver)
    write(dev / "node_guid", node_guid)
    if board_id is not None:
        write(dev / "board_id", board_id)
    if hca_type is not None:
        write(dev / "hca_type", hca_type)
    return dev


def add_port(
    dev: Path,
    port: int,
    *,
    state: str = "4: ACTIVE",
    phys_state: str = "5: LinkUp",
    rate: str = "400 Gb/sec (4X NDR)",
    link_layer: str = "InfiniBand",
    counters: Mapping[str, object] | None = None,
    counters_ext: Mapping[str, object] | None = None,
    hw_counters: Mapping[str, object] | None = None,
) -> Path:
    p = dev / "ports" / str(port)
    p.mkdir(parents=True, exist_ok=True)
    write(p / "state", state)
    write(p / "phys_state", phys_state)
    write(p / "rate", rate)
    write(p / "link_layer", link_layer)
    for sub, values in (
        ("counters", counters),
        ("counters_ext", counters_ext),
        ("hw_counters", hw_counters),
    ):
        if values is None:
            continue
        (p / sub).mkdir(exist_ok=True)
        for key, value in values.items():
            write(p / sub / key, value)
    return p


def ndr_hca(sysfs: Path, name: str = "mlx5_0") -> Path:
    """An NDR InfiniBand HCA with counters/ and counters_ext/."""
    dev = add_device(sysfs, name)
    add_port(dev, 1, counters=IB_COUNTERS, counters_ext=IB_COUNTERS_EXT)
    return dev


def roce_hca(sysfs: Path, name: str = "mlx5_4") -> Path:
    """A RoCE (Ethernet link layer) port with counters/ and hw_counters/."""
    dev = add_device(sysfs, name, node_guid="a088:c203:0012:3456", board_id="MT_0000000970")
    add_port(
        dev,
        1,
        rate="200 Gb/sec (4X HDR)",
        link_layer="Ethernet",
        counters=IB_COUNTERS,
        hw_counters=ROCE_HW_COUNTERS,
    )
    return dev


def down_hca(sysfs: Path, name: str = "mlx5_7") -> Path:
    """An HCA whose port is down (cable pulled): counters still present."""
    dev = add_device(sysfs, name)
    add_port(
        dev,
        1,
        state="1: DOWN",
        phys_state="3: Disabled",
        rate="10 Gb/sec (4X SDR)",
        counters=dict.fromkeys(IB_COUNTERS, 0) | {"link_downed": 9},
    )
    return dev


def bench_tree(sysfs: Path, hcas: int = 8) -> None:
    """``hcas`` HCAs, one port each, ~30 counters + ~40 hw_counters per port."""
    for i in range(hcas):
        dev = add_device(sysfs, f"mlx5_{i}")
        add_port(
            dev,
            1,
            counters=IB_COUNTERS,
            counters_ext=IB_COUNTERS_EXT,
            hw_counters=ROCE_HW_COUNTERS,
        )


def files_under(root: Path) -> list[str]:
    return sorted(
        os.path.join(d, f) for d, _, fs in os.walk(root / "class" / "infiniband") for f in fs
    )
