"""Where a rule may run: node-local (every input series from one scrape target) or global.

Just enough PromQL reading for our rules: aggregations and the labels they keep, vector
matching (`on`/`ignoring`), cross-series functions, and the series other rules record. A
rule is node-local when every aggregation and every vector match keeps the node identity
(`instance`), so it computes the same on a scrape shard as in the global store, and it
reads no series a global rule records.
"""

from __future__ import annotations

import re

NODE = "instance"
AGGREGATIONS = ("sum", "avg", "min", "max", "count", "group", "stddev", "stdvar", "quantile",
                "count_values", "topk", "bottomk", "limitk")
# Functions whose result mixes every series of their argument into one.
CROSS_SERIES_FUNCTIONS = ("scalar", "absent", "absent_over_time", "sort", "sort_desc")

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'')
_COMMENT = re.compile(r"#[^\n]*")
_NAME = r"(?<![\w:])"
_AGG = re.compile(_NAME + r"(" + "|".join(AGGREGATIONS) + r")\s*"
                  r"(?:(by|without)\s*\(([^()]*)\)\s*)?\(")
_MODIFIER_AFTER = re.compile(r"\s*(by|without)\s*\(([^()]*)\)")
_MATCHING = re.compile(_NAME + r"(on|ignoring)\s*\(([^()]*)\)")
_FUNCTION = re.compile(_NAME + r"(" + "|".join(CROSS_SERIES_FUNCTIONS) + r")\s*\(")
_IDENTIFIER = re.compile(_NAME + r"([a-zA-Z_:][\w:]*)(?![\w:])")


def _clean(expr: str) -> str:
    """The expression without string literals and comments (blanked, offsets kept)."""
    expr = _STRING.sub(lambda m: '"' + " " * (len(m.group(0)) - 2) + '"', expr)
    expr = _COMMENT.sub(lambda m: " " * len(m.group(0)), expr)
    depth = 0
    for char in expr:
        depth += {"(": 1, ")": -1}.get(char, 0)
        if depth < 0:
            raise ValueError(f"unbalanced ')' in {expr!r}")
    if depth:
        raise ValueError(f"unbalanced '(' in {expr!r}")
    return expr


def _closing(expr: str, start: int) -> int:
    """Index of the ')' matching the '(' at start."""
    depth = 0
    for i in range(start, len(expr)):
        depth += {"(": 1, ")": -1}.get(expr[i], 0)
        if depth == 0:
            return i
    raise ValueError(f"unbalanced '(' in {expr!r}")


def _labels(text: str) -> set[str]:
    return {x.strip() for x in text.split(",") if x.strip()}


def _keeps_node(modifier: str | None, labels: str | None) -> bool:
    if modifier == "by":
        return NODE in _labels(labels or "")
    if modifier == "without":
        return NODE not in _labels(labels or "")
    return False  # no modifier: every label is dropped


def cross_node_reasons(expr: str, global_series: set[str] = frozenset()) -> list[str]:
    """Why expr needs series from more than one node; [] when it is node-local."""
    text = _clean(expr)
    reasons = []
    for m in _AGG.finditer(text):
        modifier, labels = m.group(2), m.group(3)
        if modifier is None:
            after = _MODIFIER_AFTER.match(text, _closing(text, m.end() - 1) + 1)
            if after:
                modifier, labels = after.group(1), after.group(2)
        if not _keeps_node(modifier, labels):
            kept = f"{modifier} ({labels.strip()})" if modifier else "every label dropped"
            reasons.append(f"{m.group(1)} {kept} drops {NODE}")
    for m in _MATCHING.finditer(text):
        labels = _labels(m.group(2))
        if (m.group(1) == "on") != (NODE in labels):
            reasons.append(f"{m.group(1)} ({m.group(2).strip()}) matches across nodes")
    for m in _FUNCTION.finditer(text):
        reasons.append(f"{m.group(1)}() mixes every series")
    for name in sorted({m.group(1) for m in _IDENTIFIER.finditer(text)} & set(global_series)):
        reasons.append(f"reads {name}, recorded by a global rule")
    return reasons


_LABEL_LISTS = re.compile(_NAME + r"(by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)"
                          r"|\{[^{}]*\}")
_KEYWORDS = {"and", "or", "unless", "bool", "offset", "inf", "nan"}


def selects_series(expr: str) -> bool:
    """Whether expr reads any series at all (`vector(1)` and `time()` do not)."""
    text = _LABEL_LISTS.sub(" ", _clean(expr))
    return any(m.group(1) not in _KEYWORDS and not text[m.end():].lstrip().startswith("(")
               for m in _IDENTIFIER.finditer(text))
