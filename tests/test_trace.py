"""Trace readers (nvidia-smi CSV, cte) and the cte writer."""

from __future__ import annotations

import gzip
import math
from pathlib import Path

import numpy as np
import pytest

from exporter.traces.load import load_trace
from exporter.traces.trace import TraceError, TraceWriter
from tests.tools import REAL_TRACE

REAL = REAL_TRACE


def write(tmp_path: Path, text: str, name: str = "t.csv") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


WITH_UNITS = """\
timestamp, index, pci.bus_id, power.draw [W], power.draw.instant [W], temperature.gpu, \
utilization.gpu [%], clocks.current.sm [MHz], memory.used [MiB], power.limit [W], \
clocks_event_reasons.active
2025/09/24 03:17:04.490, 0, 00000000:18:00.0, 397.30 W, 650.10 W, 48, 100 %, 1980 MHz, \
81559 MiB, 700.00 W, 0x0000000000000004
2025/09/24 03:17:04.490, 1, 00000000:2A:00.0, 380.00 W, [N/A], 63, 97 %, 1965 MHz, \
81000 MiB, 700.00 W, 0x0000000000000000
2025/09/24 03:17:04.590, 0, 00000000:18:00.0, 398.00 W, 120.50 W, 48, 100 %, 1980 MHz, \
81559 MiB, 700.00 W, 0x0000000000000001
2025/09/24 03:17:04.590, 1, 00000000:2A:00.0, 381.00 W, 140.00 W, [Not Supported], 96 %, \
1965 MHz, 81000 MiB, 700.00 W, 0x0000000000000000
"""


def test_nvidia_smi_with_units(tmp_path: Path) -> None:
    tr = load_trace(write(tmp_path, WITH_UNITS))
    assert tr.format == "nvidia-smi"
    assert tr.gpus == [0, 1]
    assert tr.skipped_lines == 0
    s0, s1 = tr.series[0], tr.series[1]
    assert s0.t[1] - s0.t[0] == pytest.approx(0.1)
    # instant power is preferred; power.draw becomes the average
    assert tr.power_column == "power.draw.instant"
    assert tr.power_averaging_stated is True and tr.power_averaging_seconds is None
    assert s0.fields["power_watts"].tolist() == [650.10, 120.50]
    assert s0.fields["power_average_watts"].tolist() == [397.30, 398.00]
    assert math.isnan(s1.fields["power_watts"][0])  # [N/A]
    assert math.isnan(s1.fields["temperature_celsius"][1])  # [Not Supported]
    assert s0.fields["utilization_gpu_ratio"][0] == pytest.approx(1.0)
    assert s0.fields["sm_clock_hertz"][0] == 1980e6
    assert s0.fields["memory_used_bytes"][0] == 81559 * 2**20
    assert s0.fields["clock_event_reasons"].tolist() == [4.0, 1.0]
    assert tr.tdp_watts == {0: 700.0, 1: 700.0}



def test_nvidia_smi_nounits_and_exact_time(tmp_path: Path) -> None:
    text = ("timestamp, index, power.draw [W], utilization.gpu [%], clocks.sm [MHz]\n"
            "2025/09/24 03:17:04.490, 0, 397.30, 100, 1980\n"
            "2025/09/24 03:17:04.790, 0, 300.00, 50, 1800\n")
    tr = load_trace(write(tmp_path, text))
    s = tr.series[0]
    assert s.t[0] == pytest.approx(1758683824.490)  # 2025-09-24T03:17:04.490Z
    assert s.fields["power_watts"].tolist() == [397.30, 300.0]
    assert s.fields["utilization_gpu_ratio"].tolist() == [1.0, 0.5]
    assert s.fields["sm_clock_hertz"].tolist() == [1980e6, 1800e6]
    assert tr.power_column == "power.draw"
    # plain power.draw is averaged on some GPUs and not on others: the file does not say
    assert tr.power_averaging_stated is False and tr.power_averaging_seconds is None
    assert tr.tdp_watts == {}


def test_header_without_units_values_with_units(tmp_path: Path) -> None:
    text = ("timestamp,index,power.draw,temperature.memory\n"
            "2025/09/24 03:17:04.490,0,397.30 W,70\n")
    s = load_trace(write(tmp_path, text)).series[0]
    assert s.fields["power_watts"][0] == 397.30
    assert s.fields["memory_temperature_celsius"][0] == 70.0


def test_missing_index_needs_gpus(tmp_path: Path) -> None:
    rows = "".join(f"2025/09/24 03:17:0{i // 2}.000, {100 + i}.0 W\n" for i in range(6))
    p = write(tmp_path, "timestamp, power.draw [W]\n" + rows)
    with pytest.raises(TraceError, match=r"t\.csv:1: .*--gpus N"):
        load_trace(p)
    tr = load_trace(p, gpus=2)
    assert tr.gpus == [0, 1]
    assert tr.series[0].fields["power_watts"].tolist() == [100.0, 102.0, 104.0]
    assert tr.series[1].fields["power_watts"].tolist() == [101.0, 103.0, 105.0]


def test_malformed_lines_skipped_and_counted(tmp_path: Path) -> None:
    text = ("timestamp, index, power.draw [W]\n"
            "2025/09/24 03:17:04.490, 0, 397.30 W\n"
            "2025/09/24 03:17:04.790, 0\n"  # too few cells (line 3)
            "2025/09/24 03:17:05.090, 0, abc W\n"  # unparsable number (line 4)
            "garbage, 0, 1 W\n"  # unparsable timestamp (line 5)
            "2025/09/24 03:17:05.390, 0, 12 kV\n"  # unknown unit on a value (line 6)
            "\n"
            "timestamp, index, power.draw [W]\n"  # header repeated by a loop: not an error
            "2025/09/24 03:17:05.690, 0, 390.00 W\n")
    tr = load_trace(write(tmp_path, text))
    assert tr.skipped_lines == 4
    assert [ln for ln, _ in tr.skipped] == [3, 4, 5, 6]
    assert "unknown unit" in tr.skipped[3][1]
    assert tr.series[0].fields["power_watts"].tolist() == [397.30, 390.0]


def test_unknown_unit_in_header_is_fatal(tmp_path: Path) -> None:
    p = write(tmp_path, "timestamp, index, power.draw [V]\n2025/09/24 03:17:04.490, 0, 1\n")
    with pytest.raises(TraceError, match=r"t\.csv:1: .*power\.draw.*\[v\]"):
        load_trace(p)


@pytest.mark.parametrize(
    ("text", "pattern"),
    [
        ("", r"t\.csv:1: empty file"),
        ("\n\n", r"t\.csv:1: empty file"),
        ("timestamp, index, temperature.gpu\n2025/09/24 03:17:04.490, 0, 40\n",
         r"t\.csv:1: no power column"),
        ("index, power.draw [W]\n0, 1 W\n", r"t\.csv:1: no timestamp column"),
        ("timestamp, index, power.draw [W]\n", r"t\.csv:1: no usable data rows"),
        ("timestamp, index, power.draw [W]\nx, y\n", r"t\.csv:2: .*no usable data rows"),
        ("hello world: this is not a trace\n", r"t\.csv:1: not an nvidia-smi CSV header"),
    ],
)
def test_fatal_errors_name_the_file_and_line(tmp_path: Path, text: str, pattern: str) -> None:
    with pytest.raises(TraceError, match=pattern):
        load_trace(write(tmp_path, text))


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="nope.csv: cannot read"):
        load_trace(tmp_path / "nope.csv")


def test_rows_sorted_and_equal_times_merged(tmp_path: Path) -> None:
    text = ("timestamp, index, power.draw [W], temperature.gpu\n"
            "2025/09/24 03:17:05.000, 0, 2 W, [N/A]\n"
            "2025/09/24 03:17:04.000, 0, 1 W, 40\n"
            "2025/09/24 03:17:05.000, 0, [N/A], 41\n")
    s = load_trace(write(tmp_path, text)).series[0]
    assert np.all(np.diff(s.t) > 0)
    assert s.fields["power_watts"].tolist() == [1.0, 2.0]
    assert s.fields["temperature_celsius"].tolist() == [40.0, 41.0]


@pytest.mark.skipif(not REAL.exists(), reason="real trace not available")
def test_real_trace_loads() -> None:
    tr = load_trace(REAL)
    assert tr.format == "nvidia-smi"
    assert tr.gpus == list(range(8))
    assert tr.skipped_lines == 0
    for g in tr.gpus:
        s = tr.series[g]
        assert len(s.t) == 4514
        assert np.all(np.diff(s.t) > 0)
        p = s.fields["power_watts"]
        assert np.isfinite(p).all() and p.min() > 50 and p.max() < 720
    assert np.array_equal(tr.series[0].t, tr.series[7].t)  # one timestamp per poll
    dur = tr.series[0].t[-1] - tr.series[0].t[0]
    assert dur == pytest.approx(22.5 * 60, rel=0.01)


# --------------------------------------------------------------------------- cte format


def test_cte_round_trip(tmp_path: Path) -> None:
    p = tmp_path / "rec.cte"
    fields = ["power_watts", "energy_joules", "temperature_celsius", "clock_event_reasons"]
    t0 = 1758683824.123456
    with TraceWriter(p, [0, 1], {0: 700.0, 1: 700.0}, fields, host="node7",
                     started_at=t0) as w:
        for i in range(40):  # power at 20 Hz, the rest at 1 Hz
            t = t0 + i * 0.05
            for g in (0, 1):
                vals = {"power_watts": 300.0 + i + g / 3}
                if i % 20 == 0:
                    vals |= {"energy_joules": 1e9 + i * 17.25, "temperature_celsius": 55.0 + g,
                             "clock_event_reasons": 4.0}
                w.write(t, g, vals)
        w.flush()
    tr = load_trace(p)
    assert tr.format == "cte"
    assert tr.gpus == [0, 1]
    assert tr.tdp_watts == {0: 700.0, 1: 700.0}
    assert tr.skipped_lines == 0
    s = tr.series[1]
    assert len(s.t) == 40
    assert s.t[0] == pytest.approx(t0, abs=1e-6)
    assert s.fields["power_watts"].tolist() == [300.0 + i + 1 / 3 for i in range(40)]  # exact
    e = s.fields["energy_joules"]
    assert np.isfinite(e).sum() == 2 and e[20] == 1e9 + 20 * 17.25
    assert math.isnan(s.fields["temperature_celsius"][1])


def test_cte_append_and_truncated_last_line(tmp_path: Path) -> None:
    p = tmp_path / "rec.cte"
    with TraceWriter(p, [0], None, ["power_watts"]) as w:
        w.write(100.0, 0, {"power_watts": 1.0})
    with TraceWriter(p, [0], None, ["power_watts"], append=True) as w:
        w.write(100.05, 0, {"power_watts": 2.0})
    with pytest.raises(ValueError, match="cannot append"):
        TraceWriter(p, [0], None, ["power_watts", "energy_joules"], append=True)
    with open(p, "a") as fh:
        fh.write("100.1")  # a crash mid-row
    tr = load_trace(p)
    assert tr.series[0].fields["power_watts"].tolist() == [1.0, 2.0]
    assert tr.skipped_lines == 1


def test_cte_writer_rejects_unknown_field_and_gpu(tmp_path: Path) -> None:
    with TraceWriter(tmp_path / "r.cte", [0], None, ["power_watts"]) as w:
        with pytest.raises(ValueError, match="field"):
            w.write(1.0, 0, {"watts": 1.0})
        with pytest.raises(ValueError, match="GPU 3"):
            w.write(1.0, 3, {"power_watts": 1.0})


def test_cte_bad_header(tmp_path: Path) -> None:
    p = write(tmp_path, "# cte-trace v1 {not json\nt,gpu,power_watts\n", "r.cte")
    with pytest.raises(TraceError, match=r"r\.cte:1: bad cte header JSON"):
        load_trace(p)
    p = write(tmp_path, "# cte-trace v1 {}\nt,gpu,temperature_celsius\n1,0,3\n", "r.cte")
    with pytest.raises(TraceError, match=r"r\.cte:2: cte trace has no power_watts"):
        load_trace(p)


# --------------------------------------------------------------------------- gzip and binary

RECORDED_GZ = Path(__file__).parent / "data" / "record-fake-60s.cte.gz"


def test_gzip_traces_are_read_as_they_are(tmp_path: Path) -> None:
    """Sniffed by the magic bytes, not the name: a cte recording and an nvidia-smi log, in
    one gzip member or several (gzip -c a >> b)."""
    plain = tmp_path / "plain.cte"
    plain.write_bytes(gzip.decompress(RECORDED_GZ.read_bytes()))
    packed = tmp_path / "named-anything"
    packed.write_bytes(RECORDED_GZ.read_bytes())
    a, b = load_trace(plain), load_trace(packed)
    assert b.format == "cte" and b.gpus == a.gpus == list(range(8))
    assert b.skipped_lines == a.skipped_lines == 0
    for g in a.gpus:
        assert np.array_equal(a.series[g].t, b.series[g].t)
        assert np.array_equal(a.series[g].fields["power_watts"],
                              b.series[g].fields["power_watts"], equal_nan=True)
    header = "timestamp, index, power.draw [W]\n"
    rows = [f"2025/09/24 03:17:{s:02d}.000, {g}, {300 + s}.00 W\n" for s in range(20)
            for g in range(2)]
    log = tmp_path / "smi.csv.gz"
    log.write_bytes(gzip.compress((header + "".join(rows[:20])).encode())
                    + gzip.compress("".join(rows[20:]).encode()))
    trace = load_trace(log)
    assert trace.format == "nvidia-smi" and trace.gpus == [0, 1]
    assert trace.series[1].fields["power_watts"].tolist() == [300.0 + s for s in range(20)]


def test_a_utf16_nvidia_smi_log_is_read(tmp_path: Path) -> None:
    """What `nvidia-smi ... > log.csv` writes in Windows PowerShell: UTF-16 with a BOM."""
    text = "timestamp, index, power.draw [W]\n" + "".join(
        f"2025/09/24 03:17:{s:02d}.000, 0, 300.00 W\n" for s in range(10))
    p = tmp_path / "ps.csv"
    p.write_bytes(text.encode("utf-16"))
    assert load_trace(p).series[0].t.size == 10


def _truncated_gzip() -> bytes:
    return RECORDED_GZ.read_bytes()[:40_000]


@pytest.mark.parametrize(("data", "says"), [
    (bytes(np.random.default_rng(1).integers(0, 256, 3000, dtype=np.uint8)),
     "binary data, not a trace"),
    (b"\x28\xb5\x2f\xfd" + bytes(range(256)) * 4, "zstd-compressed: decompress it first"),
    (b"\xfd7zXZ\x00" + bytes(range(256)), "xz-compressed: decompress it first"),
    (b"BZh91AY&SY" + bytes(range(256)), "bzip2-compressed: decompress it first"),
    (b"\x1f\x8b\x08\x00" + bytes(range(256)) * 2, "damaged gzip data"),
    (_truncated_gzip(), "gzip data cut short"),
    (gzip.compress(bytes(range(256)) * 8), "binary data, not a trace"),
    (b"timestamp, index, power.draw [W]\n\x00\x00\x00\x01\x02", "binary data"),
])
def test_binary_is_refused_in_one_line_that_quotes_none_of_it(
        tmp_path: Path, data: bytes, says: str) -> None:
    p = tmp_path / "t.bin"
    p.write_bytes(data)
    with pytest.raises(TraceError) as exc:
        load_trace(p)
    message = str(exc.value)
    assert message.startswith(f"{p}: ") and says in message
    assert message.isascii() and message.isprintable() and len(message) < 200, message


def test_text_in_another_8_bit_encoding_is_not_binary(tmp_path: Path) -> None:
    """A Latin-1 degree sign on every line is text with one odd byte a line."""
    text = "timestamp, index, power.draw [W], temperature.gpu [\xb0C]\n" + "".join(
        f"2025/09/24 03:17:{s:02d}.000, 0, 300.00 W, 50 \xb0C\n" for s in range(30))
    p = tmp_path / "latin1.csv"
    p.write_bytes(text.encode("latin-1"))
    with pytest.raises(TraceError) as exc:
        load_trace(p)
    # read as text: what it says is about its header's unit, not binary data
    assert "binary" not in str(exc.value) and "unknown unit" in str(exc.value)
