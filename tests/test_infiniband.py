"""InfiniBand / RoCE source and metric families, on hand-made sysfs trees."""

from __future__ import annotations

import errno
import os
import re
import subprocess
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from exporter.collectors.infiniband import families as ibm
from exporter.collectors.infiniband import reading as ibs
from exporter.collectors.infiniband.families import DECLARED, infiniband_families
from exporter.collectors.infiniband.reading import (
    MAX_READ_BYTES,
    SKIP_REASONS,
    BadValue,
    InfinibandCollector,
    InfinibandReading,
    parse_counter,
    parse_rate,
    parse_state,
)
from exporter.sim import ib_tree
from tests.tools import require_binary

REPO = Path(__file__).resolve().parent.parent
U64_MAX = 2**64 - 1


# ---------------------------------------------------------------- parsers


@pytest.mark.parametrize(
    ("raw", "value"),
    [
        (b"0\n", 0),
        (b"17\n", 17),
        (b"  42 \n", 42),
        (b"007\n", 7),
        (b"18446744073709551615\n", U64_MAX),
    ],
)
def test_parse_counter_accepts(raw: bytes, value: int) -> None:
    assert parse_counter(raw) == value


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b"N/A (no PMA)\n", "not_available"),
        (b"", "empty"),
        (b" \n\n", "empty"),
        (b"abc\n", "garbage"),
        (b"0x10\n", "garbage"),
        (b"1.5\n", "garbage"),
        (b"12 34\n", "garbage"),
        (b"+5\n", "garbage"),
        (b"\xff\xfe\n", "garbage"),
        (b"-1\n", "negative"),
        (b"-18446744073709551616\n", "negative"),
        (b"18446744073709551616\n", "overflow"),
        (b"99999999999999999999999\n", "overflow"),
    ],
)
def test_parse_counter_rejects(raw: bytes, reason: str) -> None:
    with pytest.raises(BadValue) as exc:
        parse_counter(raw)
    assert exc.value.reason == reason


def test_parse_state() -> None:
    assert parse_state(b"4: ACTIVE\n") == (4, "ACTIVE")
    assert parse_state(b"5: LinkUp\n") == (5, "LinkUp")
    assert parse_state(b"1: DOWN\n") == (1, "DOWN")
    for bad, reason in ((b"ACTIVE\n", "garbage"), (b"4:\n", "garbage"), (b"\n", "empty")):
        with pytest.raises(BadValue) as exc:
            parse_state(bad)
        assert exc.value.reason == reason


def test_parse_rate() -> None:
    assert parse_rate(b"400 Gb/sec (4X NDR)\n") == 400 * 125_000_000
    assert parse_rate(b"2.5 Gb/sec (1X SDR)\n") == 2.5 * 125_000_000
    assert parse_rate(b"200 Gb/sec (4X HDR)\n") == 25e9
    for bad in (b"fast\n", b"400 Mb/sec\n", b"-1 Gb/sec\n"):
        with pytest.raises(BadValue):
            parse_rate(bad)


# ---------------------------------------------------------------- source, good trees


def _port(reading: InfinibandReading, device: str, port: int = 1) -> ibs.InfinibandPort:
    dev = {d.name: d for d in reading.devices}[device]
    return {p.port: p for p in dev.ports}[port]


def _no_skips(reading: InfinibandReading) -> bool:
    return not any(reading.skipped_total.values())


def test_missing_class_dir_means_no_devices(tmp_path: Path) -> None:
    (tmp_path / "class").mkdir()
    reading = InfinibandCollector(tmp_path).read()
    assert reading.devices == ()
    assert set(reading.skipped_total) == set(SKIP_REASONS)
    assert _no_skips(reading)
    # and the sysfs root itself missing is the same
    assert InfinibandCollector(tmp_path / "nope").read().devices == ()


def test_ndr_hca(tmp_path: Path) -> None:
    ib_tree.ndr_hca(tmp_path)
    reading = InfinibandCollector(tmp_path).read()
    assert _no_skips(reading)
    (dev,) = reading.devices
    assert (dev.name, dev.fw_ver, dev.board_id, dev.hca_type, dev.node_guid) == (
        "mlx5_0",
        "28.39.1002",
        "MT_0000000838",
        "MT4129",
        "b83f:d203:00a1:2b3c",
    )
    (port,) = dev.ports
    assert (port.device, port.port, port.link_layer) == ("mlx5_0", 1, "InfiniBand")
    assert (port.state_id, port.state, port.phys_state_id, port.phys_state) == (
        4,
        "ACTIVE",
        5,
        "LinkUp",
    )
    assert port.rate_bytes_per_second == 50e9
    # data counters count 4-octet words
    c, x = ib_tree.IB_COUNTERS, ib_tree.IB_COUNTERS_EXT
    assert port.counters["port_xmit_data"] == 4 * c["port_xmit_data"]
    assert port.counters["port_rcv_data"] == 4 * c["port_rcv_data"]
    assert port.counters_ext["port_xmit_data_64"] == 4 * x["port_xmit_data_64"]
    assert port.counters_ext["port_rcv_data_64"] == 4 * x["port_rcv_data_64"]
    # everything else as written
    for name, value in c.items():
        if name not in ibs.DATA_COUNTERS:
            assert port.counters[name] == value, name
    assert set(port.counters) == set(c)
    assert set(port.counters_ext) == set(x)
    assert port.hw_counters == {}
    assert port.lifespan_seconds is None


def test_roce_port_hw_counters_and_lifespan(tmp_path: Path) -> None:
    ib_tree.roce_hca(tmp_path)
    ibs_path = tmp_path / "class/infiniband/mlx5_4/ports/1/hw_counters/lifespan"
    ibs_path.write_text("1500\n")
    reading = InfinibandCollector(tmp_path).read()
    assert _no_skips(reading)
    port = _port(reading, "mlx5_4")
    assert port.link_layer == "Ethernet"
    assert port.lifespan_seconds == 1.5
    assert "lifespan" not in port.hw_counters
    expected = {k: float(v) for k, v in ib_tree.ROCE_HW_COUNTERS.items() if k != "lifespan"}
    assert dict(port.hw_counters) == expected
    assert port.hw_counters["new_counter_from_a_future_driver"] == 7


def test_down_port(tmp_path: Path) -> None:
    ib_tree.down_hca(tmp_path)
    port = _port(InfinibandCollector(tmp_path).read(), "mlx5_7")
    assert (port.state_id, port.state, port.phys_state_id, port.phys_state) == (
        1,
        "DOWN",
        3,
        "Disabled",
    )
    assert port.counters["link_downed"] == 9


def test_devices_and_ports_sorted_and_multi_port(tmp_path: Path) -> None:
    dev = ib_tree.add_device(tmp_path, "mlx5_1")
    for n in (2, 10, 1):
        ib_tree.add_port(dev, n, counters={"symbol_error": n})
    ib_tree.add_device(tmp_path, "mlx5_0")
    reading = InfinibandCollector(tmp_path).read()
    assert [d.name for d in reading.devices] == ["mlx5_0", "mlx5_1"]
    assert reading.devices[0].ports == ()
    assert [p.port for p in reading.devices[1].ports] == [1, 2, 10]
    assert [p.counters["symbol_error"] for p in reading.devices[1].ports] == [1, 2, 10]


def test_optional_identity_files_absent_not_counted(tmp_path: Path) -> None:
    ib_tree.add_device(tmp_path, "irdma0", board_id=None, hca_type=None)
    reading = InfinibandCollector(tmp_path).read()
    assert (reading.devices[0].board_id, reading.devices[0].hca_type) == ("", "")
    assert _no_skips(reading)


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        ("N/A (no PMA)", "not_available"),
        ("", "empty"),
        ("garbage!", "garbage"),
        ("-3", "negative"),
        (str(2**64), "overflow"),
    ],
)
@pytest.mark.parametrize("subdir", ["counters", "counters_ext", "hw_counters"])
def test_bad_value_skipped_alone_and_counted(
    tmp_path: Path, content: str, reason: str, subdir: str
) -> None:
    dev = ib_tree.add_device(tmp_path, "mlx5_0")
    good = {"symbol_error": 5, "port_xmit_data": 10}
    ib_tree.add_port(dev, 1, **{subdir: good | {"bad_one": content}})
    ib_tree.add_port(dev, 2, counters={"link_downed": 1})
    reading = InfinibandCollector(tmp_path).read()
    port = _port(reading, "mlx5_0")
    values = getattr(port, subdir)
    assert "bad_one" not in values
    assert values["symbol_error"] == 5
    assert values["port_xmit_data"] == 40
    assert port.state_id == 4 and port.rate_bytes_per_second == 50e9
    assert _port(reading, "mlx5_0", 2).counters == {"link_downed": 1}
    assert reading.skipped_total[reason] == 1
    assert sum(reading.skipped_total.values()) == 1


def test_u64_max_accepted_u64_overflow_rejected(tmp_path: Path) -> None:
    dev = ib_tree.add_device(tmp_path, "mlx5_0")
    ib_tree.add_port(dev, 1, counters={"symbol_error": U64_MAX, "link_downed": 2**64})
    reading = InfinibandCollector(tmp_path).read()
    port = _port(reading, "mlx5_0")
    assert port.counters == {"symbol_error": float(U64_MAX)}
    assert reading.skipped_total["overflow"] == 1


def test_bad_state_rate_link_layer_skip_only_themselves(tmp_path: Path) -> None:
    dev = ib_tree.add_device(tmp_path, "mlx5_0")
    p = ib_tree.add_port(
        dev, 1, state="ACTIVE", phys_state="", rate="lots", counters={"symbol_error": 1}
    )
    (p / "link_layer").write_bytes(b"Infini\x00Band\n")
    reading = InfinibandCollector(tmp_path).read()
    port = _port(reading, "mlx5_0")
    assert (port.state_id, port.state, port.phys_state_id, port.rate_bytes_per_second) == (
        None,
        None,
        None,
        None,
    )
    assert port.link_layer is None
    assert port.counters == {"symbol_error": 1}
    assert reading.skipped_total["garbage"] == 3
    assert reading.skipped_total["empty"] == 1


def test_counter_that_is_a_directory_is_not_a_file(tmp_path: Path) -> None:
    dev = ib_tree.add_device(tmp_path, "mlx5_0")
    p = ib_tree.add_port(dev, 1, counters={"symbol_error": 1})
    (p / "counters" / "link_downed").mkdir()
    (p / "rate").unlink()
    (p / "rate").mkdir()
    reading = InfinibandCollector(tmp_path).read()
    port = _port(reading, "mlx5_0")
    assert port.counters == {"symbol_error": 1}
    assert port.rate_bytes_per_second is None
    assert reading.skipped_total["not_a_file"] == 2 and reading.skipped_total["read_error"] == 0


@pytest.mark.parametrize("err", [errno.EINVAL, errno.EACCES, errno.EOPNOTSUPP, errno.EIO])
def test_read_errno_skips_that_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, err: int
) -> None:
    dev = ib_tree.add_device(tmp_path, "mlx5_0")
    ib_tree.add_port(dev, 1, counters={"symbol_error": 1, "port_xmit_data": 3})
    failing: set[int] = set()
    real_open, real_read = os.open, os.read

    def fake_open(path: str, flags: int, *args: object, **kw: object) -> int:
        fd = real_open(path, flags, *args, **kw)
        if os.path.basename(str(path)) == "port_xmit_data":
            failing.add(fd)
        return fd

    def fake_read(fd: int, n: int) -> bytes:
        if fd in failing:
            failing.discard(fd)
            raise OSError(err, os.strerror(err))
        return real_read(fd, n)

    monkeypatch.setattr(ibs.os, "open", fake_open)
    monkeypatch.setattr(ibs.os, "read", fake_read)
    reading = InfinibandCollector(tmp_path).read()
    assert _port(reading, "mlx5_0").counters == {"symbol_error": 1}
    assert reading.skipped_total["read_error"] == 1
    assert sum(reading.skipped_total.values()) == 1


def test_open_eacces_skips_that_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    dev = ib_tree.add_device(tmp_path, "mlx5_0")
    ib_tree.add_port(dev, 1, hw_counters={"rnr_nak_retry_err": 1, "out_of_buffer": 2})
    real_open = os.open

    def fake_open(path: str, flags: int, *args: object, **kw: object) -> int:
        if os.path.basename(str(path)) == "out_of_buffer":
            raise PermissionError(errno.EACCES, "Permission denied")
        return real_open(path, flags, *args, **kw)

    monkeypatch.setattr(ibs.os, "open", fake_open)
    reading = InfinibandCollector(tmp_path).read()
    assert _port(reading, "mlx5_0").hw_counters == {"rnr_nak_retry_err": 1}
    assert reading.skipped_total["read_error"] == 1


def test_dangling_counter_is_vanished(tmp_path: Path) -> None:
    dev = ib_tree.add_device(tmp_path, "mlx5_0")
    p = ib_tree.add_port(dev, 1, counters={"symbol_error": 1})
    (p / "counters" / "link_downed").symlink_to(tmp_path / "gone")
    reading = InfinibandCollector(tmp_path).read()
    assert _port(reading, "mlx5_0").counters == {"symbol_error": 1}
    assert reading.skipped_total["vanished"] == 1


def test_file_vanishing_between_listing_and_reading(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dev = ib_tree.add_device(tmp_path, "mlx5_0")
    ib_tree.add_port(dev, 1, counters={"symbol_error": 1, "link_downed": 2})
    real_list = ibs._list_dir

    def list_then_remove(path: str) -> list[str] | None:
        names = real_list(path)
        if path.endswith("/counters"):
            os.unlink(os.path.join(path, "link_downed"))
        return names

    monkeypatch.setattr(ibs, "_list_dir", list_then_remove)
    reading = InfinibandCollector(tmp_path).read()
    assert _port(reading, "mlx5_0").counters == {"symbol_error": 1}
    assert reading.skipped_total["vanished"] == 1


def test_whole_device_vanishing_mid_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ib_tree.ndr_hca(tmp_path, "mlx5_0")
    ib_tree.ndr_hca(tmp_path, "mlx5_1")
    real_list = ibs._list_dir

    def list_then_unplug(path: str) -> list[str] | None:
        names = real_list(path)
        if path.endswith("class/infiniband"):
            import shutil

            shutil.rmtree(os.path.join(path, "mlx5_0"))
        return names

    monkeypatch.setattr(ibs, "_list_dir", list_then_unplug)
    reading = InfinibandCollector(tmp_path).read()
    assert [d.name for d in reading.devices] == ["mlx5_1"]
    assert len(reading.devices[0].ports[0].counters) == len(ib_tree.IB_COUNTERS)
    assert reading.skipped_total["vanished"] == 1


def test_bad_port_and_counter_names(tmp_path: Path) -> None:
    dev = ib_tree.add_device(tmp_path, "mlx5_0")
    p = ib_tree.add_port(dev, 1, counters={"symbol_error": 1, "we ird": 3})
    (dev / "ports" / "x1").mkdir()
    reading = InfinibandCollector(tmp_path).read()
    assert [pt.port for pt in reading.devices[0].ports] == [1]
    assert _port(reading, "mlx5_0").counters == {"symbol_error": 1}
    assert reading.skipped_total["bad_name"] == 2
    assert p.exists()


def test_bad_device_name_and_unlistable_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ib_tree.ndr_hca(tmp_path, "mlx5_0")
    ib_tree.ndr_hca(tmp_path, "mlx5 evil\u200b")
    dev = ib_tree.add_device(tmp_path, "mlx5_1")
    ib_tree.add_port(dev, 1, counters={"symbol_error": 1}, hw_counters={"out_of_buffer": 1})
    real_list = ibs._list_dir

    def deny(path: str) -> list[str] | None:
        if path.endswith("mlx5_1/ports/1/hw_counters"):
            raise PermissionError(errno.EACCES, "Permission denied")
        return real_list(path)

    monkeypatch.setattr(ibs, "_list_dir", deny)
    reading = InfinibandCollector(tmp_path).read()
    assert [d.name for d in reading.devices] == ["mlx5_0", "mlx5_1"]
    port = _port(reading, "mlx5_1")
    assert (port.counters, port.hw_counters) == ({"symbol_error": 1}, {})
    assert (reading.skipped_total["bad_name"], reading.skipped_total["read_error"]) == (1, 1)


def test_each_file_read_with_one_bounded_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dev = ib_tree.add_device(tmp_path, "mlx5_0")
    p = ib_tree.add_port(dev, 1, counters={"symbol_error": 1})
    (p / "counters" / "huge").write_text("9" * 10_000)
    sizes: list[int] = []
    real_read = os.read

    def spy(fd: int, n: int) -> bytes:
        sizes.append(n)
        return real_read(fd, n)

    monkeypatch.setattr(ibs.os, "read", spy)
    reading = InfinibandCollector(tmp_path).read()
    files = len(ib_tree.files_under(tmp_path))
    assert len(sizes) == files  # one read per file, no read loop
    assert max(sizes) == MAX_READ_BYTES
    assert reading.skipped_total["overflow"] == 1  # 4096 nines, cut off, still too big


def test_skipped_total_is_cumulative(tmp_path: Path) -> None:
    dev = ib_tree.add_device(tmp_path, "mlx5_0")
    ib_tree.add_port(dev, 1, counters={"symbol_error": "N/A (no PMA)", "link_downed": "-1"})
    source = InfinibandCollector(tmp_path)
    first = source.read().skipped_total
    second = source.read().skipped_total
    assert (first["not_available"], first["negative"]) == (1, 1)
    assert (second["not_available"], second["negative"]) == (2, 2)
    assert first["not_available"] == 1  # an earlier reading is not changed afterwards
    assert InfinibandCollector(tmp_path).read().skipped_total["not_available"] == 1


# ---------------------------------------------------------------- metric families


def _full_tree(root: Path) -> None:
    ib_tree.ndr_hca(root)
    ib_tree.roce_hca(root)
    ib_tree.down_hca(root)
    ib_tree.add_port(root / "class/infiniband/mlx5_0", 2, counters={"unknown_new_counter": 5})


def _render(reading: InfinibandReading) -> bytes:
    class Collector:
        def collect(self):  # type: ignore[no-untyped-def]
            return infiniband_families(reading)

    registry = CollectorRegistry()
    registry.register(Collector())
    return generate_latest(registry)


def _samples(text: bytes) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    out = {}
    for fam in text_string_to_metric_families(text.decode()):
        for s in fam.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def _key(name: str, **labels: str) -> tuple[str, frozenset[tuple[str, str]]]:
    return (name, frozenset(labels.items()))


def test_families_values(tmp_path: Path) -> None:
    _full_tree(tmp_path)
    (tmp_path / "class/infiniband/mlx5_0/ports/1/counters/symbol_error").write_text("N/A\n")
    samples = _samples(_render(InfinibandCollector(tmp_path).read()))
    ib0 = {"device": "mlx5_0", "port": "1"}
    roce = {"device": "mlx5_4", "port": "1"}
    c = ib_tree.IB_COUNTERS
    assert samples[_key("infiniband_port_transmit_bytes_total", **ib0)] == 4 * c["port_xmit_data"]
    assert samples[_key("infiniband_port_receive_bytes_total", **ib0)] == 4 * c["port_rcv_data"]
    assert samples[_key("infiniband_port_ext_receive_bytes_total", **ib0)] == 4 * c["port_rcv_data"]
    assert samples[_key("infiniband_port_link_downed_total", **ib0)] == c["link_downed"]
    assert _key("infiniband_port_symbol_errors_total", **ib0) not in samples
    assert samples[_key("infiniband_port_symbol_errors_total", **roce)] == c["symbol_error"]
    assert samples[_key("infiniband_port_rnr_nak_retry_errors_total", **roce)] == 1
    assert samples[_key("infiniband_port_lifespan_seconds", **roce)] == 0.010
    assert (
        samples[
            _key(
                "infiniband_port_hw_events_total",
                counter="new_counter_from_a_future_driver",
                **roce,
            )
        ]
        == 7
    )
    assert (
        samples[
            _key(
                "infiniband_port_events_total",
                counter="unknown_new_counter",
                device="mlx5_0",
                port="2",
            )
        ]
        == 5
    )
    assert samples[_key("infiniband_port_rate_bytes_per_second", **roce)] == 25e9
    assert samples[_key("infiniband_port_state_id", device="mlx5_7", port="1")] == 1
    assert samples[_key("infiniband_port_physical_state_id", device="mlx5_7", port="1")] == 3
    assert (
        samples[
            _key(
                "infiniband_port_info",
                link_layer="Ethernet",
                state="ACTIVE",
                phys_state="LinkUp",
                **roce,
            )
        ]
        == 1
    )
    assert (
        samples[
            _key(
                "infiniband_device_info",
                device="mlx5_4",
                board_id="MT_0000000970",
                firmware_version="28.39.1002",
                hca_type="MT4129",
                node_guid="a088:c203:0012:3456",
            )
        ]
        == 1
    )
    assert samples[_key("cte_infiniband_skipped_values_total", reason="not_available")] == 1
    assert samples[_key("cte_infiniband_skipped_values_total", reason="overflow")] == 0
    # the alert counters have dedicated families, not the generic one
    generic = {dict(k[1]).get("counter") for k in samples if k[0].endswith("hw_events_total")}
    assert not generic & set(ibm.HW_COUNTERS)
    assert "lifespan" not in generic


def test_every_port_series_has_device_and_port(tmp_path: Path) -> None:
    _full_tree(tmp_path)
    text = _render(InfinibandCollector(tmp_path).read())
    specs = {s.name: s for s in DECLARED}
    seen = set()
    for fam in text_string_to_metric_families(text.decode()):
        for s in fam.samples:
            spec = specs[s.name]  # every emitted family is declared (and documented)
            seen.add(s.name)
            assert set(s.labels) == set(spec.labels), s.name
    declared = {s.name for s in DECLARED}
    assert declared - seen == set()  # the full tree exercises every family


def test_no_devices_renders_only_self_metric(tmp_path: Path) -> None:
    text = _render(InfinibandCollector(tmp_path).read())
    names = {s.name for f in text_string_to_metric_families(text.decode()) for s in f.samples}
    assert names == {"cte_infiniband_skipped_values_total"}


def test_promtool_check_metrics_is_silent(tmp_path: Path) -> None:
    promtool = require_binary("promtool")
    _full_tree(tmp_path)
    (tmp_path / "class/infiniband/mlx5_0/ports/1/counters/symbol_error").write_text("-1\n")
    text = _render(InfinibandCollector(tmp_path).read())
    assert b"infiniband_port_transmit_bytes_total" in text
    proc = subprocess.run(
        [promtool, "check", "metrics"], input=text, capture_output=True, timeout=30
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == b"" and proc.stderr == b""


# ---------------------------------------------------------------- docs in step


def _doc_rows() -> dict[str, list[str]]:
    text = (REPO / "docs" / "metrics.md").read_text()
    section = text.split("\n## InfiniBand / RoCE\n", 1)[1].split("\n## ", 1)[0]
    lines = [ln.strip() for ln in section.splitlines() if ln.strip().startswith("|")]
    assert lines[0] == "| Metric | Type | Unit | Labels | Source | Description |"
    assert lines[1] == "|---|---|---|---|---|---|"
    rows = {}
    for ln in lines[2:]:
        cells = [c.strip() for c in ln.strip("|").split("|")]
        assert len(cells) == 6, ln
        name = re.fullmatch(r"`([a-z0-9_]+)`", cells[0])
        assert name, ln
        rows[name.group(1)] = cells
    return rows


def test_docs_list_every_family_exactly() -> None:
    rows = _doc_rows()
    assert set(rows) == {s.name for s in DECLARED}
    for spec in DECLARED:
        _, type_, _, labels, _, _ = rows[spec.name]
        assert type_ == spec.type, spec.name
        assert labels == ", ".join(f"`{label}`" for label in spec.labels), spec.name


def test_a_file_where_a_port_or_device_should_be_is_skipped(tmp_path: Path) -> None:
    """A file named like a port must not be exported as a port."""
    dev = ib_tree.add_device(tmp_path, "mlx5_0")
    ib_tree.add_port(dev, 1, counters={"symbol_error": 1})
    (dev / "ports" / "2").write_text("not a port\n")
    (tmp_path / "class" / "infiniband" / "mlx5_9").write_text("not a device\n")
    reading = InfinibandCollector(tmp_path).read()
    assert [d.name for d in reading.devices] == ["mlx5_0"]
    assert [p.port for p in reading.devices[0].ports] == [1]
    assert reading.skipped_total["not_a_directory"] == 2
    assert reading.skipped_total["vanished"] == 0


def test_a_fifo_among_the_counters_is_skipped_without_blocking(tmp_path):
    """A FIFO (or a hung firmware file) under counters/ would wedge a read in open(),
    freezing the other counters while the source reported success."""
    ib_tree.ndr_hca(tmp_path)
    counters = tmp_path / "class/infiniband/mlx5_0/ports/1/counters"
    (counters / "port_rcv_errors").unlink()
    os.mkfifo(counters / "port_rcv_errors")
    source = ibs.InfinibandCollector(tmp_path)
    first = source.read()  # returns at once: the FIFO is not opened for a blocking read
    port = first.devices[0].ports[0]
    assert "port_rcv_errors" not in port.counters
    assert first.skipped_total["not_a_file"] == 1
    ib_tree.write(counters / "symbol_error", 9)  # the other counters keep updating
    assert source.read().devices[0].ports[0].counters["symbol_error"] == 9
