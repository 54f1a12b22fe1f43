"""JSON arrays of fixed-point numbers, formatted by numpy rather than by json.dumps.

/api/v1/power sends ~27,000 numbers a second to each open live page (60 s of 8 GPUs and
the node at 50 samples a second, times and watts). json.dumps formats floats one by
one with the shortest-repr algorithm: ~0.3-1 us each, 10-30 ms of CPU a second per
page, several times what the exporter's whole sampling costs. Rounded to a fixed number
of decimals, a number is a row of digits: numpy writes all rows at once as a byte matrix
(right-aligned, padded with spaces, which JSON allows between tokens), 5-8x faster.
"""

from __future__ import annotations

import json

import numpy as np

# Scaled values stay below this on the fast path (ms timestamps are ~1.8e12): floats hold
# them exactly and floor(x / 1e4) cannot round up to the next integer. Larger values, and
# negative ones, take the slow path (never times or watts).
_FAST_BELOW = 1e15
# The four ASCII digits of 0..9999, one uint32 each: numbers are cut into 4-digit chunks
# (float division, which numpy vectorises; int64 division it does not) and looked up in
# this 1-d table (~8x faster than taking rows of a (10000, 4) one).
_CHUNKS = np.frombuffer("".join(f"{i:04d}" for i in range(10000)).encode(), np.uint32)


def json_array(values: np.ndarray, decimals: int) -> bytes:
    """`values` as a JSON array, each rounded to `decimals` places; NaN and infinities
    become null. Same numbers as json.dumps(np.round(values, decimals).tolist())."""
    v = np.asarray(values, dtype=np.float64).ravel()
    if v.size == 0:
        return b"[]"
    finite = np.isfinite(v)
    scaled = np.round(np.where(finite, v, 0.0) * 10.0 ** decimals)
    if scaled.min() < 0 or scaled.max() >= _FAST_BELOW:
        return _slow(v, finite, decimals)
    int_digits = max(len(str(int(scaled.max()) // 10 ** decimals)), 1)
    if not finite.all():
        int_digits = max(int_digits, 4 - (decimals + 1 if decimals else 0))  # room for null
    digits = int_digits + decimals
    matrix = _digits(scaled, digits)
    # leading zeros of the integer part become spaces (the units digit stays); none when
    # every number has as many digits as the widest (timestamps, most watts)
    head = matrix[:, :int_digits]  # a view: writing it writes the matrix
    if int_digits > 1 and scaled.min() < 10.0 ** (digits - 1):
        nonzero = head != ord("0")
        nonzero[:, -1] = True
        lead = np.argmax(nonzero, axis=1)
        head[np.arange(int_digits)[None, :] < lead[:, None]] = ord(" ")
    # each row: the integer digits, "." and the decimals when there are any, ","
    width = int_digits + (decimals + 1 if decimals else 0) + 1
    rows = np.empty((v.size, width), np.uint8)
    rows[:, :int_digits] = head
    if decimals:
        rows[:, int_digits] = ord(".")
        rows[:, int_digits + 1:-1] = matrix[:, int_digits:]
    rows[:, -1] = ord(",")
    if not finite.all():
        width = rows.shape[1] - 1
        rows[~finite, :width] = np.frombuffer(b"null".rjust(width), np.uint8)
    return b"[" + rows.tobytes()[:-1] + b"]"


def _digits(whole: np.ndarray, digits: int) -> np.ndarray:
    """(n, digits) ASCII digits of whole numbers (floats, 0 <= x < min(10**digits,
    _FAST_BELOW)), zero-padded."""
    chunks = -(-digits // 4)
    parts = np.empty((whole.size, chunks), np.intp)
    rest = whole
    for j in range(chunks - 1, 0, -1):
        high = np.floor(rest / 1e4)
        parts[:, j] = rest - high * 1e4
        rest = high
    parts[:, 0] = rest
    text = _CHUNKS[parts].view(np.uint8).reshape(whole.size, 4 * chunks)
    return text[:, 4 * chunks - digits:]


def _slow(v: np.ndarray, finite: np.ndarray, decimals: int) -> bytes:
    rounded = np.round(v, decimals).tolist()
    out = [x if ok else None for x, ok in zip(rounded, finite.tolist(), strict=True)]
    return json.dumps(out, separators=(",", ":")).encode()
