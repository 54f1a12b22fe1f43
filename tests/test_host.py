"""Host figures through psutil: a stand-in psutil for chosen values, and the real one."""

from __future__ import annotations

import re
import time
from collections import namedtuple
from types import SimpleNamespace

import pytest
from prometheus_client.parser import text_string_to_metric_families

from exporter.collectors.host.families import host_families
from exporter.collectors.host.reading import (
    DEFAULT_NETWORK_EXCLUDE,
    CpuTimes,
    HostCollector,
    cpu_busy_ratio,
    keep_interface,
)

# psutil's Linux field sets
CpuT = namedtuple("CpuT", "user nice system idle iowait irq softirq steal guest guest_nice")
Mem = namedtuple("Mem", "total available percent used free")
Nic = namedtuple("Nic", "bytes_sent bytes_recv packets_sent packets_recv errin errout "
                 "dropin dropout")


class FakePsutil:
    """Answers the calls HostCollector makes with values a test sets."""

    def __init__(self):
        self.times = CpuT(100.0, 0.0, 50.0, 800.0, 50.0, 0.0, 0.0, 0.0, 0.0, 0.0)
        self.nics = {
            "lo": Nic(9, 9, 1, 1, 0, 0, 0, 0),
            "eth0": Nic(2000, 1000, 20, 10, 1, 2, 3, 4),
            "ens1f0np0": Nic(5, 6, 1, 1, 0, 0, 0, 0),
            "docker0": Nic(1, 1, 1, 1, 0, 0, 0, 0),
            "veth1234": Nic(1, 1, 1, 1, 0, 0, 0, 0),
            "cali12ab": Nic(1, 1, 1, 1, 0, 0, 0, 0),
        }
        self.failing: set[str] = set()

    def _check(self, name):
        if name in self.failing:
            raise OSError(5, f"{name} failed")

    def cpu_times(self):
        self._check("cpu_times")
        return self.times

    def cpu_count(self, logical=True):
        self._check("cpu_count")
        return 64

    def virtual_memory(self):
        self._check("virtual_memory")
        return Mem(total=2 * 2**40, available=1.5 * 2**40, percent=25.0, used=0.4 * 2**40,
                   free=1.2 * 2**40)

    def getloadavg(self):
        self._check("getloadavg")
        return (12.5, 10.0, 8.25)

    def net_io_counters(self, pernic=False):
        self._check("net_io_counters")
        return dict(self.nics)


def families(reading) -> dict[str, dict[tuple, float]]:
    from prometheus_client.exposition import generate_latest

    class Registry:
        def collect(self):
            return host_families(reading)

    text = generate_latest(Registry()).decode()
    out: dict[str, dict[tuple, float]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def test_cpu_busy_ratio():
    assert cpu_busy_ratio(CpuTimes(10, 100), CpuTimes(40, 200)) == pytest.approx(0.3)
    assert cpu_busy_ratio(CpuTimes(10, 100), CpuTimes(10, 100)) is None  # no time passed
    assert cpu_busy_ratio(CpuTimes(10, 100), CpuTimes(5, 50)) is None  # went back
    assert cpu_busy_ratio(CpuTimes(10, 100), CpuTimes(200, 150)) == 1.0  # clamped


def test_cpu_times_busy_excludes_idle_iowait_and_double_counted_guest():
    t = CpuT(user=100, nice=10, system=50, idle=800, iowait=40, irq=1, softirq=2, steal=3,
             guest=20, guest_nice=5)  # guest is inside user, guest_nice inside nice
    times = CpuTimes.from_psutil(t)
    assert times.total == pytest.approx(1006)
    assert times.busy == pytest.approx(166)


@pytest.mark.parametrize(("name", "kept"), [
    ("eth0", True), ("ens1f0np0", True), ("bond0", True), ("ib0", True), ("lo", False),
    ("docker0", False), ("veth9a8b", False), ("virbr0", False), ("cni0", False),
    ("flannel.1", False), ("cali1234", False), ("lo2", True),
])
def test_default_network_exclude(name, kept):
    assert keep_interface(name, re.compile(DEFAULT_NETWORK_EXCLUDE)) is kept


def test_reading_with_chosen_values():
    ps = FakePsutil()
    source = HostCollector(ps=ps)
    first = source.read()
    assert first.cpu_utilization_ratio is None  # the first read is the baseline
    ps.times = ps.times._replace(user=130.0, system=60.0, idle=850.0, iowait=60.0)  # +40 busy
    reading = source.read()
    assert reading.cpu_utilization_ratio == pytest.approx(40 / 100)
    out = families(reading)
    assert out["host_cpu_utilization_ratio"] == {(): pytest.approx(0.4)}
    assert out["host_cpus"] == {(): 64}
    assert out["host_memory_total_bytes"] == {(): 2 * 2**40}
    assert out["host_memory_available_bytes"] == {(): 1.5 * 2**40}
    assert out["host_memory_used_bytes"] == {(): 0.4 * 2**40}
    assert (out["host_load1"], out["host_load5"], out["host_load15"]) == (
        {(): 12.5}, {(): 10.0}, {(): 8.25})
    eth0 = (("interface", "eth0"),)
    assert set(out["host_network_receive_bytes_total"]) == {eth0, (("interface", "ens1f0np0"),)}
    assert out["host_network_receive_bytes_total"][eth0] == 1000
    assert out["host_network_transmit_bytes_total"][eth0] == 2000
    assert out["host_network_receive_errors_total"][eth0] == 1
    assert out["host_network_transmit_errors_total"][eth0] == 2
    assert out["host_network_receive_drops_total"][eth0] == 3
    assert out["host_network_transmit_drops_total"][eth0] == 4
    assert set(out["cte_host_read_errors_total"].values()) == {0}


def test_custom_exclude_and_interface_cap():
    ps = FakePsutil()
    ps.nics = {f"eth{i}": Nic(i, i, 0, 0, 0, 0, 0, 0) for i in range(10)}
    reading = HostCollector(network_exclude=r"^eth[0-2]$", ps=ps, max_interfaces=4).read()
    assert list(reading.network) == ["eth3", "eth4", "eth5", "eth6"]


def test_failing_calls_leave_out_only_their_part_and_are_counted():
    ps = FakePsutil()
    ps.failing = {"getloadavg", "net_io_counters"}
    source = HostCollector(ps=ps)
    source.read()
    reading = source.read()
    assert reading.load is None and dict(reading.network) == {}
    assert reading.memory_total_bytes == 2 * 2**40 and reading.cpu_count == 64
    out = families(reading)
    assert "host_load1" not in out and "host_network_receive_bytes_total" not in out
    errors = {dict(k)["call"]: v for k, v in out["cte_host_read_errors_total"].items()}
    assert errors == {"cpu_times": 0, "cpu_count": 0, "virtual_memory": 0, "getloadavg": 2,
                      "net_io_counters": 2}


def test_missing_cpu_times_means_no_utilization():
    ps = FakePsutil()
    source = HostCollector(ps=ps)
    source.read()
    ps.failing = {"cpu_times"}
    assert source.read().cpu_utilization_ratio is None
    ps.failing = set()
    assert source.read().cpu_utilization_ratio is None  # unchanged times: no time passed


def test_psutil_without_a_function_is_handled():
    ps = SimpleNamespace(**{n: getattr(FakePsutil(), n) for n in
                            ("cpu_times", "cpu_count", "virtual_memory", "net_io_counters")})
    reading = HostCollector(ps=ps).read()  # no getloadavg on this platform
    assert reading.load is None and reading.errors_total["getloadavg"] == 1


def test_real_psutil_values_are_sane():
    source = HostCollector()
    source.read()
    deadline = time.monotonic() + 0.1
    while time.monotonic() < deadline:  # let CPU time pass, at least a few ticks
        pass
    reading = source.read()
    assert reading.cpu_count is not None and 1 <= reading.cpu_count <= 4096
    assert reading.cpu_utilization_ratio is not None
    assert 0.0 < reading.cpu_utilization_ratio <= 1.0
    total, used, avail = (reading.memory_total_bytes, reading.memory_used_bytes,
                          reading.memory_available_bytes)
    assert total is not None and used is not None and avail is not None
    assert 64 * 2**20 <= total <= 2**50
    assert 0 < used <= total and 0 < avail <= total
    assert reading.load is not None and all(0 <= x < 10_000 for x in reading.load)
    assert "lo" not in reading.network
    for name, nic in reading.network.items():
        assert keep_interface(name, re.compile(DEFAULT_NETWORK_EXCLUDE))
        for value in nic.__dict__.values():
            assert value >= 0
    later = source.read()
    for name, nic in later.network.items():  # counters never go down
        if name in reading.network:
            assert nic.receive_bytes >= reading.network[name].receive_bytes
            assert nic.transmit_bytes >= reading.network[name].transmit_bytes
    assert all(v == 0 for v in later.errors_total.values())
