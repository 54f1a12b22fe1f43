"""Family declarations (exporter/families.py): what is served is what is declared, the
generated table and docs are current, and a bad declaration is refused."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest
from prometheus_client.parser import text_string_to_metric_families

from exporter.families import Family, by_name
from exporter.metrics.exposition import WRITER, Rows
from tests.test_docs_metrics import full_exposition
from tests.tools import REPO

SCRIPT = REPO / "scripts" / "build_metrics_docs.py"


def _generator():
    spec = importlib.util.spec_from_file_location("build_metrics_docs", SCRIPT)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> dict[str, tuple[str, str, set[str]]]:
    """Every family of a full run: exposed name -> (TYPE as declared, HELP, labels)."""
    out = {}
    for family in text_string_to_metric_families(full_exposition(tmp_path_factory)):
        kind, name = family.type, family.name
        if kind == "counter":
            name += "_total"
        elif kind == "gauge" and name.endswith("_info"):
            kind = "info"
        out[name] = (kind, family.documentation,
                     {label for s in family.samples for label in s.labels})
    return out


def test_the_generated_table_and_docs_are_current():
    result = subprocess.run([sys.executable, str(SCRIPT), "--check"], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_served_family_is_declared(served):
    declared = _generator().declared()
    unknown = sorted(set(served) - set(declared))
    assert not unknown, f"declare them (exporter/families.py): {unknown}"


def test_served_families_are_as_declared(served):
    """TYPE, HELP and label names as served equal the declaration: code that builds a
    family by hand with another help or label list fails here."""
    declared = _generator().declared()
    checked = 0
    for name, (kind, help_, labels) in served.items():
        family = declared[name]
        checked += 1
        assert (kind, help_) == (family.type, family.help), name
        if labels:  # a family without series here shows no labels
            assert labels == set(family.labels), f"{name}: {labels} vs {family.labels}"
    assert checked == len(served) > 200


def test_a_family_declared_twice_is_refused(monkeypatch):
    one = Family("x_seconds", "gauge", "X.", source="test")
    with pytest.raises(ValueError, match="x_seconds is declared twice"):
        by_name((one, Family("y", "gauge", "Y.", source="test"), one))
    generator = _generator()
    module = "exporter.collectors.host.families"
    monkeypatch.setattr(generator, "SECTIONS", (*generator.SECTIONS, ("again", "", (module,))))
    with pytest.raises(ValueError, match="host_cpu_utilization_ratio is declared twice"):
        generator.declared()


@pytest.mark.parametrize(("kwargs", "problem"), [
    ({"name": "x_errors", "type": "counter"}, "ends in _total"),
    ({"name": "x", "type": "info"}, "ends in _info"),
    ({"name": "x_total", "type": "gauge"}, "neither _total nor _info"),
    ({"type": "histogram"}, "type 'histogram'"),
    ({"profile": "huge"}, "profile 'huge'"),
    ({"labels": ("gpu", "gpu")}, "repeat"),
    ({"labels": ["gpu"]}, "labels are a tuple"),
    ({"labels": ("GPU",)}, "lower-case"),
    ({"name": "X-y"}, "lower-case"),
    ({"source": ""}, "source"),
    ({"help": " "}, "help"),
])
def test_a_bad_declaration_is_refused(kwargs, problem):
    fields = {"name": "x", "type": "gauge", "help": "X.", "source": "test", **kwargs}
    with pytest.raises(ValueError, match=problem):
        Family(**fields)


def test_the_doc_is_the_help_unless_given():
    assert Family("x", "gauge", "X.", source="t").doc == "X."
    assert Family("x", "gauge", "X.", source="t", doc="More.").doc == "More."


def test_the_constructors_build_the_declared_family():
    counter = Family("x_errors_total", "counter", "Errors.", ("call",), source="t")
    built = counter.counter()
    built.add_metric(["open"], 2)
    info = Family("x_info", "info", "Identity.", ("gpu", "name"), source="t")
    one = info.info(by=("gpu",))
    one.add_metric(["0"], {"name": "H100"})
    gauge = Family("x_bytes", "gauge", "Bytes.", source="t").gauge(3)
    rows = Rows.of(Family("x_seconds_total", "counter", "Seconds.", ("gpu",), source="t"))
    rows.add(("0",), 1.5)
    assert WRITER.write([built, one, gauge, rows]).decode() == (
        "# HELP x_errors_total Errors.\n# TYPE x_errors_total counter\n"
        'x_errors_total{call="open"} 2.0\n'
        "# HELP x_info Identity.\n# TYPE x_info gauge\n"
        'x_info{gpu="0",name="H100"} 1.0\n'
        "# HELP x_bytes Bytes.\n# TYPE x_bytes gauge\nx_bytes 3.0\n"
        "# HELP x_seconds_total Seconds.\n# TYPE x_seconds_total counter\n"
        'x_seconds_total{gpu="0"} 1.5\n')


def test_a_constructor_of_another_type_or_labels_is_refused():
    counter = Family("x_total", "counter", "X.", source="t")
    with pytest.raises(TypeError, match="declared a counter, not a gauge"):
        counter.gauge()
    info = Family("x_info", "info", "X.", ("gpu", "name"), source="t")
    with pytest.raises(ValueError, match="do not begin its labels"):
        info.info(by=("name",))
    with pytest.raises(ValueError, match="are not its labels"):
        info.info({"gpu": "0"})


def test_by_label_serves_the_known_values_first_then_the_others():
    counter = Family("x_errors_total", "counter", "X.", ("reason",), source="test")
    family = counter.by_label({"late": 2, "timeout": 1}, known=("timeout", "refused"))
    assert [(s.labels["reason"], s.value) for s in family.samples] == [
        ("timeout", 1.0), ("refused", 0.0), ("late", 2.0)]
    gauge = Family("x_seconds", "gauge", "X.", ("gpu",), source="test")
    assert [s.labels["gpu"] for s in gauge.by_label({3: 1.0, 1: 2.0}).samples] == ["3", "1"]
    with pytest.raises(ValueError, match="one label"):
        Family("y", "gauge", "Y.", ("a", "b"), source="test").by_label({})


def test_without_sums_a_label_away_from_the_declaration():
    f = Family("x_bytes_total", "counter", "X.", ("gpu", "uuid", "link"), source="test")
    assert f.without("link").labels == ("gpu", "uuid")
    assert f.without("link").help == f.help and f.labels == ("gpu", "uuid", "link")
