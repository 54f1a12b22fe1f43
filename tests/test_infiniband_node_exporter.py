"""Differential test: our InfiniBand values against node_exporter's on the same sysfs tree.

node_exporter (Debian package ``prometheus-node-exporter``, 1.5) reads ``counters/`` and
``counters_ext/`` of every port; it reads neither ``hw_counters/`` nor devices that lack
``counters/`` or ``board_id``/``hca_type`` (its whole collector fails on those), so those
parts are checked against the values written into the tree instead.
"""

from __future__ import annotations

import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from exporter.collectors.infiniband.families import infiniband_families
from exporter.collectors.infiniband.reading import InfinibandCollector
from exporter.sim import ib_tree
from tests.tools import require_binary

NODE_EXPORTER = "prometheus-node-exporter"

#: node_exporter sample name (without ``node_infiniband_``) -> ours.
NE_TO_OURS: dict[str, str] = {
    "excessive_buffer_overrun_errors_total": "port_excessive_buffer_overrun_errors_total",
    "link_downed_total": "port_link_downed_total",
    "link_error_recovery_total": "port_link_error_recovery_total",
    "local_link_integrity_errors_total": "port_local_link_integrity_errors_total",
    "multicast_packets_received_total": "port_multicast_receive_packets_total",
    "multicast_packets_transmitted_total": "port_multicast_transmit_packets_total",
    "physical_state_id": "port_physical_state_id",
    "port_constraint_errors_received_total": "port_receive_constraint_errors_total",
    "port_constraint_errors_transmitted_total": "port_transmit_constraint_errors_total",
    "port_data_received_bytes_total": "port_receive_bytes_total",
    "port_data_transmitted_bytes_total": "port_transmit_bytes_total",
    "port_discards_received_total": "port_receive_discards_total",
    "port_discards_transmitted_total": "port_transmit_discards_total",
    "port_errors_received_total": "port_receive_errors_total",
    "port_packets_received_total": "port_receive_packets_total",
    "port_packets_transmitted_total": "port_transmit_packets_total",
    "port_receive_remote_physical_errors_total": "port_receive_remote_physical_errors_total",
    "port_receive_switch_relay_errors_total": "port_receive_switch_relay_errors_total",
    "port_transmit_wait_total": "port_transmit_wait_total",
    "rate_bytes_per_second": "port_rate_bytes_per_second",
    "state_id": "port_state_id",
    "symbol_error_total": "port_symbol_errors_total",
    "unicast_packets_received_total": "port_unicast_receive_packets_total",
    "unicast_packets_transmitted_total": "port_unicast_transmit_packets_total",
    "vl15_dropped_total": "port_vl15_dropped_total",
    "legacy_data_received_bytes_total": "port_ext_receive_bytes_total",
    "legacy_data_transmitted_bytes_total": "port_ext_transmit_bytes_total",
    "legacy_multicast_packets_received_total": "port_ext_multicast_receive_packets_total",
    "legacy_multicast_packets_transmitted_total": "port_ext_multicast_transmit_packets_total",
    "legacy_packets_received_total": "port_ext_receive_packets_total",
    "legacy_packets_transmitted_total": "port_ext_transmit_packets_total",
    "legacy_unicast_packets_received_total": "port_ext_unicast_receive_packets_total",
    "legacy_unicast_packets_transmitted_total": "port_ext_unicast_transmit_packets_total",
}
OUR_COMPARED = {"infiniband_" + v for v in NE_TO_OURS.values()}

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as resp:  # noqa: S310 (loopback only)
        return resp.read().decode()


@pytest.fixture
def node_exporter() -> Iterator[Callable[[Path], str]]:
    """``scrape(tree)``: start node_exporter on ``tree`` (loopback), return its /metrics."""
    binary = require_binary(NODE_EXPORTER)
    procs: list[subprocess.Popen[bytes]] = []

    def scrape(tree: Path) -> str:
        port = _free_port()
        proc = subprocess.Popen(
            [
                binary,
                f"--path.sysfs={tree}",
                "--collector.disable-defaults",
                "--collector.infiniband",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        procs.append(proc)
        deadline = time.monotonic() + 15
        while True:
            if proc.poll() is not None:
                pytest.fail(f"node_exporter exited: {proc.stderr.read().decode()[-2000:]}")
            try:
                return _get(f"http://127.0.0.1:{port}/metrics")
            except (urllib.error.URLError, ConnectionError):
                if time.monotonic() > deadline:
                    pytest.fail("node_exporter did not answer within 15 s")
                time.sleep(0.05)

    try:
        yield scrape
    finally:
        for proc in procs:
            proc.kill()
            proc.wait(timeout=10)
            if proc.stderr:
                proc.stderr.close()


def _parse(text: str) -> Samples:
    out: Samples = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def _ours(tree: Path) -> Samples:
    reading = InfinibandCollector(tree).read()

    class Collector:
        def collect(self):  # type: ignore[no-untyped-def]
            return infiniband_families(reading)

    registry = CollectorRegistry()
    registry.register(Collector())
    return _parse(generate_latest(registry).decode())


def _compare(ne: Samples, ours: Samples) -> int:
    """Every node_exporter InfiniBand value equals ours, and the other way round."""
    assert ne[("node_scrape_collector_success", frozenset({("collector", "infiniband")}))] == 1
    compared = 0
    mapped: set[tuple[str, frozenset[tuple[str, str]]]] = set()
    for (name, labels), value in ne.items():
        if not name.startswith("node_infiniband_"):
            continue
        short = name.removeprefix("node_infiniband_")
        if short == "info":
            lab = dict(labels)
            ours_info = [
                dict(k[1])
                for k in ours
                if k[0] == "infiniband_device_info" and dict(k[1])["device"] == lab["device"]
            ]
            assert len(ours_info) == 1, lab
            for key, val in lab.items():
                assert ours_info[0][key] == val, (key, lab)
            compared += 1
            continue
        assert short in NE_TO_OURS, f"node_exporter metric without a mapping: {name}"
        key = ("infiniband_" + NE_TO_OURS[short], labels)
        assert key in ours, f"we lack {key} that node_exporter has ({name})"
        assert ours[key] == value, (name, dict(labels), value, ours[key])
        mapped.add(key)
        compared += 1
    # nothing we export in a compared family is missing from node_exporter
    extra = {k for k in ours if k[0] in OUR_COMPARED} - mapped
    assert extra == set(), extra
    return compared


def test_ndr_ib_hca(tmp_path: Path, node_exporter: Callable[[Path], str]) -> None:
    ib_tree.ndr_hca(tmp_path)
    compared = _compare(_parse(node_exporter(tmp_path)), _ours(tmp_path))
    # info + state, phys state, rate + every counter and counters_ext file
    assert compared == 1 + 3 + len(ib_tree.IB_COUNTERS) + len(ib_tree.IB_COUNTERS_EXT)


def test_roce_port_with_hw_counters(tmp_path: Path, node_exporter: Callable[[Path], str]) -> None:
    ib_tree.roce_hca(tmp_path)
    ours = _ours(tmp_path)
    compared = _compare(_parse(node_exporter(tmp_path)), ours)
    assert compared == 1 + 3 + len(ib_tree.IB_COUNTERS)
    # node_exporter 1.5 does not read hw_counters/: check against what was written
    labels = {"device": "mlx5_4", "port": "1"}
    hw = ib_tree.ROCE_HW_COUNTERS
    lab = frozenset(labels.items())
    assert ours[("infiniband_port_rnr_nak_retry_errors_total", lab)] == hw["rnr_nak_retry_err"]
    assert (
        ours[("infiniband_port_local_ack_timeout_errors_total", lab)] == hw["local_ack_timeout_err"]
    )
    assert ours[("infiniband_port_cnp_handled_total", lab)] == hw["rp_cnp_handled"]
    assert ours[("infiniband_port_lifespan_seconds", lab)] == hw["lifespan"] / 1000
    generic = {
        dict(k[1])["counter"]: v
        for k, v in ours.items()
        if k[0] == "infiniband_port_hw_events_total"
    }
    assert generic["new_counter_from_a_future_driver"] == 7
    assert generic["roce_adp_retrans"] == hw["roce_adp_retrans"]
    info = [dict(k[1]) for k in ours if k[0] == "infiniband_port_info"]
    assert info == [labels | {"link_layer": "Ethernet", "state": "ACTIVE", "phys_state": "LinkUp"}]


def test_down_port(tmp_path: Path, node_exporter: Callable[[Path], str]) -> None:
    ib_tree.down_hca(tmp_path)
    ours = _ours(tmp_path)
    _compare(_parse(node_exporter(tmp_path)), ours)
    lab = frozenset({"device": "mlx5_7", "port": "1"}.items())
    assert ours[("infiniband_port_state_id", lab)] == 1
    assert ours[("infiniband_port_physical_state_id", lab)] == 3
    assert ours[("infiniband_port_link_downed_total", lab)] == 9


def test_mixed_node_with_unavailable_counters(
    tmp_path: Path, node_exporter: Callable[[Path], str]
) -> None:
    """Several HCAs, a two-port HCA, large values and ``N/A (no PMA)`` files."""
    ib_tree.ndr_hca(tmp_path, "mlx5_0")
    ib_tree.roce_hca(tmp_path, "mlx5_1")
    ib_tree.down_hca(tmp_path, "mlx5_2")
    dev = ib_tree.add_device(tmp_path, "mlx5_3", hca_type="MT4123")
    big = 2**61 + 12_345  # x4 stays below 2^64 (node_exporter multiplies in uint64)
    ib_tree.add_port(
        dev,
        1,
        rate="2.5 Gb/sec (1X SDR)",
        counters={"port_xmit_data": big, "port_rcv_data": 0, "symbol_error": "N/A (no PMA)"},
    )
    ib_tree.add_port(
        dev,
        2,
        state="2: INIT",
        phys_state="2: Polling",
        counters={"link_downed": "N/A (no PMA)", "port_xmit_wait": 2**63},
        counters_ext={"port_xmit_data_64": big},
    )
    ours = _ours(tmp_path)
    compared = _compare(_parse(node_exporter(tmp_path)), ours)
    n, x = len(ib_tree.IB_COUNTERS), len(ib_tree.IB_COUNTERS_EXT)
    # 4 infos; 3 state/phys/rate per port; counters (N/A ones skipped by both sides)
    assert compared == 4 + 3 * 5 + (n + x) + n + n + 2 + (1 + 1)
    skipped = ("cte_infiniband_skipped_values_total", frozenset({("reason", "not_available")}))
    assert ours[skipped] == 2


def test_device_without_counters_dir(tmp_path: Path) -> None:
    """node_exporter 1.5 cannot read such a device; we export what is there."""
    dev = ib_tree.add_device(tmp_path, "rocep1s0", board_id=None, hca_type=None)
    ib_tree.add_port(dev, 1, link_layer="Ethernet", hw_counters={"rnr_nak_retry_err": 3})
    ours = _ours(tmp_path)
    lab = frozenset({"device": "rocep1s0", "port": "1"}.items())
    assert ours[("infiniband_port_rnr_nak_retry_errors_total", lab)] == 3
    assert ours[("infiniband_port_state_id", lab)] == 4
    assert not [k for k in ours if k[0] == "infiniband_port_transmit_bytes_total"]
    info = [dict(k[1]) for k in ours if k[0] == "infiniband_device_info"]
    assert [(i["device"], i["board_id"], i["hca_type"]) for i in info] == [("rocep1s0", "", "")]
