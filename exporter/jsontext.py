"""JSON from outside (an event file, a trace, an exporter's answer), read as `json.loads`
reads it, but bad input however it is bad: a document nested thousands deep (`[` x
5,000) raises `json.JSONDecodeError` naming where, like any other malformed JSON, instead
of the RecursionError the standard library's recursive decoder raises. The one place
every command that reads JSON it did not write goes through."""

from __future__ import annotations

import json
import re
from typing import Any

# Where the error points: the first bracket past this depth. The decoder itself gives up
# deeper (at Python's recursion limit, about 1,000 less the caller's frames), so a
# document it refuses is always nested deeper than this.
SAID_DEPTH = 500
# a JSON string (escapes and all), or one bracket: what the depth scan looks at
_TOKENS = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]', re.S)


def loads(data: str | bytes) -> Any:
    """json.loads(data); json.JSONDecodeError for every document it cannot read, a too
    deeply nested one included (its message says so, its position where)."""
    text = data.decode(json.detect_encoding(data), "surrogatepass") \
        if isinstance(data, bytes | bytearray) else data
    try:
        return json.loads(text)
    except RecursionError:
        pass  # out of the decoder's frames: the stack is back to ours
    at = _too_deep_at(text)
    if at is None:  # refused shallower than SAID_DEPTH: a caller deep in its own frames
        raise json.JSONDecodeError("nested too deeply to read", text, 0) from None
    raise json.JSONDecodeError(f"nested more than {SAID_DEPTH} levels deep", text,
                               at) from None


def _too_deep_at(text: str) -> int | None:
    """The index of the first bracket that opens level SAID_DEPTH + 1, if one does."""
    depth = 0
    for token in _TOKENS.finditer(text):
        first = token.group()[0]
        if first in "[{":
            depth += 1
            if depth > SAID_DEPTH:
                return token.start()
        elif first in "]}":
            depth -= 1
    return None
