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

# Prometheus' text format keeps OpenMetrics' types under older names, as generate_latest.
_TYPE_NAMES = {"info": "gauge", "stateset": "gauge", "gaugehistogram": "histogram",
               "unknown": "untyped"}
_NAME_SUFFIXES = {"counter": "_total", "info": "_info"}
# OpenMetrics-only samples, written as a gauge family of their own after the family.
_SEPARATE_SUFFIXES = ("_created", "_gsum", "_gcount")
_MAX_LABEL_SETS = 50_000  # forget them all past this (label values that never recur)


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


class ExpositionWriter:
    """Writes families; remembers the text of each label set it writes (thread-safe: a
    lost race only writes the same text twice)."""

    def __init__(self) -> None:
        self._label_text: dict[tuple[tuple[str, str], ...], str] = {}
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
        name = family.name + _NAME_SUFFIXES.get(family.type, "")
        doc = _help(family.documentation)
        out.append(f"# HELP {name} {doc}\n# TYPE {name} "
                   f"{_TYPE_NAMES.get(family.type, family.type)}\n")
        separate: dict[str, list[str]] = {}
        for sample in family.samples:
            line = self._sample(sample)
            suffix = sample.name[len(family.name):]
            if suffix in _SEPARATE_SUFFIXES and sample.name.startswith(family.name):
                separate.setdefault(suffix, []).append(line)
            else:
                out.append(line)
        for suffix, lines in sorted(separate.items()):
            out.append(f"# HELP {family.name}{suffix} {doc}\n"
                       f"# TYPE {family.name}{suffix} gauge\n")
            out.extend(lines)

    def _sample(self, sample) -> str:
        stamp = "" if sample.timestamp is None else f" {int(float(sample.timestamp) * 1000):d}"
        return f"{sample.name}{self.labels(sample.labels)} {go_float(sample.value)}{stamp}\n"


WRITER = ExpositionWriter()
