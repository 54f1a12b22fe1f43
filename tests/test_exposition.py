"""Our exposition writer gives the bytes prometheus_client's generate_latest gives."""

from __future__ import annotations

import math

import pytest
from prometheus_client.exposition import generate_latest
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeHistogramMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    StateSetMetricFamily,
    SummaryMetricFamily,
    UnknownMetricFamily,
)

from exporter.families import PROFILES
from exporter.metrics.exposition import ExpositionWriter, go_float
from exporter.metrics.render import render
from exporter.metrics.selection import Selection
from tests.tools import make_snapshot


class _Registry:
    def __init__(self, families):
        self.families = families

    def collect(self):
        return iter(self.families)


def _families():
    gauge = GaugeMetricFamily("gpu_temp_celsius", 'Temperature "core"\\ with\nnewline',
                              labels=["gpu", "uuid"])
    gauge.add_metric(["0", 'GPU-"quoted"\\back\nline'], 41.5)
    gauge.add_metric(["1", "GPU-1"], math.nan)
    gauge.add_metric(["2", "GPU-2"], math.inf, timestamp=1700000000.25)
    gauge.add_metric(["3", "GPU-3"], -math.inf)
    gauge.add_metric(["4", "GPU-4"], 123456789.0)
    gauge.add_metric(["5", "GPU-5"], 1e-7)
    gauge.add_metric(["6", "GPU-6"], -98765432.5)
    gauge.add_metric(["7", "GPU-7"], 12)
    counter = CounterMetricFamily("gpu_energy_joules", "Energy.", labels=["gpu"],
                                  created=1700000000.0)
    counter.add_metric(["0"], 1234.5, created=1700000000.0)
    plain_counter = CounterMetricFamily("cte_scrapes", "Scrapes.", value=3)
    info = InfoMetricFamily("gpu", "Identity.", labels=["gpu"])
    info.add_metric(["0"], {"name": "NVIDIA H200", "driver": "580.1"})
    stateset = StateSetMetricFamily("gpu_mode", "Mode.", labels=["gpu"])
    stateset.add_metric(["0"], {"on": True, "off": False})
    histogram = HistogramMetricFamily("cte_scrape_seconds", "Scrape time.", labels=["path"])
    histogram.add_metric(["/metrics"], [("0.1", 3), ("+Inf", 5)], 0.7)
    gauge_histogram = GaugeHistogramMetricFamily("cte_queue", "Queue.",
                                                 buckets=[("1", 2), ("+Inf", 4)], gsum_value=3)
    summary = SummaryMetricFamily("cte_drain_seconds", "Drains.", count_value=4, sum_value=0.5)
    unknown = UnknownMetricFamily("cte_other", "Other.", value=1)
    empty = GaugeMetricFamily("gpu_nothing", "No samples.", labels=["gpu"])
    return [gauge, counter, plain_counter, info, stateset, histogram, gauge_histogram,
            summary, unknown, empty]


def test_every_family_type_is_written_as_generate_latest_writes_it():
    families = _families()
    expected = generate_latest(_Registry(families))
    writer = ExpositionWriter()
    assert writer.write(families) == expected
    assert writer.write(families) == expected  # again, from the remembered label sets


@pytest.mark.parametrize("profile", PROFILES)
def test_a_rendered_snapshot_is_what_generate_latest_writes(profile):
    from exporter.metrics.render import FAMILY_FUNCTIONS

    snapshot = make_snapshot()
    selection = Selection(profile)
    families = list(selection.apply(f for source in FAMILY_FUNCTIONS for f in source(snapshot)))
    assert render(snapshot, selection=selection) == generate_latest(_Registry(families))


@pytest.mark.parametrize("value", [0.0, -0.0, 1.0, 0.1, 1e21, 1234567.0, 12345678.9,
                                   5e-324, 1.7976931348623157e308, -1e22, 999999.5])
def test_values_are_written_as_go_writes_them(value):
    from prometheus_client.utils import floatToGoString

    assert go_float(value) == floatToGoString(value)


def test_label_sets_seen_are_forgotten_past_the_bound(monkeypatch):
    from exporter.metrics import exposition

    monkeypatch.setattr(exposition, "_MAX_LABEL_SETS", 3)
    writer = ExpositionWriter()
    for n in range(10):
        assert writer.labels({"pod": f"p{n}"}) == f'{{pod="p{n}"}}'
    assert len(writer._label_text) <= 3


def test_values_remembered_are_written_as_generate_latest_writes_them():
    """Values are remembered by equality: 0.0 and -0.0 (equal, written apart) and NaN (never
    equal to itself) must still come out as generate_latest writes them, in any order."""
    gauge = GaugeMetricFamily("gpu_x", "X.", labels=["gpu"])
    values = [0.0, -0.0, 0, 1, 1.0, True, math.nan, 2.5, -0.0, 0.0, math.nan, 2.5, 7, -3.25, False]
    for n, value in enumerate(values):
        gauge.add_metric([str(n)], value)
    expected = generate_latest(_Registry([gauge]))
    writer = ExpositionWriter()
    for _ in range(3):
        assert writer.write([gauge]) == expected
    assert b'gpu_x{gpu="1"} -0.0\n' in expected and b'gpu_x{gpu="9"} 0.0\n' in expected


def test_values_seen_are_forgotten_past_the_bound(monkeypatch):
    from exporter.metrics import exposition

    monkeypatch.setattr(exposition, "_MAX_VALUES", 3)
    writer = ExpositionWriter()
    for n in range(1, 10):
        assert writer.value(n / 7) == repr(n / 7)
    assert len(writer._value_text) <= 3


@pytest.mark.parametrize("typ", ["gauge", "counter"])
def test_rows_are_the_family_prometheus_client_would_hold(typ):
    from exporter.metrics.exposition import Rows

    plain = (GaugeMetricFamily if typ == "gauge" else CounterMetricFamily)(
        "gpu_nvlink_x", 'Doc "q"\\.', labels=["gpu", "uuid", "link"])
    rows = Rows("gpu_nvlink_x", 'Doc "q"\\.', typ, ["gpu", "uuid", "link"])
    for n, value in enumerate([0.0, -0.0, 3, 2.5e21, math.nan, 7.0, 0.0]):
        labels = (str(n % 3), 'GPU-"a"\\b\nc' if n == 1 else f"GPU-{n}", str(n))
        plain.add_metric(list(labels), value)
        rows.add(labels, value)
    assert rows.samples[:2] == plain.samples[:2] and len(rows.samples) == len(plain.samples)
    expected = generate_latest(_Registry([plain]))
    assert generate_latest(_Registry([rows])) == expected
    writer = ExpositionWriter()
    for _ in range(2):  # label sets formatted, then remembered
        assert writer.write([rows]) == expected
    with pytest.raises(TypeError):
        rows.samples = plain.samples


def test_the_writer_holds_little_for_values_that_never_recur():
    """An energy counter or a power reading is a new value at every render: what the writer
    remembers of them stays bounded in bytes, not only in entries."""
    import tracemalloc

    writer = ExpositionWriter()
    gauge_values = [1_000_000.0 + n / 3 for n in range(30_000)]
    tracemalloc.start()
    try:
        for value in gauge_values:
            writer.value(value)
        held = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert held < 512 * 1024
