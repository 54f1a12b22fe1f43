"""One validated, frozen Config from a YAML file plus command-line flags (flags win).

Config is composed of each area's settings (the serving side's, the sampler's, what
stands in for NVML, logging, and every collector's): each setting is declared once, as
a field of its area's settings dataclass (exporter/options.py), so a key can never be
known to the file but not to the flags, or the reverse. The file's keys stay flat.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from exporter.collectors import registry
from exporter.collectors.registry import CollectorsConfig
from exporter.health.settings import HealthSettings
from exporter.history.settings import HistorySettings
from exporter.metrics.settings import MetricsSettings
from exporter.options import (
    ALL,
    LOG_LEVELS,
    RECORD,
    RUN,
    SIMULATE,
    Option,
    build,
    not_blank,
    options_of,
    parse_listen_address,
    section,
    setting,
    unique,
    value_of,
)
from exporter.sampling.settings import SamplerSettings
from exporter.web.settings import ServingSettings
from exporter.yamlfile import ConfigError, Where, expect_mapping, load_yaml_file

__all__ = ["BackendSettings", "Config", "LogSettings", "all_options", "build_config",
           "load_config_file", "parse_listen_address", "validate"]


@dataclass(frozen=True)
class BackendSettings:
    """What the exporter reads: NVML, the built-in fake node, or a replayed trace."""

    fake: bool = setting(False, "run on the built-in simulated node instead of real NVML",
                         flag="--fake", commands=(RUN, RECORD))
    scenario: str = setting(
        "training", "fake scenario: a built-in name or a YAML file (docs/scenarios.md)",
        flag="--scenario", metavar="NAME|FILE", commands=(RUN, RECORD))
    fake_costs: bool = setting(
        True, "charge every fake NVML call the wall time and CPU a real H200 takes",
        flag="--fake.costs", commands=ALL, command_defaults={SIMULATE: False})
    replay: str | None = setting(
        None, "serve a recorded trace (ours or an nvidia-smi CSV log) as if live, looping "
        "at its end", flag="--replay", metavar="FILE", optional=True, check=not_blank)
    replay_speed: float = setting(
        1.0, "replay speed; a speed that would deliver more than 640 power samples a second "
        "per GPU is refused (above 12.8 for a recording at the driver's ~50 a second)",
        flag="--speed", low=0.01, high=1000.0, metavar="X")

    @property
    def name(self) -> str:
        """As the snapshot says it: "replay", "fake" or "nvml"."""
        return "replay" if self.replay else "fake" if self.fake else "nvml"

    @property
    def scenario_name(self) -> str:
        """The replayed file or the fake's scenario; "" on NVML."""
        return self.replay if self.replay else self.scenario if self.fake else ""


@dataclass(frozen=True)
class LogSettings:
    log_level: str = setting("info", "log level", flag="--log.level", choices=LOG_LEVELS,
                             metavar="LEVEL", commands=(RUN, SIMULATE))


@dataclass(frozen=True)
class Config:
    """Every setting; build with Config.of(), build_config() or load_config_file()."""

    serving: ServingSettings = section(ServingSettings)
    metrics: MetricsSettings = section(MetricsSettings)
    backend: BackendSettings = section(BackendSettings)
    sampler: SamplerSettings = section(SamplerSettings)
    log: LogSettings = section(LogSettings)
    history: HistorySettings = section(HistorySettings)
    health: HealthSettings = section(HealthSettings)
    collectors: CollectorsConfig = field(default_factory=lambda: CollectorsConfig.of({}))

    @classmethod
    def of(cls, **values: object) -> Config:
        """From flat config keys (the file's); the others keep their defaults. Raises
        TypeError for a key that is no setting."""
        collector_keys = {o.key for o in registry.options()}
        unknown = sorted(set(values) - {o.key for o in all_options()})
        if unknown:
            raise TypeError(f"unknown setting {unknown[0]!r}")
        own = {k: v for k, v in values.items() if k not in collector_keys}
        return dataclasses.replace(
            build(cls, own),
            collectors=CollectorsConfig.of({k: v for k, v in values.items()
                                            if k in collector_keys}))

    def values(self) -> dict[str, object]:
        """Config key -> value, every setting."""
        return {**{o.key: value_of(self, o) for o in _own_options()},
                **self.collectors.values()}

    def replace(self, **values: object) -> Config:
        """A copy with these config keys changed."""
        return Config.of(**{**self.values(), **values})

    @property
    def host_port(self) -> tuple[str, int]:
        return self.serving.host_port


def _own_options() -> list[Option]:
    """Config's settings less the collectors' (analyze-only thresholds are no key)."""
    return [o for o in options_of(Config) if set(o.commands) & set(ALL)]


@cache
def all_options() -> tuple[Option, ...]:
    """The settings of run, simulate and record: Config's and every collector's."""
    return tuple(unique([*_own_options(), *registry.options()]))


def _option(key: str) -> Option:
    return next(o for o in all_options() if o.key == key)


def _cross_checks(config: Config) -> list[tuple[str, str]]:
    """(key, problem) for rules that span keys."""
    problems = []
    if config.backend.replay is not None and config.backend.fake:
        problems.append(("replay", "--replay and --fake both replace NVML: choose one"))
    if config.serving.stale_after_seconds <= config.sampler.sweep_interval_seconds:
        problems.append(("stale_after_seconds", "must be longer than sweep_interval_seconds"))
    for spec in registry.specs():
        if config.collectors.enabled.get(spec.name):
            missing = spec.missing(config.collectors)
            if missing:
                problems.append((spec.key, missing))
    return problems


def validate(config: Config, where: Where | None = None) -> Config:
    """Check every value and the rules across keys; raise ConfigError naming the key
    (with file and line when `where` is the file's)."""

    def fail(key: str, message: str) -> ConfigError:
        if where is not None:
            return where.error(key, message)
        flag = _option(key).flag
        return ConfigError(f"{flag} (config key {key}): {message}" if flag else
                           f"{key}: {message}")

    values = config.values()
    for option in all_options():
        problem = option.problem(values[option.key])
        if problem:
            raise fail(option.key, problem)
    for key, problem in _cross_checks(config):
        raise fail(key, problem)
    return config


def load_config_file(path: str | Path) -> Config:
    data = load_yaml_file(path)
    where = Where(str(path), data)
    in_file = {o.key for o in all_options() if o.in_file}
    # a flag written as a key (web.listen-address): point at the key it sets
    flags = {o.flag.lstrip("-"): o.key for o in all_options() if o.flag and o.key in in_file}
    mapping = expect_mapping(data, where, in_file, flags)
    values = {}
    for key, value in mapping.items():
        option = _option(key)
        problem = option.problem(value)  # as written, before any conversion
        if problem:
            raise where.error(key, problem)
        if not isinstance(value, bool) and isinstance(value, int | float):
            if option.kind is float:
                value = float(value)
            elif option.kind is int and float(value).is_integer():
                value = int(value)
        values[key] = value
    try:
        config = Config.of(**values)
    except TypeError as exc:  # cannot happen for known keys; keep one line if it does
        raise where.error(None, str(exc)) from None
    return validate(config, where)


def build_config(path: str | None, overrides: dict[str, object]) -> Config:
    """The file's values (or defaults), then every flag that was given."""
    config = load_config_file(path) if path else Config()
    given = {k: v for k, v in overrides.items() if v is not None}
    return validate(config.replace(**given))
