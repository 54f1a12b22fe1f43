"""offline.band: which evidence decides whether power is averaged, and the band it leaves."""

from __future__ import annotations

from pathlib import Path

import pytest

from exporter.commands import analyze
from exporter.offline.band import decide_band
from exporter.offline.gpu_models import gpu_model
from exporter.traces.load import load_trace
from tests.synth_power import H100, Case, write_trace


@pytest.mark.parametrize(("name", "generation", "averages"), [
    ("NVIDIA H100 80GB HBM3", "Hopper", True),
    ("NVIDIA H200", "Hopper", True),
    ("NVIDIA GH200 480GB", "Hopper", True),
    ("NVIDIA B200", "Blackwell", True),
    ("NVIDIA GeForce RTX 5090", "Blackwell", True),
    ("NVIDIA L40S", "Ada Lovelace", True),
    ("NVIDIA RTX 6000 Ada Generation", "Ada Lovelace", True),
    ("NVIDIA A10G", "Ampere GA10x", True),
    ("NVIDIA RTX A6000", "Ampere GA10x", True),
    ("NVIDIA GeForce RTX 3090", "Ampere GA10x", True),
    ("NVIDIA A100-SXM4-80GB", "Ampere GA100", False),
    ("NVIDIA A100 80GB PCIe", "Ampere GA100", False),
    ("NVIDIA A30", "Ampere GA100", False),
    ("NVIDIA A800-SXM4-80GB", "Ampere GA100", False),
    ("Tesla V100-SXM2-32GB", "Volta", False),
    ("Quadro RTX 6000", "Turing", False),
    ("Tesla T4", "Turing", False),
    ("Tesla P100-PCIE-16GB", "Pascal", False),
    ("Tesla K80", "Kepler", False),
])
def test_gpu_models(name: str, generation: str, averages: bool) -> None:
    model = gpu_model(name)
    assert model is not None and model.generation == generation
    assert model.averages_power_draw is averages


def test_unknown_gpu_model() -> None:
    assert gpu_model("Acme Tensor Brick 9000") is None


def band_of(tmp_path: Path, case: Case, flag: float | None = None):
    return decide_band(load_trace(write_trace(case, tmp_path)), flag)


SHORT = {"gpus": 4, "seconds": 90.0}


def test_column_decides_first(tmp_path: Path) -> None:
    # nvidia-smi's own word beats the GPU name, and the data cannot overrule it
    b = band_of(tmp_path, Case("avgcol", gpu_name="NVIDIA A100-SXM4-80GB",
                               column="power.draw.average", **SHORT))
    assert (b.kind, b.decided_by) == ("averaged", "column")
    assert b.confidence == "medium" and any("disagree" in e for e in b.evidence)
    b = band_of(tmp_path, Case("instcol", gpu_name=H100, column="power.draw.instant", **SHORT))
    assert (b.kind, b.decided_by, b.confidence) == ("instantaneous", "column", "high")
    assert b.observable_hz == pytest.approx(10.0, rel=0.05)


def test_gpu_name_decides_plain_power_draw(tmp_path: Path) -> None:
    b = band_of(tmp_path, Case("h100", gpu_name=H100, averaged=True, interval_s=0.3, **SHORT))
    assert (b.kind, b.seconds, b.decided_by, b.confidence) == ("averaged", 1.0, "gpu-name",
                                                               "high")
    assert b.observable_hz == pytest.approx(0.5)
    assert "Hopper" in b.evidence[0]


def test_data_proof_overrules_the_gpu_name(tmp_path: Path) -> None:
    # a log labelled H100 whose power jumps between levels within a poll: not averaged
    b = band_of(tmp_path, Case("liar", gpu_name=H100, **SHORT))
    assert (b.kind, b.decided_by, b.confidence) == ("instantaneous", "data", "high")
    assert "overruled" in b.evidence[-1]


def test_flag_decides_over_everything(tmp_path: Path) -> None:
    case = Case("a100", **SHORT)  # A100: instantaneous, and the data agree
    b = band_of(tmp_path, case, flag=2.0)
    assert (b.kind, b.seconds, b.decided_by, b.confidence) == ("averaged", 2.0, "flag",
                                                               "certain")
    assert b.observable_hz == pytest.approx(0.25)
    assert any("disagree" in e for e in b.evidence)
    b = band_of(tmp_path, case, flag=0.0)
    assert (b.kind, b.decided_by) == ("instantaneous", "flag")


def test_cte_header_and_traces_from_before_it(tmp_path: Path) -> None:
    b = band_of(tmp_path, Case("cte-avg", column="cte", averaged=True, gpu_name=None,
                               **SHORT))
    assert (b.kind, b.seconds, b.decided_by) == ("averaged", 1.0, "metadata")
    old = Case("cte-v0", column="cte", gpu_name=None, extra={"old_header": 1.0}, **SHORT)
    path = write_trace(old, tmp_path)
    assert "power_averaging_seconds" not in path.read_text().splitlines()[0]
    b = decide_band(load_trace(path), None)
    # the header does not say; the exporter always recorded instantaneous power, and
    # the data agree, which lifts the confidence
    assert (b.kind, b.decided_by, b.confidence) == ("instantaneous", "metadata", "high")


def test_nothing_to_go_on_is_unknown_and_conservative(tmp_path: Path) -> None:
    # plain power.draw, no name, polled every 2 s: neither the file nor the data can tell
    b = band_of(tmp_path, Case("blind", gpu_name=None, interval_s=2.0, swing_hz=None,
                               gpus=4, seconds=300.0))
    assert (b.kind, b.decided_by, b.confidence) == ("unknown", "none", "low")
    assert b.observable_hz == pytest.approx(0.25, rel=0.01)  # Nyquist, below an average's 0.5
    assert any("cannot tell" in e for e in b.evidence)


def test_sensor_slower_than_the_polls_sets_the_band(tmp_path: Path) -> None:
    b = band_of(tmp_path, Case("upd", gpu_name="NVIDIA A100-SXM4-80GB", sensor_update_s=0.1,
                               **SHORT))
    assert b.sensor_update_seconds == pytest.approx(0.1, rel=0.1)
    assert b.observable_hz == pytest.approx(5.0, rel=0.1)
    assert any("sensor's own updates" in e for e in b.evidence)


def test_power_averaging_flag_parsing() -> None:
    parse = analyze.build_parser().parse_args
    assert parse(["f"]).power_averaging is None
    assert parse(["f", "--power-averaging", "auto"]).power_averaging is None
    assert parse(["f", "--power-averaging", "none"]).power_averaging == 0.0
    assert parse(["f", "--power-averaging", "1.5"]).power_averaging == 1.5
    for bad in ("-1", "soon", "nan"):
        with pytest.raises(SystemExit):
            parse(["f", "--power-averaging", bad])
    assert parse(["f", "--gpus", "4096"]).gpus == 4096
    with pytest.raises(SystemExit):
        parse(["f", "--gpus", "1000000000"])
