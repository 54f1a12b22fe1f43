"""YAML loading that remembers line numbers, so config errors can name file and line.

Config, web config and scenario files are small and written by people, so what a file
can make us do is bounded (unbounded, a 470-byte alias bomb ran check-config for 34 s
into a MemoryError, and `--config /dev/zero` read without end):

- at most :data:`MAX_FILE_BYTES` are read;
- YAML aliases (``*name``) are refused: nothing here needs them, and each one can
  multiply what the rest of the code walks and prints;
- nesting is at most :data:`MAX_DEPTH` deep (deeper made PyYAML overflow the stack);
- a key written twice in one mapping is refused (YAML requires unique keys; PyYAML would
  keep the last one without a word);
- a :class:`ConfigError` is one line of at most :data:`MAX_MESSAGE_CHARS`, and values are
  quoted through :func:`excerpt`, so no message prints a huge value.
"""

from __future__ import annotations

import re
import reprlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, overload

import yaml

from exporter.regularfile import read_regular

MAX_FILE_BYTES = 256 << 10  # a config is a few KiB; parsing 256 KiB takes ~4 s at worst
MAX_DEPTH = 64
MAX_MESSAGE_CHARS = 400
MAX_EXCERPT_CHARS = 80

_repr = reprlib.Repr()
_repr.maxlevel, _repr.maxstring, _repr.maxother = 3, MAX_EXCERPT_CHARS, MAX_EXCERPT_CHARS
_repr.maxlist = _repr.maxdict = _repr.maxtuple = _repr.maxset = 6


def excerpt(value: Any) -> str:
    """repr() of a value, cut short: bounded in work and length whatever the value."""
    text = _repr.repr(value)
    return text if len(text) <= MAX_EXCERPT_CHARS else text[:MAX_EXCERPT_CHARS - 3] + "..."


class ConfigError(ValueError):
    """A problem in a config or scenario file; str() is one line naming file, line and key,
    of at most MAX_MESSAGE_CHARS."""

    def __init__(self, message: str) -> None:
        line = " ".join(str(message).split())
        if len(line) > MAX_MESSAGE_CHARS:
            line = line[:MAX_MESSAGE_CHARS - 3] + "..."
        super().__init__(line)


class LineDict(dict):
    """A mapping from YAML that knows the line of each key (1-based)."""

    lines: dict[str, int]
    start_line: int


class _LineLoader(yaml.SafeLoader):
    _depth = 0

    def compose_node(self, parent, index):  # noqa: ANN001 - PyYAML's signature
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.composer.ComposerError(
                None, None, f"aliases (*{excerpt(event.anchor)[1:-1]}) are not supported",
                event.start_mark)
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise yaml.composer.ComposerError(
                    None, None, f"nested more than {MAX_DEPTH} levels deep",
                    self.peek_event().start_mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> LineDict:
        _refuse_duplicate_keys(node)
        mapping = LineDict(super().construct_mapping(node, deep=deep))
        mapping.lines = {}
        for key_node, _ in node.value:
            mapping.lines[str(key_node.value)] = key_node.start_mark.line + 1
        mapping.start_line = node.start_mark.line + 1
        return mapping


def _refuse_duplicate_keys(node: yaml.MappingNode) -> None:
    """YAML requires unique keys; PyYAML keeps the last silently, so a second `listen_address`
    would override the first unseen. Keys are compared as written, with their resolved tag."""
    first: dict[tuple[str, str], int] = {}
    for key_node, _ in node.value:
        if not isinstance(key_node, yaml.ScalarNode):
            continue
        key = (key_node.tag, key_node.value)
        line = key_node.start_mark.line + 1
        if key in first:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {excerpt(key_node.value)} (first on line "
                f"{first[key]})", key_node.start_mark)
        first[key] = line



def _mapping(loader: _LineLoader, node: yaml.Node) -> LineDict:
    assert isinstance(node, yaml.MappingNode)  # registered for the mapping tag only
    return loader.construct_mapping(node, deep=True)


def kind_name(value: Any) -> str:
    """A YAML value's kind as a user wrote it: list, str, int (never LineList/LineDict)."""
    return "list" if isinstance(value, list) else (
        "mapping" if isinstance(value, dict) else type(value).__name__)


class LineList(list):
    """A sequence from YAML that knows the line of each item (1-based)."""

    lines: list[int]


def _sequence(loader: _LineLoader, node: yaml.Node) -> LineList:
    assert isinstance(node, yaml.SequenceNode)  # registered for the sequence tag only
    items = LineList(loader.construct_sequence(node, deep=True))
    items.lines = [item.start_mark.line + 1 for item in node.value]
    return items


_LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping)
_LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_SEQUENCE_TAG, _sequence)
# YAML 1.1 (PyYAML) reads 1.0e9 and 1e9 as strings: its floats need a dot and a signed
# exponent. YAML 1.2 reads both as numbers, as a user writing a rate or a size expects.
_LineLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
    list("-+0123456789."))


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
        raw = read_regular(path, MAX_FILE_BYTES)  # a FIFO or device is refused, not waited on
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if len(raw) > MAX_FILE_BYTES:
        raise ConfigError(f"{path}: larger than {MAX_FILE_BYTES >> 10} KiB; not a config file")
    try:
        text = raw.decode("utf-8")
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

    def error(self, key: str | None, message: str, item: int | None = None) -> ConfigError:
        """The error at `key`'s line, or at its `item`th list item's (0-based)."""
        line = None
        if isinstance(self.mapping, LineDict):
            line = self.mapping.lines.get(key, self.mapping.start_line) if key else (
                self.mapping.start_line)
            items = self.mapping.get(key) if key else None
            if item is not None and isinstance(items, LineList) and item < len(items.lines):
                line = items.lines[item]
        where = f"{self.source}:{line}" if line else self.source
        name = f"{self.path}.{key}" if key and self.path else (key or self.path)
        return ConfigError(f"{where}: {name}: {message}" if name else f"{where}: {message}")


def unknown_key(key: str, allowed: Iterable[str],
                aliases: Mapping[str, str] | None = None) -> str:
    """The message for an unknown key: the likely one first ("did you mean X?"), since
    the list of known keys may be cut short. `aliases` maps other spellings of a key (a
    command-line flag written in a file) to it."""
    import difflib  # only for an unknown key

    known = sorted(allowed)
    if aliases and key.lstrip("-") in aliases:
        return f"unknown key (did you mean {aliases[key.lstrip('-')]}?)"
    close = difflib.get_close_matches(key.lower(), known, n=1, cutoff=0.6)
    if not close and aliases:
        near = difflib.get_close_matches(key.lstrip("-"), list(aliases), n=1, cutoff=0.6)
        close = [aliases[near[0]]] if near else []
    if close:
        return f"unknown key (did you mean {close[0]}?)"
    return f"unknown key (known keys: {', '.join(known)})"


def expect_mapping(value: Any, where: Where, allowed: set[str],
                   aliases: Mapping[str, str] | None = None) -> dict:
    """Check that value is a mapping whose keys are all in allowed."""
    if value is None:
        return LineDict()
    if not isinstance(value, dict):
        raise where.error(None, f"expected a mapping, got {kind_name(value)}")
    for key in value:
        if key not in allowed:
            raise where.error(str(key), unknown_key(str(key), allowed, aliases))
    return value


def get_number(
    mapping: dict, key: str, where: Where, default: float, *, low: float, high: float,
    integer: bool = False,
) -> float:
    value = mapping.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise where.error(key, f"expected a number, got {excerpt(value)}")
    if integer and not float(value).is_integer():
        raise where.error(key, f"expected a whole number, got {excerpt(value)}")
    if not low <= value <= high:
        raise where.error(key, f"{excerpt(value)} is out of range [{low:g}, {high:g}]")
    return int(value) if integer else float(value)


def get_int(mapping: dict, key: str, where: Where, default: int, *, low: float,
            high: float) -> int:
    """A whole number (get_number with integer=True, typed as one)."""
    return int(get_number(mapping, key, where, default, low=low, high=high, integer=True))


@overload
def get_string(mapping: dict, key: str, where: Where, default: str) -> str: ...


@overload
def get_string(mapping: dict, key: str, where: Where, default: str | None) -> str | None: ...


def get_string(mapping: dict, key: str, where: Where, default: str | None) -> str | None:
    value = mapping.get(key, default)
    if value is not None and not isinstance(value, str):
        raise where.error(key, f"expected a string, got {excerpt(value)}")
    return value


def get_bool(mapping: dict, key: str, where: Where, default: bool) -> bool:
    value = mapping.get(key, default)
    if not isinstance(value, bool):
        raise where.error(key, f"expected true or false, got {excerpt(value)}")
    return value
