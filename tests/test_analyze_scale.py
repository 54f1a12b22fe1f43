"""analyze at scale: rows merged or sorted into place are counted and said, a file of
junk is refused after its first lines, the read's progress shows on a terminal only,
and the trace is read a block at a time with the same lines and numbers as a whole."""

from __future__ import annotations

import codecs
import gzip
import io
import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from exporter.commands import analyze
from exporter.offline.loading import ANALYZED_FIELDS, ReadProgress, load
from exporter.offline.request import AnalyzeRequest
from exporter.traces import nvsmi
from exporter.traces.load import load_trace
from exporter.traces.reading import JUNK_LINES, TextLines
from exporter.traces.trace import TraceError

HEADER = "timestamp, index, power.draw [W], temperature.gpu, utilization.gpu [%]"


def _stamp(seconds: float, ms: bool = True) -> str:
    whole = int(seconds)
    minutes = 3 * 60 + 17 + whole // 60
    text = f"2025/09/24 {minutes // 60:02d}:{minutes % 60:02d}:{whole % 60:02d}"
    return f"{text}.{round(1000 * (seconds - whole)):03d}" if ms else text


def _log(path: Path, polls: int, every: float, *, ms: bool = True, gpus: int = 2) -> Path:
    lines = [HEADER]
    for i in range(polls):
        for g in range(gpus):
            watts = 300.0 + 200.0 * ((i * every) % 2.0 < 1.0) + g
            lines.append(f"{_stamp(i * every, ms)}, {g}, {watts:.2f} W, {50 + g}, 90 %")
    path.write_text("\n".join(lines) + "\n")
    return path


def _parse(*argv: str):
    return analyze.build_parser().parse_args(list(argv))


def test_repeated_timestamps_are_counted_in_the_json_the_text_and_a_warning(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # polled 4 times a second, stamped without milliseconds: 3 rows in 4 merge away
    p = _log(tmp_path / "coarse.csv", polls=4 * 200, every=0.25, ms=False)
    assert analyze.main(_parse(str(p), "--format", "json")) == 0
    out = capsys.readouterr()
    rep = json.loads(out.out)
    assert rep["collapsed_rows"] == 2 * 3 * 200 and rep["out_of_order_rows"] == 0
    assert rep["duration_seconds"] == pytest.approx(199.0)
    assert any("1200 row(s) had the time of an earlier row of their GPU" in n
               for n in rep["notes"])
    assert out.err.count("\n") == 1 and "warning:" in out.err and "75.0 %" in out.err, out.err
    assert analyze.main(_parse(str(p))) == 0
    text = capsys.readouterr().out
    assert "1200 row(s) had the time of an earlier row of their GPU and were merged" in text


def test_rows_out_of_order_are_counted_and_a_few_do_not_warn(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = _log(tmp_path / "log.csv", polls=2000, every=0.1)
    lines = p.read_text().splitlines(keepends=True)
    moved = lines[1001:1003]  # one poll (both GPUs) written 500 polls late
    p.write_text("".join(lines[:1001] + lines[1003:2001] + moved + lines[2001:]))
    assert analyze.main(_parse(str(p), "--format", "json")) == 0
    out = capsys.readouterr()
    rep = json.loads(out.out)
    assert rep["out_of_order_rows"] == 2 and rep["collapsed_rows"] == 0
    assert out.err == ""  # 2 rows of 4000: no warning
    assert any("2 row(s) came earlier than a row of their GPU read before them" in n
               for n in rep["notes"])
    clean = _log(tmp_path / "clean.csv", polls=2000, every=0.1)
    base = analyze.analyse_trace(load_trace(clean), AnalyzeRequest(str(clean)))
    assert base["node_mean_watts"] == rep["node_mean_watts"]  # sorted into place, same data


def test_a_row_merged_into_its_twin_keeps_the_later_values(tmp_path: Path) -> None:
    p = tmp_path / "twins.csv"
    p.write_text(f"{HEADER}\n"
                 f"{_stamp(0)}, 0, 300.00 W, 50, [N/A]\n"
                 f"{_stamp(1)}, 0, 310.00 W, 51, 40 %\n"
                 f"{_stamp(0)}, 0, 320.00 W, [N/A], 30 %\n")
    tr = load_trace(p)
    s = tr.series[0]
    assert tr.collapsed_rows == 1 and tr.out_of_order_rows == 1
    assert s.t.size == 2
    assert s.fields["power_watts"].tolist() == [320.0, 310.0]
    assert s.fields["temperature_celsius"].tolist() == [50.0, 51.0]  # missing does not win
    assert s.fields["utilization_gpu_ratio"][0] == pytest.approx(0.30)


def test_a_file_of_junk_is_refused_after_its_first_lines(tmp_path: Path) -> None:
    p = tmp_path / "junk.csv"
    junk = [f"{_stamp(i % 60)}, 0, lots of W, 50, 90 %" for i in range(3 * JUNK_LINES)]
    good = [f"{_stamp(i / 10)}, 0, 300.00 W, 50, 90 %" for i in range(100)]
    p.write_text("\n".join([HEADER, *junk, *good]) + "\n")
    with pytest.raises(TraceError) as err:
        load_trace(p)
    msg = str(err.value)
    assert msg == (f"{p}:2: the first 10,000 data lines are all unusable (the first: "
                   "power.draw: unparsable value 'lots of W'): not a trace this reader "
                   "understands"), msg
    # below the limit, junk before the data is skipped and counted as before
    p.write_text("\n".join([HEADER, *junk[:JUNK_LINES - 1], *good]) + "\n")
    tr = load_trace(p)
    assert tr.skipped_lines == JUNK_LINES - 1 and tr.series[0].t.size == 100
    assert tr.skip_reasons == Counter({"power.draw: unparsable value 'lots of W'":
                                       JUNK_LINES - 1})
    assert len(tr.skipped) == 1000 and tr.skipped[0][0] == 2  # the first kept, all counted


def test_junk_is_refused_through_the_command_in_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = tmp_path / "junk.cte"
    p.write_text("# cte-trace v1 {}\nt,gpu,power_watts\n"
                 + "".join(f"{i},zero,400\n" for i in range(2 * JUNK_LINES)))
    assert analyze.main(_parse(str(p))) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "the first 10,000 data lines are all unusable" in err
    assert f"{p}:3:" in err and "unparsable index 'zero'" in err


def test_progress_is_drawn_on_a_terminal_and_erased() -> None:
    out = io.StringIO()
    progress = ReadProgress("big.csv", out, after=0.0)
    progress(250_000_000, 1_000_000_000)
    progress(260_000_000, 1_000_000_000)  # within half a second: not redrawn
    progress.clear()
    text = out.getvalue()
    assert text.startswith("\rcluster-telemetry-exporter: analyze: reading big.csv:  25 % "
                           "(250 of 1,000 MB)")
    assert text.count("%") == 1 and text.endswith("\r")


def test_no_progress_where_stderr_is_no_terminal(tmp_path: Path) -> None:
    p = _log(tmp_path / "log.csv", polls=300, every=0.1)
    err = io.StringIO()  # isatty() is False
    trace = load(AnalyzeRequest(str(p)), err)
    assert err.getvalue() == "" and trace.gpus == [0, 1]


def test_analyze_keeps_only_the_fields_it_reads(tmp_path: Path) -> None:
    p = tmp_path / "wide.csv"
    p.write_text("timestamp, index, power.draw [W], memory.used [MiB], clocks.mem [MHz]\n"
                 + "".join(f"{_stamp(i / 10)}, 0, 300.00 W, 100 MiB, 2619 MHz\n"
                           for i in range(50)))
    assert set(load_trace(p).series[0].fields) == {"power_watts", "memory_used_bytes",
                                                   "memory_clock_hertz"}
    kept = load(AnalyzeRequest(str(p)), io.StringIO()).series[0].fields
    assert set(kept) == {"power_watts"} and set(kept) <= ANALYZED_FIELDS


@pytest.mark.parametrize("text", [
    "a\r\nb\rc\nd\x0be\x1cf\u2028g\x85h\r\n\r\nlast",
    "\ufeffheader\r\n" + "row,1\r\n" * 50,
    "é€\n" * 30 + "tail\r",
])
@pytest.mark.parametrize("encoding", ["utf-8", "utf-16"])
def test_lines_read_a_block_at_a_time_are_those_of_the_whole_text(
        tmp_path: Path, text: str, encoding: str) -> None:
    if encoding == "utf-16":
        text = text.lstrip("\ufeff")
    data = text.encode(encoding)
    for name, raw in (("plain", data), ("gz", gzip.compress(data))):
        p = tmp_path / name
        p.write_bytes(raw)
        whole = codecs.decode(data, "utf-8-sig" if encoding == "utf-8" else encoding)
        for block_bytes in (1, 3, 7, 64):
            reader = TextLines(str(p), block_bytes=block_bytes)
            try:
                got = list(reader.lines())
            finally:
                reader.close()
            assert got == list(enumerate(whole.splitlines(), start=1)), (name, block_bytes)


def test_median_of_counted_limits_is_numpys() -> None:
    rng = np.random.default_rng(3)
    for n in (1, 2, 3, 10, 101):
        values = rng.choice([250.0, 300.0, 350.5, 700.0], size=n)
        assert nvsmi._median(Counter(values.tolist())) == float(np.median(values))


def test_line_numbers_of_skipped_lines_hold_across_blocks(tmp_path: Path) -> None:
    p = _log(tmp_path / "log.csv", polls=30_000, every=0.1, gpus=1)
    lines = p.read_text().splitlines()
    lines[25_000] = lines[25_000].replace(" W", " kVA")
    p.write_text("\r\n".join(lines) + "\r\n")  # CRLF, cut anywhere by the blocks
    tr = load_trace(p)
    assert tr.skipped == [(25_001, "power.draw: unknown unit 'kVA'")]
    assert tr.series[0].t.size == 29_999


def test_whole_numbers_of_the_files_unit_are_kept_in_half_the_memory(tmp_path: Path) -> None:
    p = tmp_path / "units.csv"
    rows = [(f"{_stamp(i / 10)}, 0, {300 + i % 7}.{i % 100:02d} W, {40 + i % 30}, "
             f"{i % 101} %, {1410 + i % 600} MHz, 0x{i % 5:x}") for i in range(5000)]
    p.write_text("timestamp, index, power.draw [W], temperature.gpu, utilization.gpu [%], "
                 "clocks.sm [MHz], clocks_event_reasons.active\n" + "\n".join(rows) + "\n")
    s = load_trace(p).series[0]
    i = np.arange(5000)
    # the same float64 numbers the text gives, whatever is kept
    assert s.fields["utilization_gpu_ratio"].tolist() == [float(k % 101) * 0.01 for k in i]
    assert s.fields["sm_clock_hertz"].tolist() == [float(1410 + k % 600) * 1e6 for k in i]
    assert s.fields["temperature_celsius"].tolist() == [float(40 + k % 30) for k in i]
    assert s.fields["power_watts"].tolist() == [float(f"{300 + k % 7}.{k % 100:02d}") for k in i]
    assert all(s.fields[f].dtype == np.float64 for f in s.fields)
    # power (two decimals) stays float64; the whole numbers take 1 byte a value (uint8:
    # temperature, utilization, clock events) or 2 (uint16: the SM clock in MHz)
    assert s.fields.nbytes() == 5000 * (8 + 1 + 1 + 2 + 1)
    assert {s.fields._arrays[f].dtype.name for f in s.fields} == {"float64", "uint8", "uint16"}
