"""Settings declared once: every command that takes a setting takes its one declaration,
so `run`, `record`, `simulate` and `analyze` cannot disagree on a default, and a config
survives the round trip through its flat keys."""

from __future__ import annotations

import dataclasses

import pytest

from exporter.app import sampler_settings
from exporter.cli import build_parser
from exporter.commands import analyze, record
from exporter.config import Config, all_options, build_config
from exporter.offline.request import AnalyzeRequest
from exporter.options import (
    ANALYZE,
    RECORD,
    RUN,
    SIMULATE,
    build,
    options_of,
    resolve,
    setting,
    value_of,
)
from exporter.sampling.settings import PowerSettings, SamplerSettings, StragglerSettings


def _run_config() -> Config:
    args = build_parser().parse_args(["run"])
    return build_config(None, {o.key: getattr(args, o.key) for o in all_options()
                               if o.flag is not None and RUN in o.commands})


def _record_config() -> Config:
    args = build_parser().parse_args(["record", "--duration", "1", "--out", "x.cte"])
    return Config.of(**resolve(args, RECORD, all_options()))


def _simulate_config() -> Config:
    args = build_parser().parse_args(["simulate"])
    return Config.of(**resolve(args, SIMULATE, all_options()))


def test_record_and_run_sample_with_the_same_settings():
    run, rec = sampler_settings(_run_config()), record.sampler_settings(_record_config())
    # what record leaves out on purpose: the live analyses and both XID sources (NVML's
    # events, the kernel log); and the NVLink fields follow the metric selection run
    # serves, which record has none of
    assert run.kmsg_path == "/dev/kmsg" and rec.kmsg_path == ""
    expected = dataclasses.replace(run, power=None, stragglers=None, xid_events=False,
                                   kmsg_path="", nvlink_reads=rec.nvlink_reads)
    assert rec == expected
    assert _run_config().collectors == _record_config().collectors


def test_every_command_has_the_same_default_for_every_key():
    configs = {RUN: _run_config(), RECORD: _record_config(), SIMULATE: _simulate_config()}
    values = {command: config.values() for command, config in configs.items()}
    checked = 0
    for option in all_options():
        for command in option.commands:
            if command in configs and command not in option.command_defaults:
                assert values[command][option.key] == values[RUN][option.key], (
                    command, option.key)
                checked += 1
    assert checked > 40  # every key of run, and the shared ones of record and simulate
    # the one declared difference: a fleet of fake nodes runs without call costs
    assert not configs[SIMULATE].backend.fake_costs and configs[RUN].backend.fake_costs


def test_analyze_takes_the_live_analyses_thresholds():
    args = build_parser().parse_args(["analyze", "trace.csv"])
    shared = analyze.shared_options()
    assert set(shared) == {"--window", "--band", "--min-amplitude-ratio", "--min-band-energy",
                           "--min-synchrony", "--segment-window", "--hold", "--cycle-window",
                           "--cycle-min-ratio", "--ramp-ratio", "--dip-ratio", "--persistence",
                           "--outlier-window", "--outlier-step", "--stall-window",
                           "--stall-context"}
    # the live analyses' values as the sampler holds them, by key
    live = {o.key: value_of(SamplerSettings(), o) for o in options_of(SamplerSettings)}
    for option in shared.values():
        assert getattr(args, option.dest_for(ANALYZE)) == live[option.key], option.key
    assert args.persistence == StragglerSettings().persistence_seconds == 300.0
    assert args.band == PowerSettings().band_hz


def test_analyze_still_refuses_a_bad_shared_threshold(capsys):
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(["analyze", "trace.csv", "--min-synchrony", "1.5"])
    assert exit_.value.code == 2
    assert "must be a ratio between 0 and 1" in capsys.readouterr().err


def test_a_config_survives_its_flat_keys():
    config = Config.of(fake=True, power_drain_interval_seconds=0.5, collector_host=False,
                       hpc_job_mapping_dir="/run/jobs", straggler_persistence_seconds=60.0)
    assert Config.of(**config.values()) == config
    assert config.sampler.power_drain_interval_seconds == 0.5
    assert config.sampler.stragglers is not None
    assert config.sampler.stragglers.persistence_seconds == 60.0
    assert config.collectors.enabled["host"] is False
    assert config.replace(fake=False).backend.fake is False
    assert config.backend.fake  # the original is untouched


def test_an_unknown_key_is_refused():
    with pytest.raises(TypeError, match="unknown setting 'power_drain'"):
        Config.of(power_drain=1.0)
    with pytest.raises(TypeError, match="unknown setting 'window_seconds'"):
        Config.of(window_seconds=10.0)  # analyze's flag, not a config key
    with pytest.raises(TypeError, match="unknown setting 'bogus'"):
        build(SamplerSettings, {"bogus": 1})


def test_keys_are_unique_and_each_field_declares_its_type():
    keys = [o.key for o in all_options()]
    assert len(keys) == len(set(keys))
    kinds = {o.key: o.kind for o in all_options()}
    assert kinds["power_drain_interval_seconds"] is float
    assert kinds["expected_gpus"] is int  # int | None
    assert kinds["replay"] is str  # str | None
    assert kinds["collector_host"] is bool


def test_a_new_setting_is_one_field():
    @dataclasses.dataclass(frozen=True)
    class Example:
        rate_hz: float = setting(2.0, "a rate", flag="--example.rate", low=1.0, high=4.0)
        label: str | None = setting(None, "a label", key="example_label", optional=True)

    (rate, label) = options_of(Example)
    assert (rate.key, rate.flag, rate.kind, rate.default) == ("rate_hz", "--example.rate",
                                                               float, 2.0)
    assert (label.key, label.flag, label.kind) == ("example_label", None, str)
    assert rate.problem(5.0) == "5.0 is out of range [1, 4]"
    assert rate.problem("fast") == "expected a number, got 'fast'"
    assert build(Example, {"example_label": "x"}) == Example(label="x")


def test_number_flags_read_every_spelling_of_a_number():
    """A ratio of 0 may be written 0.00 (it was refused as 'not positive'); NaN and
    infinity are refused by every number flag."""
    import argparse

    from exporter.options import non_negative, positive, ratio

    assert ratio("0.00") == 0.0 and ratio("1") == 1.0 and non_negative("0e0") == 0.0
    for parse, text in ((ratio, "-0.1"), (ratio, "1.01"), (ratio, "nan"), (positive, "0"),
                        (positive, "inf"), (non_negative, "-1")):
        with pytest.raises(argparse.ArgumentTypeError):
            parse(text)


def test_analyze_builds_the_settings_objects_run_builds():
    """analyze's flags land in the same PowerSettings and StragglerSettings objects the
    sampler holds, and its own inputs in the request beside them."""
    req = AnalyzeRequest.of(build_parser().parse_args(["analyze", "trace.csv"]))
    assert (req.power, req.stragglers) == (PowerSettings(), StragglerSettings())
    assert (req.file, req.format, req.tdp, req.step) == ("trace.csv", "text", None, None)
    req = AnalyzeRequest.of(build_parser().parse_args([
        "analyze", "t.csv", "--outlier-window", "30", "--persistence", "45", "--dip-ratio",
        "0.5", "--min-band-energy", "0.4", "--band", "0.2-2", "--tdp", "700",
        "--format", "json"]))
    assert req.stragglers == StragglerSettings(window_seconds=30.0, persistence_seconds=45.0)
    assert req.power == PowerSettings(dip_min_ratio=0.5, min_band_energy_ratio=0.4,
                                      band_hz=(0.2, 2.0))
    assert (req.tdp, req.format) == (700.0, "json")
    th = req.power.swing_thresholds()
    assert (th.min_band_energy_ratio, th.band_hz) == (0.4, (0.2, 2.0))
    assert req.stragglers.thresholds().persistence_seconds == 45.0


@pytest.mark.parametrize(("flag", "value", "said"), [
    ("--min-amplitude-ratio", "1.5", "must be a ratio between 0 and 1"),
    ("--persistence", "90000", "must be between 0 and 86400"),
    ("--persistence", "-1", "must be between 0 and 86400"),
    ("--persistence", "soon", "not a number"),
])
def test_analyze_derives_its_parser_from_the_declared_range(capsys, flag, value, said):
    """One declaration of a range (low, high) checks the config key, run's flag and
    analyze's flag alike."""
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(["analyze", "trace.csv", flag, value])
    assert exit_.value.code == 2
    assert said in capsys.readouterr().err
    option = analyze.shared_options()[flag]
    assert option.parse is None and option.low is not None
    assert option.parser()(str(option.high)) == option.high
