"""The classic Prometheus text format, written from prometheus_client metric families.

prometheus_client's generate_latest() re-validates and re-escapes every label name and
value of every sample on every call: two thirds of a render here, where the same few
hundred label sets (a GPU's, a link's) recur in every snapshot. This writer gives the same
bytes (tests/test_exposition.py holds it to generate_latest) and writes each label set
once: it keeps the text of the label sets it has seen.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterable

from prometheus_client.metrics_core import Metric
from prometheus_client.samples import Sample

from exporter.families import Family

# Prometheus' text format keeps OpenMetrics' types under older names, as generate_latest.
_TYPE_NAMES = {"info": "gauge", "stateset": "gauge", "gaugehistogram": "histogram",
               "unknown": "untyped"}
_NAME_SUFFIXES = {"counter": "_total", "info": "_info"}
# OpenMetrics-only samples, written as a gauge family of their own after the family.
_SEPARATE_SUFFIXES = ("_created", "_gsum", "_gcount")
# Forget them all past these (label values or values that never recur). Each entry is
# ~120 bytes (a value) or ~600 (a label set): energy counters and power readings never
# recur, so the value cache fills to its bound and is cleared, over and over; at 20,000
# it held 2.3 MiB at its top, a saw-tooth that read as growth. The values that recur
# (states, limits, idle counters) are a few hundred, the label sets about as many as the
# series (~1,900 on the full profile of an 8-GPU node).
_MAX_LABEL_SETS = 8_192
_MAX_VALUES = 2_048


def _escape(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _help(text: str) -> str:
    return text.replace("\\", r"\\").replace("\n", r"\n")


def go_float(value: float) -> str:
    """A value as Go's strconv writes it, which Prometheus reads (as generate_latest)."""
    value = float(value)
    if value == math.inf:
        return "+Inf"
    if value == -math.inf:
        return "-Inf"
    if value != value:
        return "NaN"
    text = repr(value)
    dot = text.find(".")
    if value > 0 and dot > 6:  # Go switches to an exponent sooner than Python
        mantissa = f"{text[0]}.{text[1:dot]}{text[dot + 1:]}".rstrip("0.")
        return f"{mantissa}e+{dot - 1:02d}"
    return text


class Rows(Metric):
    """A gauge or counter family of many series with fixed label names (a series per GPU
    and NVLink, say), kept as rows of (label values, value). Adding a row makes no label
    dict and no Sample, and the writer formats each label set once; for anyone else,
    `samples` are the Samples a GaugeMetricFamily or CounterMetricFamily would hold."""

    def __init__(self, name: str, documentation: str, typ: str, labels: Iterable[str]):
        if typ not in ("gauge", "counter"):
            raise ValueError(f"Rows are gauges or counters, not {typ}")
        super().__init__(name, documentation, typ)
        self.labelnames = tuple(labels)
        self.sample_name = name + "_total" if typ == "counter" else name
        self.rows: list[tuple[tuple[str, ...], float]] = []

    @classmethod
    def of(cls, family: Family) -> Rows:
        """Empty rows of a declared gauge or counter family, with its help and labels."""
        return cls(family.base, family.help, family.type, family.labels)

    def add(self, labelvalues: tuple[str, ...], value: float) -> None:
        self.rows.append((labelvalues, value))

    @property
    def samples(self) -> list[Sample]:
        return [Sample(self.sample_name, dict(zip(self.labelnames, values, strict=True)), value)
                for values, value in self.rows]

    @samples.setter
    def samples(self, value: list[Sample]) -> None:
        if value:  # Metric.__init__ starts every family empty; rows come through add()
            raise TypeError("add rows with Rows.add()")


class ExpositionWriter:
    """Writes families; remembers the text of each label set and value it writes
    (thread-safe: a lost race only writes the same text twice)."""

    def __init__(self) -> None:
        self._label_text: dict[tuple[tuple[str, str], ...], str] = {}
        self._value_text: dict[float, str] = {}
        self._row_text: dict[tuple[str, ...], dict[tuple[str, ...], str]] = {}
        self._lock = threading.Lock()

    def labels(self, labels: dict[str, str]) -> str:
        key = tuple(labels.items())
        text = self._label_text.get(key)
        if text is None:
            pairs = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(labels.items()))
            text = "{" + pairs + "}" if pairs else ""
            with self._lock:
                if len(self._label_text) >= _MAX_LABEL_SETS:
                    self._label_text.clear()
                self._label_text[key] = text
        return text

    def write(self, families: Iterable[Metric]) -> bytes:
        out: list[str] = []
        for family in families:
            self._family(family, out)
        return "".join(out).encode()

    def _family(self, family: Metric, out: list[str]) -> None:
        fname = family.name
        name = fname + _NAME_SUFFIXES.get(family.type, "")
        doc = _help(family.documentation)
        out.append(f"# HELP {name} {doc}\n# TYPE {name} "
                   f"{_TYPE_NAMES.get(family.type, family.type)}\n")
        if isinstance(family, Rows):
            self._rows(family, out)
            return
        separate: dict[str, list[str]] = {}
        # the loop of a render (~2,000 samples): names bound locally, label sets and
        # values looked up in what earlier renders wrote
        label_text, values, labels_of, value_of = (
            self._label_text, self._value_text, self.labels, self.value)
        for sample in family.samples:
            sname, labels, value, timestamp = sample[0], sample[1], sample[2], sample[3]
            text = label_text.get(tuple(labels.items())) or labels_of(labels)
            if value:
                number = values.get(value) or value_of(value)
            else:  # half the values of a render; -0.0 == 0.0, so not in `values`
                number = "0.0" if math.copysign(1.0, value) > 0 else "-0.0"
            stamp = "" if timestamp is None else f" {int(float(timestamp) * 1000):d}"
            line = f"{sname}{text} {number}{stamp}\n"
            if sname == fname:
                out.append(line)
                continue
            suffix = sname[len(fname):]
            if suffix in _SEPARATE_SUFFIXES and sname.startswith(fname):
                separate.setdefault(suffix, []).append(line)
            else:
                out.append(line)
        for suffix, lines in sorted(separate.items()):
            out.append(f"# HELP {fname}{suffix} {doc}\n"
                       f"# TYPE {fname}{suffix} gauge\n")
            out.extend(lines)

    def _rows(self, family: Rows, out: list[str]) -> None:
        names, sname = family.labelnames, family.sample_name
        texts = self._row_text.get(names)
        if texts is None or len(texts) >= _MAX_LABEL_SETS:
            texts = self._row_text[names] = {}
        values, value_of = self._value_text, self.value
        for labelvalues, value in family.rows:
            text = texts.get(labelvalues)
            if text is None:
                text = texts[labelvalues] = self.labels(
                    dict(zip(names, labelvalues, strict=True)))
            if value:
                number = values.get(value) or value_of(value)
            else:
                number = "0.0" if math.copysign(1.0, value) > 0 else "-0.0"
            out.append(f"{sname}{text} {number}\n")

    def value(self, value: float) -> str:
        """go_float(value), kept for the values that recur (states, limits, idle counters;
        NaN is never found again: NaN != NaN)."""
        text = go_float(value)
        if not value:
            return text
        with self._lock:
            if len(self._value_text) >= _MAX_VALUES:
                self._value_text.clear()
            self._value_text[value] = text
        return text


WRITER = ExpositionWriter()
