"""One validated, frozen Config from a YAML file plus command-line flags (flags win).

Config's fields are the options of exporter/options.py and of every collector
(exporter/collectors/registry.py): one definition each, so a key can never be known to
the file but not to the flags, or the reverse.
"""

from __future__ import annotations

import dataclasses
from functools import cache
from pathlib import Path
from typing import Any

from exporter.collectors import registry
from exporter.options import CORE, DEFAULT_PORT, Option, unique
from exporter.yamlfile import ConfigError, Where, excerpt, expect_mapping, load_yaml_file

__all__ = ["DEFAULT_PORT", "Config", "all_options", "build_config", "load_config_file",
           "parse_listen_address", "validate"]


@cache
def all_options() -> tuple[Option, ...]:
    return tuple(unique([*CORE, *registry.options()]))


def parse_listen_address(text: str) -> tuple[str, int]:
    """'host:port', ':port' or '[v6]:port' -> (host, port); host '' means every address."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"listen address {excerpt(text)}: expected HOST:PORT with PORT "
                          "0-65535")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise ConfigError(f"listen address {excerpt(text)}: write IPv6 hosts in brackets, "
                          "[::1]:9955")
    return host, int(port)


def _make_config_class() -> type:
    fields = []
    for option in all_options():
        default = option.default
        if isinstance(default, dict | list):
            default = dataclasses.field(default_factory=lambda d=default: type(d)(d))
        fields.append((option.key, Any, default))
    namespace = {
        "__doc__": "Every setting; build with build_config() or load_config_file().",
        "host_port": property(lambda self: parse_listen_address(self.listen_address)),
    }
    cls = dataclasses.make_dataclass("Config", fields, frozen=True, namespace=namespace)
    cls.__module__ = __name__
    return cls


Config = _make_config_class()


def _option(key: str) -> Option:
    return next(o for o in all_options() if o.key == key)


def _cross_checks(config: Any) -> list[tuple[str, str]]:
    """(key, problem) for rules that span keys."""
    problems = []
    if config.replay is not None and config.fake:
        problems.append(("replay", "--replay and --fake both replace NVML: choose one"))
    if config.stale_after_seconds <= config.sweep_interval_seconds:
        problems.append(("stale_after_seconds", "must be longer than sweep_interval_seconds"))
    for spec in registry.specs():
        if getattr(config, spec.key) and spec.requirement is not None:
            missing = spec.requirement(config)
            if missing:
                problems.append((spec.key, missing))
    return problems


def validate(config: Any, where: Where | None = None) -> Any:
    """Check every value and the rules across keys; raise ConfigError naming the key
    (with file and line when `where` is the file's)."""

    def fail(key: str, message: str) -> ConfigError:
        if where is not None:
            return where.error(key, message)
        flag = _option(key).flag
        return ConfigError(f"{flag} (config key {key}): {message}" if flag else
                           f"{key}: {message}")

    for option in all_options():
        problem = option.problem(getattr(config, option.key))
        if problem:
            raise fail(option.key, problem)
    for key, problem in _cross_checks(config):
        raise fail(key, problem)
    return config


def load_config_file(path: str | Path) -> Any:
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
        config = Config(**values)
    except TypeError as exc:  # cannot happen for known keys; keep one line if it does
        raise where.error(None, str(exc)) from None
    return validate(config, where)


def build_config(path: str | None, overrides: dict[str, Any]) -> Any:
    """The file's values (or defaults), then every flag that was given."""
    config = load_config_file(path) if path else Config()
    given = {k: v for k, v in overrides.items() if v is not None}
    return validate(dataclasses.replace(config, **given))
