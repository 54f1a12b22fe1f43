"""A long trace's arrays held once: the GPUs of one poll share one array of times, a
field whose every value is the same (a power limit) is kept as that value, and the
stray-time bounds sort the trace's times without another copy; every value read back is
the one the text gave."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import numpy as np

from exporter.traces import reading
from exporter.traces.checks import time_bounds
from exporter.traces.load import load_trace
from exporter.traces.trace import PackedFields

HEADER = ("timestamp, index, power.draw [W], power.limit [W], temperature.gpu, "
          "utilization.gpu [%]")


def _stamp(seconds: float) -> str:
    whole = int(seconds)
    minutes = 3 * 60 + 17 + whole // 60
    return (f"2025/09/24 {minutes // 60:02d}:{minutes % 60:02d}:{whole % 60:02d}."
            f"{round(1000 * (seconds - whole)):03d}")


def _log(path: Path, polls: int, gpus: int = 4, skew: int | None = None) -> Path:
    """nvidia-smi's rows: every GPU of a poll at its time (GPU ``skew`` 1 ms later)."""
    lines = [HEADER]
    for i in range(polls):
        for g in range(gpus):
            t = i * 0.1 + (0.001 if g == skew else 0.0)
            lines.append(f"{_stamp(t)}, {g}, {300 + (i * 7 + g) % 400}.{i % 100:02d} W, "
                         f"700.00 W, {50 + i % 9}, {i % 101} %")
    path.write_text("\n".join(lines) + "\n")
    return path


def test_the_gpus_of_one_poll_share_one_array_of_times(tmp_path: Path) -> None:
    polls = 2 * reading.BLOCK_ROWS // 4 + 123  # rows over three blocks
    trace = load_trace(_log(tmp_path / "log.csv", polls))
    ts = [trace.series[g].t for g in trace.gpus]
    assert all(t is ts[0] for t in ts)
    assert ts[0].size == polls
    assert np.allclose(ts[0] - ts[0][0], np.arange(polls) * 0.1, rtol=0, atol=1e-6)


def test_gpus_polled_at_other_times_keep_their_own(tmp_path: Path) -> None:
    trace = load_trace(_log(tmp_path / "log.csv", 500, skew=2))
    s = trace.series
    assert s[0].t is s[1].t and s[2].t is not s[1].t and s[3].t is not s[2].t
    assert np.array_equal(s[3].t, s[0].t) and np.allclose(s[2].t - s[0].t, 0.001, rtol=0, atol=1e-6)


def test_a_field_of_one_value_is_held_as_it_and_reads_back_whole(tmp_path: Path) -> None:
    trace = load_trace(_log(tmp_path / "log.csv", 5000, gpus=1))
    f = trace.series[0].fields
    assert isinstance(f, PackedFields)
    limit = f["power_limit_watts"]
    assert limit.dtype == np.float64 and limit.size == 5000 and (limit == 700.0).all()
    limit[0] = 1.0  # each read is the reader's own array
    assert f["power_limit_watts"][0] == 700.0
    assert f.part("power_limit_watts", 10, 13).tolist() == [700.0] * 3
    # power stays float64 (8 bytes), temperature and utilization whole numbers (uint8), the
    # limit one value (700: uint16)
    assert f.nbytes() == 5000 * (8 + 1 + 1) + 2
    assert f["utilization_gpu_ratio"].tolist() == [(i % 101) * 0.01 for i in range(5000)]


def test_a_field_that_changes_or_misses_a_value_is_not_one_value() -> None:
    changes = np.full(100, 700.0, dtype=np.float32)
    changes[-1] = 650.0
    missing = np.full(100, 700.0, dtype=np.float32)
    missing[3] = np.nan
    f = PackedFields({"a": changes, "b": missing, "c": np.full(100, 5.0)},
                     {"a": 1.0, "b": 1.0})
    assert f.nbytes() == 100 * (4 + 4 + 8)
    assert f["a"][-1] == 650.0 and np.isnan(f["b"][3]) and f["c"].tolist() == [5.0] * 100


def test_time_bounds_sorting_in_place_are_those_of_a_copy() -> None:
    rng = np.random.default_rng(1)
    times = 1.758e9 + rng.uniform(0, 3600, 100_001)
    times[::1000] += 5e6  # strays
    want = time_bounds(times.copy())
    mine = times.copy()
    tracemalloc.start()
    try:
        got = time_bounds(mine, overwrite=True)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert got == want
    assert peak < times.nbytes / 4  # no copy of the times to sort
    assert time_bounds(times) == want and not np.array_equal(times, np.sort(times))


def test_line_numbers_kept_as_ranges_give_a_strays_line(tmp_path: Path) -> None:
    assert reading._line_numbers([5, 9, 13, 17]) == range(5, 18, 4)
    assert reading._line_numbers([7]).tolist() == [7]  # one line: an array
    uneven = reading._line_numbers([5, 9, 14])
    assert isinstance(uneven, np.ndarray) and uneven.tolist() == [5, 9, 14]
    assert isinstance(reading._line_numbers([5, 5]), np.ndarray)
    p = _log(tmp_path / "log.csv", 3000)
    lines = p.read_text().splitlines()
    lines[4001] = lines[4001].replace("2025/09/24", "2025/03/24")  # a stray row of GPU 0
    p.write_text("\n".join(lines) + "\n")
    trace = load_trace(p)
    assert trace.skipped == [(4002, "timestamp far from the rest of the trace")]
    assert trace.series[0].t.size == 2999 and trace.series[1].t.size == 3000


def test_blocks_of_one_value_are_joined_without_making_the_values() -> None:
    one = [np.broadcast_to(np.float32([700.0]), (n,)) for n in (3, 5, 2)]
    assert reading._same_value(one)
    joined = reading._one_value(one)
    assert joined.strides == (0,) and joined.size == 10 and joined[9] == 700.0
    other = [np.broadcast_to(np.float32([700.0]), (3,)), np.broadcast_to(np.float32([650.0]),
                                                                         (3,))]
    assert not reading._same_value(other)
    assert not reading._same_value([np.broadcast_to(np.float32([1.0]), (3,)),
                                    np.float32([1.0, 1.0])])
    assert not reading._same_value([])


def test_whole_numbers_kept_narrow_join_blocks_with_missing_values_exactly(
        tmp_path: Path) -> None:
    polls = reading.BLOCK_ROWS + 500  # two blocks of one GPU
    lines = [HEADER]
    for i in range(polls):
        temp = "[N/A]" if i == polls - 3 else str(30 + i % 150)  # 30..179: uint8
        lines.append(f"{_stamp(i * 0.1)}, 0, 300.00 W, 700.00 W, {temp}, {i % 101} %")
    p = tmp_path / "log.csv"
    p.write_text("\n".join(lines) + "\n")
    f = load_trace(p).series[0].fields
    temp = f["temperature_celsius"]
    want = [float(30 + i % 150) for i in range(polls)]
    want[polls - 3] = float("nan")
    assert np.array_equal(temp, want, equal_nan=True)
    assert f._arrays["temperature_celsius"].dtype == np.float32  # one block had a gap
    assert f._arrays["utilization_gpu_ratio"].dtype == np.uint8
    assert f["utilization_gpu_ratio"].tolist() == [(i % 101) * 0.01 for i in range(polls)]


def test_packing_keeps_what_is_not_a_narrow_whole_number_as_it_was() -> None:
    assert reading._pack(np.array([1.0, 255.0]), 1.0).dtype == np.uint8
    assert reading._pack(np.array([1.0, 256.0]), 1.0).dtype == np.uint16
    assert reading._pack(np.array([1.0, 70000.0]), 1.0).dtype == np.float32
    assert reading._pack(np.array([-1.0, 5.0]), 1.0).dtype == np.float32
    assert reading._pack(np.array([1.5, 5.0]), 1.0).dtype == np.float32
    assert reading._pack(np.array([1.0, np.nan]), 1.0).dtype == np.float32
    assert reading._pack(np.array([640.12, 5.0]), 1.0).dtype == np.float64
    sm = np.array([1410e6, 1980e6])
    packed = reading._pack(sm, 1e6)
    assert packed.dtype == np.uint16 and (reading.unpack(packed, 1e6) == sm).all()
