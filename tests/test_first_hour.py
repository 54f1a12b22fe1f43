"""The first hour's mistakes, each answered by one line that says what to do: a flag typo,
a quoted boolean, a YAML 1.1 float, a busy port in `simulate`, a bad selection item, a
fleet scenario given to `run`; and the help and summaries a new user reads
(power_sample_rate_hz, check-config's collectors)."""

from __future__ import annotations

import socket

import pytest

from exporter.cli import main
from exporter.config import load_config_file
from exporter.metrics.selection import load_selection
from exporter.yamlfile import ConfigError


def error_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err, err
    return err


def test_a_flag_typo_names_the_flag_meant(capsys):
    assert main(["run", "--metrics.compt", "dcgm-exporter"]) == 2
    assert "did you mean --metrics.compat?" in error_line(capsys)
    assert main(["run", "--web.listen-adress=:9955"]) == 2
    assert "did you mean --web.listen-address?" in error_line(capsys)
    assert main(["run", "--zzz"]) == 2  # nothing close: no guess
    assert "did you mean" not in error_line(capsys)


def test_a_quoted_boolean_is_called_a_quoted_string(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text('collector_infiniband: "true"\n')
    with pytest.raises(ConfigError, match="a quoted string: write true without quotes"):
        load_config_file(path)
    path.write_text("collector_infiniband: maybe\n")
    with pytest.raises(ConfigError) as raised:
        load_config_file(path)
    assert "a quoted string" not in str(raised.value)


@pytest.mark.parametrize("text", ["1.0e1", "1e1", "+1E1", "1.0e+1"])
def test_a_float_with_an_unsigned_exponent_is_a_number(tmp_path, text):
    path = tmp_path / "c.yaml"
    path.write_text(f"stale_after_seconds: {text}\n")  # YAML 1.1 reads 1.0e1 as a string
    config = load_config_file(path)
    assert config.serving.stale_after_seconds == 10.0


def test_simulate_names_the_busy_port(capsys):
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    port = busy.getsockname()[1]
    try:
        # the busy port is the first node's: another test's port next to it, taken
        # meanwhile, cannot be the one named
        code = main(["simulate", "--nodes", "2", "--base-port", str(port),
                     "--listen-host", "127.0.0.1"])
    finally:
        busy.close()
    assert code == 1
    assert f"127.0.0.1:{port}:" in error_line(capsys)


def test_a_selection_item_error_points_at_the_items_line(tmp_path):
    path = tmp_path / "sel.yaml"
    path.write_text("include:\n  - gpu_nvlink_link_up\n  - gpu_tempreature_celsius\n")
    with pytest.raises(ConfigError) as raised:
        load_selection("standard", str(path))
    assert str(raised.value).startswith(f"{path}:3: include: item 2")
    path.write_text("exclude: [host_load1, nope_*]\n")
    with pytest.raises(ConfigError, match=r"sel.yaml:1: exclude: item 2"):
        load_selection("standard", str(path))


def test_run_with_a_fleet_scenario_says_it_is_one_for_simulate(capsys):
    assert main(["run", "--fake", "--scenario", "faults"]) == 2
    line = error_line(capsys)
    assert "fleet scenario" in line and "simulate --scenario faults" in line


def test_power_sample_rate_says_when_it_applies():
    from exporter.config import all_options

    (option,) = [o for o in all_options() if o.key == "power_sample_rate_hz"]
    assert "only" in option.help and "buffer" in option.help and "unused" in option.help


def test_check_config_lists_only_collectors_that_serve_something(tmp_path, capsys):
    path = tmp_path / "c.yaml"
    path.write_text("metrics_profile: minimal\ncollector_host: true\n")
    assert main(["check-config", str(path)]) == 0
    minimal = capsys.readouterr().out
    path.write_text("metrics_profile: standard\ncollector_host: true\n")
    assert main(["check-config", str(path)]) == 0
    standard = capsys.readouterr().out
    # host_* families are standard: under minimal the host collector serves nothing
    assert "host" not in minimal.split("collectors:")[1].split(";")[0]
    assert "host" in standard.split("collectors:")[1].split(";")[0]


def test_run_help_lists_the_built_in_scenarios(capsys):
    from exporter.sim.scenarios import builtin_names

    with pytest.raises(SystemExit) as done:
        main(["run", "--help"])
    assert done.value.code == 0
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps the epilog
    names = builtin_names()
    assert {"training", "gpu-lost", "straggler", "xid"} <= set(names)
    assert "built-in scenarios" in text
    for name in names:
        assert f" {name}," in text or f" {name}." in text or f" {name} " in text, name
