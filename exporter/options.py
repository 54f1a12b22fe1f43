"""How a setting is declared once: its config key, flag, type, default, range and help.

A setting is a field of a frozen settings dataclass, declared with `setting(...)`:

    drain_interval: float = setting(1.0, "how often ...", flag="--power.drain-interval",
                                    low=0.1, high=2.0)

Its type is the field's annotation; its config key is the field's name unless `key=`
says otherwise (keys are flat in the file: `straggler_persistence_seconds`, not
`sampler.stragglers.persistence_seconds`). A field declared with `section(Cls)` holds a
nested settings object whose settings are keys of their own. From these declarations
come the command lines (run, simulate, record, analyze), the config file's keys,
`check-config` and the flags table in docs/configuration.md; `build` and `flatten` turn
flat key/value mappings into settings objects and back.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import math
import types
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TypeVar, Union, get_args, get_origin, get_type_hints

from exporter.yamlfile import ConfigError, excerpt

DEFAULT_PORT = 9955  # free of node_exporter 9100, dcgm-exporter 9400, nvidia_gpu_exporter 9835
LOG_LEVELS = ("debug", "info", "warning", "error")
RUN, SIMULATE, RECORD, ANALYZE = "run", "simulate", "record", "analyze"
HEALTH = "health"  # asks a running exporter: its listen address and web config only
ALL = (RUN, SIMULATE, RECORD)  # the commands that sample GPUs

T = TypeVar("T")
_OPTION, _SECTION = "exporter.option", "exporter.section"


@dataclass(frozen=True)
class Option:
    """One setting. `flag` None: config file only; `in_file` False: flag only."""

    key: str
    flag: str | None
    kind: type  # bool, int, float or str (or tuple, with `parse`)
    default: object  # of the type `kind` (or None where `optional`)
    help: str
    low: float | None = None
    high: float | None = None
    choices: tuple[str, ...] = ()
    metavar: str | None = None
    optional: bool = False  # may be unset (None)
    commands: tuple[str, ...] = (RUN,)
    # per-command defaults where a command needs another (simulate runs many nodes)
    command_defaults: Mapping[str, object] = field(default_factory=dict)
    # per-command flags where a command has its own name for the setting (analyze's)
    command_flags: Mapping[str, str] = field(default_factory=dict)
    # extra validation of a text setting (a path, a regex): an error or None
    check: Callable[[str], str | None] | None = None
    in_file: bool = True  # settable in the config file
    # analyze only: the flag's parser (argparse type; it raises ArgumentTypeError) where
    # there is no range to derive it from (Option.parser)
    parse: Callable[[str], object] | None = None
    path: tuple[str, ...] = ()  # attribute path from the settings root (set by options_of)

    def default_for(self, command: str) -> object:
        return self.command_defaults.get(command, self.default)

    def flag_for(self, command: str) -> str | None:
        return self.command_flags.get(command, self.flag)

    def dest_for(self, command: str) -> str:
        """The argparse attribute: the config key, or for analyze (which has no config
        file) the flag's own name (`--min-synchrony` -> `min_synchrony`)."""
        flag = self.flag_for(command)
        if command == ANALYZE and flag is not None:
            return flag.lstrip("-").replace("-", "_").replace(".", "_")
        return self.key

    def parser(self) -> Callable[[str], object]:
        """analyze's flag parser (argparse type): `parse`, or one derived from the
        declared range, so a range is declared once (as `low` and `high`)."""
        if self.parse is not None:
            return self.parse
        if self.kind not in (int, float) or self.low is None or self.high is None:
            return self.kind
        return functools.partial(_in_range, self.kind, self.low, self.high)

    def problem(self, value: object) -> str | None:
        """What is wrong with a value of this option, or None (values quoted short)."""
        if value is None:
            return None if self.optional or self.default is None else "must be set"
        if self.kind is bool:
            if isinstance(value, str) and value.lower() in ("true", "false", "yes", "no"):
                return (f"expected true or false, got {excerpt(value)}, a quoted string: "
                        f"write {value.lower()} without quotes")
            return None if isinstance(value, bool) else (
                f"expected true or false, got {excerpt(value)}")
        if self.kind in (int, float):
            if isinstance(value, bool) or not isinstance(value, int | float):
                return f"expected a number, got {excerpt(value)}"
            if self.kind is int and not float(value).is_integer():
                return f"expected a whole number, got {excerpt(value)}"
            if self.low is not None and self.high is not None and not (
                    self.low <= value <= self.high):
                return f"{excerpt(value)} is out of range [{self.low:g}, {self.high:g}]"
        elif self.kind is str and not isinstance(value, str):
            return f"expected a string, got {excerpt(value)}"
        if self.choices and value not in self.choices:
            return f"expected one of {', '.join(self.choices)}"
        if self.check is not None and isinstance(value, str):
            return self.check(value)
        return None

    def add_to(self, parser: argparse.ArgumentParser, command: str) -> None:
        """The flag on a subcommand's parser. Its value is None when not given (the
        config file or the default fills it in), except for analyze, whose parser holds
        the default and checks the value itself (`parse`)."""
        flag = self.flag_for(command)
        assert flag is not None
        text = self.help
        default = self.default_for(command)
        if command == ANALYZE:
            shown = "-".join(f"{v:g}" for v in default) if isinstance(default, tuple) else (
                f"{default:g}" if isinstance(default, float) else default)
            parser.add_argument(flag, dest=self.dest_for(command), type=self.parser(),
                                default=default, metavar=self.metavar,
                                help=f"{text} (default: {shown})")
            return
        if self.kind is bool:
            if default is not None:
                text += f" (default {'on' if default else 'off'})"
            parser.add_argument(flag, dest=self.key, default=None,
                                action=argparse.BooleanOptionalAction, help=text)
            return
        if default not in (None, ""):
            text += f" (default {default:g})" if isinstance(default, float) else (
                f" (default {default})")
        parser.add_argument(flag, dest=self.key, type=self.kind, default=None,
                            metavar=self.metavar or self.kind.__name__.upper(),
                            choices=self.choices or None, help=text)


# -- declaring settings -------------------------------------------------------------------


def setting(default: T, help: str, *, flag: str | None = None, key: str | None = None,
            low: float | None = None, high: float | None = None,
            choices: tuple[str, ...] = (), metavar: str | None = None,
            optional: bool = False, commands: tuple[str, ...] = (RUN,),
            command_defaults: Mapping[str, object] | None = None,
            command_flags: Mapping[str, str] | None = None,
            check: Callable[[str], str | None] | None = None, in_file: bool = True,
            parse: Callable[[str], object] | None = None) -> T:
    """A settings dataclass field, declared once (see the module's docstring)."""
    option = Option(key or "", flag, object, default, help, low, high, choices, metavar,
                    optional, commands, dict(command_defaults or {}),
                    dict(command_flags or {}), check, in_file, parse)
    result: T = field(default=default, metadata={_OPTION: option})
    return result


def analyze_setting(default: T, help: str, flag: str, parse: Callable[[str], object],
                    metavar: str, *, key: str | None = None) -> T:
    """A threshold the live analysis keeps at its default and `analyze` takes as a flag
    (it is no config key; `key` only keeps it apart from another of the same name)."""
    return setting(default, help, flag=flag, key=key, parse=parse, metavar=metavar,
                   commands=(ANALYZE,), in_file=False)


def section(cls: Callable[[], T]) -> T:
    """A field holding a nested settings object (its defaults unless given)."""
    result: T = field(default_factory=cls, metadata={_SECTION: cls})
    return result


def _kind(hint: object) -> type:
    """float from `float`, `float | None`; the first non-None member of a union."""
    if get_origin(hint) in (Union, types.UnionType):
        hint = next(a for a in get_args(hint) if a is not type(None))
    origin = get_origin(hint)
    if isinstance(origin, type):
        return origin
    assert isinstance(hint, type), hint
    return hint


_DECLARED: dict[type, tuple[Option, ...]] = {}


def options_of(cls: type) -> tuple[Option, ...]:
    """Every setting a settings class declares, nested sections included, in order."""
    found = _DECLARED.get(cls)
    if found is None:
        found = _DECLARED[cls] = tuple(_walk(cls, ()))
    return found


def _walk(cls: type, path: tuple[str, ...]) -> Iterable[Option]:
    hints = get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if _SECTION in f.metadata:
            yield from _walk(f.metadata[_SECTION], (*path, f.name))
        elif _OPTION in f.metadata:
            option: Option = f.metadata[_OPTION]
            yield dataclasses.replace(option, key=option.key or f.name,
                                      kind=_kind(hints[f.name]), path=(*path, f.name))


def build(cls: Callable[..., T], values: Mapping[str, object]) -> T:
    """A settings object from flat config keys (others are left at their defaults);
    raises TypeError naming a key that no setting of `cls` has."""
    assert isinstance(cls, type)
    known = {o.key for o in options_of(cls)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise TypeError(f"unknown setting {unknown[0]!r}")
    return _build(cls, values)


def _build(cls: Callable[..., T], values: Mapping[str, object]) -> T:
    assert isinstance(cls, type)
    kwargs: dict[str, object] = {}
    for f in dataclasses.fields(cls):
        if _SECTION in f.metadata:
            kwargs[f.name] = _build(f.metadata[_SECTION], values)
        elif _OPTION in f.metadata:
            key = f.metadata[_OPTION].key or f.name
            if key in values:
                kwargs[f.name] = values[key]
    return cls(**kwargs)


def value_of(settings: object, option: Option) -> object:
    """The option's value in a settings object (walking its path)."""
    for name in option.path:
        if settings is None:  # a section left out (record runs no analyses)
            return None
        settings = getattr(settings, name)
    return settings


def flatten(settings: object) -> dict[str, object]:
    """Config key -> value, every setting of a settings object."""
    return {o.key: value_of(settings, o) for o in options_of(type(settings))}


# -- flags ---------------------------------------------------------------------------


def unique(options: Iterable[Option]) -> list[Option]:
    """Options by key, first definition wins (a key is defined once)."""
    seen: dict[str, Option] = {}
    for option in options:
        seen.setdefault(option.key, option)
    return list(seen.values())


def add_flags(parser: argparse.ArgumentParser, command: str,
              options: Iterable[Option]) -> None:
    for option in options:
        if option.flag_for(command) is not None and command in option.commands:
            option.add_to(parser, command)


def resolve(args: argparse.Namespace, command: str,
            options: Iterable[Option]) -> dict[str, object]:
    """The values of a command's flags, defaults filled in and each one checked (a bad
    value raises ConfigError naming the flag); for commands without a config file."""
    values = {}
    for option in options:
        if option.flag_for(command) is None or command not in option.commands:
            continue
        value = getattr(args, option.dest_for(command), None)
        value = option.default_for(command) if value is None else value
        problem = option.problem(value)
        if problem:
            raise ConfigError(f"{option.flag_for(command)}: {problem}")
        values[option.key] = value
    return values


def inputs_of(cls: Callable[..., T], args: argparse.Namespace, **given: object) -> T:
    """A command's own inputs (no settings: a path, a duration, an output format) as one
    typed object, a frozen dataclass whose fields are named for the flags' dests; the
    fields in `given` are passed as they are, the others read from `args` (those it
    lacks keep their defaults)."""
    assert isinstance(cls, type)
    values = {f.name: getattr(args, f.name) for f in dataclasses.fields(cls)
              if f.name not in given and hasattr(args, f.name)}
    return cls(**values, **given)


# -- values that more than one command parses ---------------------------------------------


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


def listen_address_problem(text: str) -> str | None:
    try:
        parse_listen_address(text)
    except ConfigError as exc:
        return str(exc)
    return None


def not_blank(text: str) -> str | None:
    return None if text.strip() else "expected a path"


def finite(text: str) -> float:
    """A flag's finite number (argparse type): nan and inf are refused."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not math.isfinite(v):
        raise argparse.ArgumentTypeError(f"must be a finite number: {text!r}")
    return v


def positive(text: str) -> float:
    """A flag's number > 0 (argparse type)."""
    if (v := finite(text)) <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive number: {text!r}")
    return v


def non_negative(text: str) -> float:
    """A flag's number >= 0 (argparse type)."""
    if (v := finite(text)) < 0:
        raise argparse.ArgumentTypeError(f"must be zero or a positive number: {text!r}")
    return v


def ratio(text: str) -> float:
    """A flag's ratio in [0, 1] (argparse type)."""
    if not 0 <= (v := finite(text)) <= 1:
        raise argparse.ArgumentTypeError(f"must be a ratio between 0 and 1: {text!r}")
    return v


def _in_range(kind: type, low: float, high: float, text: str) -> float:
    """A flag's number in [low, high] (the argparse type of a declared range)."""
    try:
        v = int(text) if kind is int else finite(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if not low <= v <= high:
        raise argparse.ArgumentTypeError(
            f"must be a ratio between 0 and 1: {text!r}" if (low, high) == (0, 1) else
            f"must be between {low:g} and {high:g}: {text!r}")
    return v


def whole_at_least_one(text: str) -> int:
    """A flag's whole number >= 1 (argparse type)."""
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1: {text!r}")
    return v


def band(text: str) -> tuple[float, float]:
    """A flag's frequency band, LOW-HIGH in Hz (argparse type)."""
    try:
        lo_s, hi_s = text.split("-", 1) if "-" in text else text.split(",", 1)
        lo, hi = float(lo_s), float(hi_s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"band must read LOW-HIGH in Hz: {text!r}") from None
    if not (0 <= lo < hi):
        raise argparse.ArgumentTypeError(f"band must have 0 <= LOW < HIGH: {text!r}")
    return lo, hi
