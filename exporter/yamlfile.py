"""YAML loading that remembers line numbers, so config errors can name file and line."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml


class ConfigError(ValueError):
    """A problem in a config or scenario file; str() is one line naming file, line and key."""


class LineDict(dict):
    """A mapping from YAML that knows the line of each key (1-based)."""

    lines: dict[str, int]
    start_line: int


class _LineLoader(yaml.SafeLoader):
    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> LineDict:
        mapping = LineDict(super().construct_mapping(node, deep=deep))
        mapping.lines = {}
        for key_node, _ in node.value:
            mapping.lines[str(key_node.value)] = key_node.start_mark.line + 1
        mapping.start_line = node.start_mark.line + 1
        return mapping


_LineLoader.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG,
    lambda loader, node: loader.construct_mapping(node, deep=True),
)


def load_yaml(text: str, source: str) -> Any:
    """Parse YAML text; syntax errors become ConfigError with the line."""
    try:
        return yaml.load(text, Loader=_LineLoader)  # noqa: S506 - SafeLoader subclass
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        line = f":{mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"{source}{line}: invalid YAML: {exc.problem}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: invalid YAML: {exc}") from None


def load_yaml_file(path: str | Path) -> Any:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not a UTF-8 text file") from None
    return load_yaml(text, str(path))


@dataclass(frozen=True)
class Where:
    """A place in a YAML document, for error messages."""

    source: str
    mapping: Any = None
    path: str = ""

    def child(self, key: str, mapping: Any = None) -> Where:
        return Where(self.source, mapping, f"{self.path}.{key}" if self.path else key)

    def error(self, key: str | None, message: str) -> ConfigError:
        line = None
        if isinstance(self.mapping, LineDict):
            line = self.mapping.lines.get(key, self.mapping.start_line) if key else (
                self.mapping.start_line)
        where = f"{self.source}:{line}" if line else self.source
        name = f"{self.path}.{key}" if key and self.path else (key or self.path)
        return ConfigError(f"{where}: {name}: {message}" if name else f"{where}: {message}")


def expect_mapping(value: Any, where: Where, allowed: set[str]) -> dict:
    """Check that value is a mapping whose keys are all in allowed."""
    if value is None:
        return LineDict()
    if not isinstance(value, dict):
        raise where.error(None, f"expected a mapping, got {type(value).__name__}")
    for key in value:
        if key not in allowed:
            hint = ", ".join(sorted(allowed))
            raise where.error(str(key), f"unknown key (known keys: {hint})")
    return value


def get_number(
    mapping: dict, key: str, where: Where, default: float, *, low: float, high: float,
    integer: bool = False,
) -> float:
    value = mapping.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise where.error(key, f"expected a number, got {value!r}")
    if integer and not float(value).is_integer():
        raise where.error(key, f"expected a whole number, got {value!r}")
    if not low <= value <= high:
        raise where.error(key, f"{value!r} is out of range [{low:g}, {high:g}]")
    return int(value) if integer else float(value)


def get_string(mapping: dict, key: str, where: Where, default: str | None) -> str | None:
    value = mapping.get(key, default)
    if value is not None and not isinstance(value, str):
        raise where.error(key, f"expected a string, got {value!r}")
    return value


def get_bool(mapping: dict, key: str, where: Where, default: bool) -> bool:
    value = mapping.get(key, default)
    if not isinstance(value, bool):
        raise where.error(key, f"expected true or false, got {value!r}")
    return value
