"""One validated, frozen Config from a YAML file plus command-line flags (flags win)."""

from __future__ import annotations

import re
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from exporter.collectors.host import DEFAULT_NETWORK_EXCLUDE
from exporter.yamlfile import (
    ConfigError,
    Where,
    excerpt,
    expect_mapping,
    get_bool,
    get_number,
    get_string,
    load_yaml_file,
)

DEFAULT_PORT = 9955  # free of node_exporter 9100, dcgm-exporter 9400, nvidia_gpu_exporter 9835
LOG_LEVELS = ("debug", "info", "warning", "error")

# Config keys as the command line spells them, for error messages about flags.
FLAG_NAMES = {
    "listen_address": "--web.listen-address",
    "web_config_file": "--web.config.file",
    "power_sample_rate_hz": "--power.sample-rate",
    "sweep_interval_seconds": "--sweep.interval",
    "stale_after_seconds": "--health.stale-after",
    "path_sysfs": "--path.sysfs",
    "host_network_exclude": "--collector.host.network-exclude",
    "hpc_job_mapping_dir": "--hpc-job-mapping-dir",
    "expected_gpus": "--gpus.expected",
    "hang_timeout_seconds": "--nvml.hang-timeout",
    "straggler_persistence_seconds": "--straggler.persistence",
    "replay": "--replay",
    "gpu_health_interval_seconds": "--sweep.health-interval",
    "replay_speed": "--speed",
    "log_level": "--log.level",
}


@dataclass(frozen=True)
class Config:
    listen_address: str = f":{DEFAULT_PORT}"
    web_config_file: str = ""  # TLS and basic auth (exporter-toolkit format); "" = plain HTTP
    power_sample_rate_hz: float = 20.0
    sweep_interval_seconds: float = 1.0
    sources_interval_seconds: float = 5.0
    stale_after_seconds: float = 10.0
    fake: bool = False
    scenario: str = "training"
    path_sysfs: str = "/sys"
    collector_infiniband: bool = True
    collector_host: bool = True
    host_network_exclude: str = DEFAULT_NETWORK_EXCLUDE
    hpc_job_mapping_dir: str | None = None  # unset: the jobs collector is off
    expected_gpus: int | None = None  # unset: the count NVML reports at start
    hang_timeout_seconds: float = 2.0
    gpu_recovery_interval_seconds: float = 10.0
    straggler_persistence_seconds: float = 300.0
    gpu_health_interval_seconds: float = 5.0  # ECC, row remapping, NVLink counters
    replay: str | None = None  # a trace to serve as if live, instead of NVML
    replay_speed: float = 1.0
    log_level: str = "info"

    @property
    def host_port(self) -> tuple[str, int]:
        return parse_listen_address(self.listen_address)


# key -> (low, high) for numbers
_NUMBER_RANGES = {
    "power_sample_rate_hz": (1.0, 100.0),
    "sweep_interval_seconds": (0.1, 60.0),
    "sources_interval_seconds": (0.5, 600.0),
    "stale_after_seconds": (1.0, 3600.0),
    "hang_timeout_seconds": (0.2, 600.0),
    "gpu_recovery_interval_seconds": (0.1, 3600.0),
    "straggler_persistence_seconds": (0.0, 86400.0),
    "replay_speed": (0.01, 1000.0),
    "gpu_health_interval_seconds": (0.1, 600.0),
}
# key -> (low, high) for whole numbers that may be left unset
_OPTIONAL_INTS = {"expected_gpus": (0, 1024)}


def parse_listen_address(text: str) -> tuple[str, int]:
    """'host:port', ':port' or '[v6]:port' -> (host, port); host '' means every address."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"listen address {excerpt(text)}: expected HOST:PORT with PORT 0-65535")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise ConfigError(f"listen address {excerpt(text)}: write IPv6 hosts in brackets, "
                          "[::1]:9955")
    return host, int(port)


def validate(config: Config, where: Where | None = None, mapping: Any = None) -> Config:
    """Check cross-field and format rules; raise ConfigError naming the key."""
    where = where or Where("flags")

    def fail(key: str, message: str) -> ConfigError:
        if mapping is not None:
            return where.error(key, message)
        return ConfigError(f"{FLAG_NAMES.get(key, key)} (config key {key}): {message}")

    try:
        parse_listen_address(config.listen_address)
    except ConfigError as exc:
        raise fail("listen_address", str(exc)) from None
    for key, (low, high) in _NUMBER_RANGES.items():
        value = getattr(config, key)
        if not low <= value <= high:
            raise fail(key, f"{excerpt(value)} is out of range [{low:g}, {high:g}]")
    for key, (low, high) in _OPTIONAL_INTS.items():
        value = getattr(config, key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or not low <= value <= high):
            raise fail(key, f"expected a whole number in [{low}, {high}], got {excerpt(value)}")
    if config.log_level not in LOG_LEVELS:
        raise fail("log_level", f"expected one of {', '.join(LOG_LEVELS)}")
    if not isinstance(config.host_network_exclude, str):
        raise fail("host_network_exclude", "expected a regular expression")
    try:
        re.compile(config.host_network_exclude)
    except re.error as exc:
        raise fail("host_network_exclude", f"invalid regular expression: {exc}") from None
    if config.hpc_job_mapping_dir is not None and not config.hpc_job_mapping_dir.strip():
        raise fail("hpc_job_mapping_dir", "expected a directory path (leave unset to turn "
                   "the jobs collector off)")
    if config.replay is not None and config.fake:
        raise fail("replay", "--replay and --fake both replace NVML: choose one")
    if config.stale_after_seconds <= config.sweep_interval_seconds:
        raise fail("stale_after_seconds", "must be longer than sweep_interval_seconds")
    return config


def load_config_file(path: str | Path) -> Config:
    data = load_yaml_file(path)
    where = Where(str(path), data)
    names = {f.name for f in fields(Config)}
    mapping = expect_mapping(data, where, names)
    defaults = Config()
    values: dict[str, Any] = {}
    for name in names:
        if name not in mapping:
            continue
        default = getattr(defaults, name)
        if isinstance(default, bool):
            values[name] = get_bool(mapping, name, where, default)
        elif isinstance(default, float):
            low, high = _NUMBER_RANGES[name]
            values[name] = get_number(mapping, name, where, default, low=low, high=high)
        elif name in _OPTIONAL_INTS:
            low, high = _OPTIONAL_INTS[name]
            values[name] = get_number(mapping, name, where, 0, low=low, high=high,
                                      integer=True)
        else:
            values[name] = get_string(mapping, name, where, default)
    return validate(replace(defaults, **values), where, mapping)


def build_config(path: str | None, overrides: dict[str, Any]) -> Config:
    """The file's values (or defaults), then every flag that was given."""
    config = load_config_file(path) if path else Config()
    given = {k: v for k, v in overrides.items() if v is not None}
    return validate(replace(config, **given))
