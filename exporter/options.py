"""Every setting, defined once: config key, flag, type, default, range and help.

The command line (run, simulate, record), the config file's keys, `check-config` and the
flags table in docs/configuration.md are all derived from these definitions and from
each collector's own options (exporter/collectors/registry.py). A setting is added here
(or in its collector's spec) and nowhere else.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from exporter.metrics.profiles import DEFAULT_PROFILE, PROFILES

DEFAULT_PORT = 9955  # free of node_exporter 9100, dcgm-exporter 9400, nvidia_gpu_exporter 9835
LOG_LEVELS = ("debug", "info", "warning", "error")
RUN, SIMULATE, RECORD = "run", "simulate", "record"


@dataclass(frozen=True)
class Option:
    """One setting. `flag` None: config file only; `key` None: flag only (not in Config)."""

    key: str
    flag: str | None
    kind: type  # bool, int, float or str
    default: Any
    help: str
    low: float | None = None
    high: float | None = None
    choices: tuple[str, ...] = ()
    metavar: str | None = None
    optional: bool = False  # may be unset (None)
    commands: tuple[str, ...] = (RUN,)
    # per-command defaults where a command needs another (simulate runs many nodes)
    command_defaults: dict[str, Any] = field(default_factory=dict)
    check: Callable[[Any], str | None] | None = None  # extra validation: an error or None
    in_file: bool = True  # settable in the config file

    def default_for(self, command: str) -> Any:
        return self.command_defaults.get(command, self.default)

    def problem(self, value: Any) -> str | None:
        """What is wrong with a value of this option, or None (values quoted short)."""
        from exporter.yamlfile import excerpt

        if value is None:
            return None if self.optional or self.default is None else "must be set"
        if self.kind is bool:
            return None if isinstance(value, bool) else (
                f"expected true or false, got {excerpt(value)}")
        if self.kind in (int, float):
            if isinstance(value, bool) or not isinstance(value, int | float):
                return f"expected a number, got {excerpt(value)}"
            if self.kind is int and not float(value).is_integer():
                return f"expected a whole number, got {excerpt(value)}"
            if self.low is not None and not self.low <= value <= self.high:
                return f"{excerpt(value)} is out of range [{self.low:g}, {self.high:g}]"
        elif not isinstance(value, str):
            return f"expected a string, got {excerpt(value)}"
        if self.choices and value not in self.choices:
            return f"expected one of {', '.join(self.choices)}"
        return self.check(value) if self.check is not None else None

    def add_to(self, parser: argparse.ArgumentParser, command: str) -> None:
        """The flag on a subcommand's parser; its value is None when not given."""
        assert self.flag is not None
        text = self.help
        default = self.default_for(command)
        if self.kind is bool:
            if default is not None:
                text += f" (default {'on' if default else 'off'})"
            parser.add_argument(self.flag, dest=self.key, default=None,
                                action=argparse.BooleanOptionalAction, help=text)
            return
        if default not in (None, ""):
            text += f" (default {default:g})" if isinstance(default, float) else (
                f" (default {default})")
        parser.add_argument(self.flag, dest=self.key, type=self.kind, default=None,
                            metavar=self.metavar or self.kind.__name__.upper(),
                            choices=self.choices or None, help=text)


def _listen_address_problem(text: str) -> str | None:
    from exporter.config import parse_listen_address
    from exporter.yamlfile import ConfigError

    try:
        parse_listen_address(text)
    except ConfigError as exc:
        return str(exc)
    return None


def _not_blank(text: str) -> str | None:
    return None if text.strip() else "expected a path"


ALL = (RUN, SIMULATE, RECORD)
# Settings shared by run, simulate and record (sampling, the fake, logging).
SHARED: tuple[Option, ...] = (
    Option("power_sample_rate_hz", "--power.sample-rate", float, 20.0,
           "polling rate of the instant-power field, for GPUs whose driver keeps no buffer "
           "of power samples", 1.0, 100.0, metavar="HZ", commands=ALL),
    Option("power_drain_interval_seconds", "--power.drain-interval", float, 1.0,
           "how often the driver's power-sample buffer is drained (it holds ~2.4 s)",
           0.1, 2.0, metavar="SECONDS", commands=ALL),
    Option("energy_interval_seconds", "--energy.interval", float, 30.0,
           "how often the energy counter is read (a ~4 ms call on Hopper)", 1.0, 3600.0,
           metavar="SECONDS", commands=ALL),
    Option("sweep_interval_seconds", "--sweep.interval", float, 1.0,
           "full GPU sweep and snapshot interval", 0.1, 60.0, metavar="SECONDS",
           commands=ALL),
    Option("gpu_health_interval_seconds", "--sweep.health-interval", float, 5.0,
           "how often ECC, row remapping, NVLink and PCIe counters are read", 0.1, 600.0,
           metavar="SECONDS", commands=ALL),
    Option("straggler_persistence_seconds", "--straggler.persistence", float, 300.0,
           "how long a GPU must deviate from its peers to be a straggler", 0.0, 86400.0,
           metavar="SECONDS", commands=(RUN, SIMULATE)),
    Option("fake_costs", "--fake.costs", bool, True,
           "charge every fake NVML call the wall time and CPU a real H200 takes",
           commands=ALL, command_defaults={SIMULATE: False}),
    Option("log_level", "--log.level", str, "info", "log level", choices=LOG_LEVELS,
           metavar="LEVEL", commands=(RUN, SIMULATE)),
)

CORE: tuple[Option, ...] = (
    Option("listen_address", "--web.listen-address", str, f":{DEFAULT_PORT}",
           "address to serve on (host:port, [v6]:port)", metavar="ADDR",
           check=_listen_address_problem),
    Option("web_config_file", "--web.config.file", str, "",
           "TLS and basic auth, in the Prometheus exporter-toolkit web config format "
           "(unset: plain HTTP, no auth)", metavar="FILE"),
    Option("metrics_profile", "--metrics.profile", str, DEFAULT_PROFILE,
           "families served: minimal (the largest fleets), standard (what every shipped "
           "alert, recording rule and dashboard needs) or full (NVLink per link and every "
           "diagnostic); docs/metrics.md says which family is in which",
           choices=PROFILES, metavar="PROFILE", commands=(RUN, SIMULATE)),
    Option("metrics_file", "--metrics.file", str, "",
           "a selection over the profile: families included or excluded by name or glob, "
           "labels summed away (docs/metrics.md); reloaded on SIGHUP", metavar="FILE",
           commands=(RUN, SIMULATE)),
    Option("fake", "--fake", bool, False, "run on the built-in simulated node instead of "
           "real NVML", commands=(RUN, RECORD)),
    Option("scenario", "--scenario", str, "training", "fake scenario: a built-in name or a "
           "YAML file (docs/scenarios.md)", metavar="NAME|FILE", commands=(RUN, RECORD)),
    *SHARED,
    Option("stale_after_seconds", "--health.stale-after", float, 10.0,
           "/healthz and /readyz are 503 once the last snapshot is older than this; /readyz "
           "lists loops stale this long", 1.0, 3600.0,
           metavar="SECONDS"),
    Option("expected_gpus", "--gpus.expected", int, None, "GPUs this node should have "
           "(default: the count NVML reports at start)", 0, 1024, metavar="N",
           optional=True),
    Option("hang_timeout_seconds", "--nvml.hang-timeout", float, 2.0,
           "an NVML call this long marks its GPU hung; sampling goes on without it",
           0.2, 600.0, metavar="SECONDS"),
    Option("gpu_recovery_interval_seconds", None, float, 10.0,
           "how often a lost GPU is tried again", 0.1, 3600.0),
    Option("sources_interval_seconds", None, float, 5.0,
           "how often each collector (InfiniBand, host, jobs, ...) reads", 0.5, 600.0),
    Option("replay", "--replay", str, None, "serve a recorded trace (ours or an nvidia-smi "
           "CSV log) as if live, looping at its end", metavar="FILE", optional=True,
           check=_not_blank),
    Option("replay_speed", "--speed", float, 1.0, "replay speed; a speed that would deliver "
           "more than 640 power samples a second per GPU is refused (above 12.8 for a "
           "recording at the driver's ~50 a second)", 0.01, 1000.0,
           metavar="X"),
)


def unique(options: Iterable[Option]) -> list[Option]:
    """Options by key, first definition wins (a key is defined once)."""
    seen: dict[str, Option] = {}
    for option in options:
        seen.setdefault(option.key, option)
    return list(seen.values())


def add_flags(parser: argparse.ArgumentParser, command: str,
              options: Iterable[Option]) -> None:
    for option in options:
        if option.flag is not None and command in option.commands:
            option.add_to(parser, command)


def resolve(args: argparse.Namespace, command: str, options: Iterable[Option]) -> dict[str, Any]:
    """The values of a command's flags, defaults filled in and each one checked (a bad
    value raises ConfigError naming the flag); for commands without a config file."""
    from exporter.yamlfile import ConfigError

    values = {}
    for option in options:
        if option.flag is None or command not in option.commands:
            continue
        value = getattr(args, option.key, None)
        value = option.default_for(command) if value is None else value
        problem = option.problem(value)
        if problem:
            raise ConfigError(f"{option.flag}: {problem}")
        values[option.key] = value
    return values
