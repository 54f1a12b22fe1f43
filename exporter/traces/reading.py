"""Reading a trace file a block at a time, and gathering its rows into per-GPU arrays.

Memory stays bounded by what is kept, not by the file: the text is read and decoded a
block of lines at a time (:class:`TextLines`), and the parsed rows of a block become
numpy arrays per GPU at the block's end (:class:`Rows`), so no list of the file's lines
and no Python object per row outlives its block. A reader may keep only some fields
(``analyze`` keeps those its analyses read); skipped lines are counted in full, their
first :data:`KEEP_SKIPPED` kept with their reasons.
"""

from __future__ import annotations

import codecs
import ctypes
import gzip
import io
import re
import zlib
from collections import Counter
from collections.abc import Callable, Collection, Iterator
from typing import BinaryIO

import numpy as np

from exporter.regularfile import open_regular
from exporter.traces.checks import time_bounds
from exporter.traces.trace import (
    GpuSeries,
    PackedFields,
    Trace,
    TraceError,
    constant_view,
    unpack,
)

GZIP_MAGIC = b"\x1f\x8b"
MAX_GUNZIPPED_BYTES = 2 << 30  # ~30 hours of 8 GPUs at the driver's rate; a bomb stops here
# compressed formats read only once decompressed (magic bytes -> name)
_COMPRESSED = ((b"BZh", "bzip2"), (b"\xfd7zXZ\x00", "xz"), (b"\x28\xb5\x2f\xfd", "zstd"),
               (b"\x04\x22\x4d\x18", "lz4"), (b"PK\x03\x04", "zip"))
_BOMS_UTF16 = (b"\xff\xfe", b"\xfe\xff")  # nvidia-smi > file in Windows PowerShell writes UTF-16
_CONTROL = bytes(c for c in range(32) if chr(c) not in "\t\n\r\f\v") + b"\x7f"
_SNIFF_BYTES = 1 << 16
_BREAKS = "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"  # where str.splitlines() breaks
BLOCK_BYTES = 1 << 20  # text decoded and split at a time: ~9,000 rows of nvidia-smi CSV
BLOCK_ROWS = 1 << 14  # rows parsed into Python lists before they become arrays
MAX_LINES = (1 << 32) - 1  # line numbers are kept as uint32

# Lines skipped before the first usable row after which a file is refused. A real trace
# has a usable row in its first poll (one line per GPU, a header repeated by a shell
# loop at most every few lines); 10,000 lines (~1 MB) without one is a file of another
# kind, or a log whose every line is damaged, and saying so at once beats parsing
# every line of it (a few MB of junk took minutes) to say the same.
JUNK_LINES = 10_000
KEEP_SKIPPED = 1000  # skipped lines kept with their line number and reason
MAX_REASONS = 1000  # distinct wordings of skip reasons kept; more are counted by kind
_NUMBER = re.compile(r"\d+(?:\.\d+)?")
_QUOTED = re.compile(r"'[^']*'|\"[^\"]*\"")

Progress = Callable[[int, int], None]  # (bytes of the file read, its size)


def reason_kind(why: str) -> str:
    """A skip reason with its numbers and quoted cells as placeholders: "3 cells, column
    line has 5" and "4 cells, column line has 5" are one kind."""
    return _NUMBER.sub("N", _QUOTED.sub("Q", why))


# --------------------------------------------------------------------------- text


class TextLines:
    """The lines of a trace file, plain text or gzip (sniffed by their magic bytes, not
    by the name), a block at a time; other compressed or binary data is refused in one
    line that quotes none of it. ``progress`` hears how far the file has been read."""

    def __init__(self, path: str, progress: Progress | None = None,
                 block_bytes: int = BLOCK_BYTES) -> None:
        self.path = path
        self.progress = progress
        self.block_bytes = block_bytes
        try:
            self._raw = open_regular(path)  # a FIFO or device is refused, not waited on
            self.size = max(1, self._raw.seek(0, io.SEEK_END))
            self._raw.seek(0)
            magic = self._raw.read(2)
            self._raw.seek(0)
        except OSError as exc:
            raise TraceError(f"{path}: cannot read: {exc.strerror or exc}") from None
        self._gzip = magic == GZIP_MAGIC
        self._data: BinaryIO | gzip.GzipFile = (gzip.GzipFile(fileobj=self._raw) if self._gzip
                                                else self._raw)
        self._read = 0

    def close(self) -> None:
        self._data.close()
        self._raw.close()

    def _bytes(self, n: int) -> bytes:
        try:
            chunk = self._data.read(n)
        except EOFError:
            raise TraceError(f"{self.path}: gzip data cut short (an incomplete copy?): cannot "
                             "read it to its end") from None
        except (OSError, zlib.error) as exc:  # gzip.BadGzipFile is an OSError
            if not self._gzip:
                raise TraceError(f"{self.path}: cannot read: {exc}") from None
            raise TraceError(f"{self.path}: damaged gzip data: cannot decompress it") from None
        self._read += len(chunk)
        if self._gzip and self._read > MAX_GUNZIPPED_BYTES:
            raise TraceError(f"{self.path}: more than {MAX_GUNZIPPED_BYTES >> 30} GiB once "
                             "decompressed: cut the trace")
        if self.progress is not None:
            self.progress(self._raw.tell(), self.size)
        return chunk

    def _decoder(self, head: bytes) -> codecs.IncrementalDecoder:
        if head.startswith(_BOMS_UTF16):
            return codecs.getincrementaldecoder("utf-16")(errors="replace")
        packed = next((name for magic, name in _COMPRESSED if head.startswith(magic)), None)
        if packed:
            raise TraceError(f"{self.path}: {packed}-compressed: decompress it first (gzip is "
                             "read as it is)")
        if _binary(head):
            raise TraceError(f"{self.path}: binary data, not a trace: expected a cte trace or "
                             "an nvidia-smi CSV log, as text or gzip-compressed")
        return codecs.getincrementaldecoder("utf-8-sig")(errors="replace")

    def lines(self) -> Iterator[tuple[int, str]]:
        """(line number from 1, text) of every line, as ``str.splitlines()`` of the whole
        text would number them."""
        ln = 0
        for block in self.blocks():
            if ln + len(block) > MAX_LINES:
                raise TraceError(f"{self.path}: more than {MAX_LINES:,} lines: cut the trace")
            for raw in block:
                ln += 1
                yield ln, raw

    def blocks(self) -> Iterator[list[str]]:
        """Lists of lines as ``str.splitlines()`` of the whole text would give them."""
        head = self._bytes(_SNIFF_BYTES)
        decoder = self._decoder(head)
        rest = ""
        for raw in self._pieces(head):
            text = rest + decoder.decode(raw)
            lines = text.splitlines(keepends=True)
            # the last line may go on in the next block (a "\r" may be half of "\r\n")
            rest = lines[-1] if lines and (lines[-1][-1] not in _BREAKS
                                           or lines[-1][-1] == "\r") else ""
            whole = text[:len(text) - len(rest)]
            if whole:
                yield whole.splitlines()
        text = rest + decoder.decode(b"", final=True)
        if text:
            yield text.splitlines()

    def _pieces(self, head: bytes) -> Iterator[bytes]:
        """The file's bytes (decompressed), ``block_bytes`` at a time."""
        size = self.block_bytes
        for i in range(0, len(head), size):
            yield head[i:i + size]
        while chunk := self._bytes(size):
            yield chunk


def _binary(head: bytes) -> bool:
    """A NUL byte, or more than 10 % control bytes and invalid UTF-8 (text in another
    8-bit encoding, such as a Latin-1 degree sign per line, stays well below)."""
    if b"\0" in head:
        return True
    bad = len(head) - len(head.translate(None, _CONTROL))
    bad += head.decode("utf-8", errors="replace").count("\ufffd")
    return bad > max(8, len(head) // 10)


# --------------------------------------------------------------------------- rows


class Rows:
    """Data rows as read, per GPU: a block's rows in lists, earlier blocks in arrays of
    the kept fields (``keep``: None keeps all). ``factors``: each field's base units per
    unit of the file (0.01 for percent); a block's values that are float32 numbers of
    that unit are kept as float32, or as uint8 or uint16 where they are whole numbers
    that fit (see PackedFields)."""

    def __init__(self, path: str, fields: list[str], keep: Collection[str] | None = None,
                 factors: list[float] | None = None) -> None:
        self.path = path
        self.fields = [f for f in fields if keep is None or f in keep]
        self._cols = [i for i, f in enumerate(fields) if keep is None or f in keep]
        self.factors = [factors[i] if factors else 1.0 for i in self._cols]
        self._width = len(fields)
        self.count = 0  # rows added
        self.skipped_count = 0
        self.skipped: list[tuple[int, str]] = []  # the first KEEP_SKIPPED, in line order
        self.reasons: Counter[str] = Counter()  # wording (or kind, past MAX_REASONS) -> lines
        self.rejected: Counter[str] = Counter()
        self._block: dict[int, tuple[list[float], list[float], list[int]]] = {}
        self._pending = 0
        self._t: dict[int, list[np.ndarray]] = {}
        self._lines: dict[int, list[np.ndarray | range]] = {}
        self._values: dict[int, list[list[np.ndarray]]] = {}
        self._shared_t: tuple[list[np.ndarray], np.ndarray] | None = None  # see take

    def add(self, line: int, gpu: int, t: float, values: list[float]) -> None:
        """One row: its line number, GPU, time and every field's value (NaN: missing)."""
        block = self._block.get(gpu)
        if block is None:
            block = self._block[gpu] = ([], [], [])
        block[0].append(t)
        block[1].extend(values)
        block[2].append(line)
        self.count += 1
        self._pending += 1
        if self._pending >= BLOCK_ROWS:
            self.end_block()

    def skip(self, line: int, why: str) -> None:
        self.skipped_count += 1
        if len(self.skipped) < KEEP_SKIPPED:
            self.skipped.append((line, why))
        if why not in self.reasons and len(self.reasons) >= MAX_REASONS:
            why = reason_kind(why)
        self.reasons[why] += 1
        if self.count == 0 and self.skipped_count >= JUNK_LINES:
            first, reason = self.skipped[0]
            raise TraceError(f"{self.path}:{first}: the first {JUNK_LINES:,} data lines are all "
                             f"unusable (the first: {reason}): not a trace this reader "
                             "understands")

    def end_block(self) -> None:
        """The block's rows become arrays."""
        last: np.ndarray | None = None
        for gpu, (t, values, lines) in self._block.items():
            v = np.asarray(values, dtype=np.float64).reshape(len(t), self._width)
            times = np.asarray(t, dtype=np.float64)
            if last is not None and np.array_equal(times, last):
                times = last  # the GPUs of one poll share a time: one array for them all
            self._t.setdefault(gpu, []).append(times)
            last = times
            self._lines.setdefault(gpu, []).append(_line_numbers(lines))
            cols = self._values.setdefault(gpu, [[] for _ in self._cols])
            for j, c in enumerate(self._cols):
                cols[j].append(constant_view(_pack(v[:, c].copy(), self.factors[j])))
        self._block = {}
        self._pending = 0

    def all_times(self) -> np.ndarray:
        """Every row's time, of all GPUs (blocks ended)."""
        return np.concatenate([a for chunks in self._t.values() for a in chunks])

    def gpus(self) -> list[int]:
        return sorted(self._t)

    def take(self, gpu: int) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
        """(times, line numbers, kept fields' values) of one GPU, in file order; the
        blocks are released as they are joined. Times whose blocks are those of the GPU
        taken before (shared, see end_block) are its array."""
        chunks = self._t.pop(gpu)
        shared = self._shared_t
        if shared is not None and len(shared[0]) == len(chunks) and all(
                a is b for a, b in zip(shared[0], chunks, strict=True)):
            t = shared[1]
        else:
            t = _join(list(chunks))
        self._shared_t = (chunks, t)
        lines = _join([np.arange(r.start, r.stop, r.step, dtype=np.uint32)
                       if isinstance(r, range) else r for r in self._lines.pop(gpu)])
        fields = self._values.pop(gpu)
        values = []
        for factor in self.factors:
            chunks = fields.pop(0)
            if any(c.dtype == np.float64 for c in chunks):  # float64 where one block is
                chunks = [unpack(c, factor) if c.dtype != np.float64 else c for c in chunks]
            # else packed blocks join as the widest of them (uint8 < uint16 < float32: each
            # holds the narrower ones' whole numbers exactly)
            values.append(_one_value(chunks) if _same_value(chunks) else _join(chunks))
        return t, lines, values


def _libc_trim() -> Callable[[int], int] | None:
    try:
        return ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):  # not glibc: nothing to ask
        return None


_MALLOC_TRIM = _libc_trim()


def release_free_memory() -> None:
    """Give the pages of freed memory back to the system (glibc keeps them otherwise).

    The blocks' small arrays live in the C heap; once they are joined into each GPU's
    arrays and freed, glibc keeps their pages, so a long trace's peak would hold its
    values twice. Where the C library is not glibc this does nothing."""
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)


def _pack(col: np.ndarray, factor: float) -> np.ndarray:
    """Float64 values in base units as float32 numbers of the file's unit where that
    gives every one of them back exactly (whole degrees, percent, MHz), as uint8 or uint16
    where they are whole numbers that fit (a GPU's temperature, utilization, clocks), else
    as they are."""
    with np.errstate(over="ignore", invalid="ignore"):
        packed = (col / factor if factor != 1.0 else col).astype(np.float32)
    if not np.array_equal(unpack(packed, factor), col, equal_nan=True):
        return col
    if packed.size and not np.isnan(packed).any():
        low, high = float(packed.min()), float(packed.max())
        whole = low >= 0 and bool((packed == np.floor(packed)).all())
        for kind in (np.uint8, np.uint16):
            if whole and high <= np.iinfo(kind).max:
                narrow = packed.astype(kind)  # the same whole numbers, read back the same
                if np.array_equal(unpack(narrow, factor), col):
                    return narrow
                break
    return packed


def _line_numbers(lines: list[int]) -> np.ndarray | range:
    """A block's line numbers of one GPU: a range where they step evenly (nvidia-smi's
    GPUs take turns, one line each), else an array."""
    if len(lines) > 1:
        step = lines[1] - lines[0]
        r = range(lines[0], lines[-1] + 1, step) if step > 0 else None
        if r is not None and len(r) == len(lines) and all(
                a == b for a, b in zip(r, lines, strict=True)):
            return r
    return np.asarray(lines, dtype=np.uint32)


def _same_value(chunks: list[np.ndarray]) -> bool:
    """Whether every chunk is a view of one value (see constant_view), the same one."""
    return bool(chunks) and all(c.strides == (0,) and c.size and c[0] == chunks[0][0]
                                and c.dtype == chunks[0].dtype for c in chunks)


def _one_value(chunks: list[np.ndarray]) -> np.ndarray:
    """Chunks of one value joined without making the values (see _same_value)."""
    out = np.broadcast_to(chunks[0][:1].copy(), (sum(c.size for c in chunks),))
    chunks.clear()
    return out


def _join(chunks: list[np.ndarray]) -> np.ndarray:
    out = chunks[0] if len(chunks) == 1 else np.concatenate(chunks)
    chunks.clear()
    return out


# --------------------------------------------------------------------------- assembly


def assemble(path: str, fmt: str, rows: Rows) -> Trace:
    """Sorted, merged per-GPU series from the rows; stray timestamps skipped; rows of one
    GPU with the same time merged (counted in ``Trace.collapsed_rows``) and rows earlier
    than one read before them sorted into place (``Trace.out_of_order_rows``)."""
    rows.end_block()
    bounds = _bounds(rows)
    series: dict[int, GpuSeries] = {}
    strays: list[tuple[int, str]] = []
    collapsed = out_of_order = 0
    last_t: np.ndarray | None = None
    for gpu in rows.gpus():
        t, lines, values = rows.take(gpu)
        if bounds is not None:
            ok = (t >= bounds[0]) & (t <= bounds[1])
            if not ok.all():
                strays += [(int(ln), "timestamp far from the rest of the trace")
                           for ln in lines[~ok][:KEEP_SKIPPED]]
                stray_count = int((~ok).sum())
                rows.skipped_count += stray_count
                rows.reasons["timestamp far from the rest of the trace"] += stray_count
                t, values = t[ok], [v[ok] for v in values]
                if not t.size:
                    continue
        del lines
        if t.size > 1 and not bool(np.all(t[1:] > t[:-1])):
            out_of_order += int(np.count_nonzero(t[1:] < np.maximum.accumulate(t)[:-1]))
            order = np.argsort(t, kind="stable")
            t = t[order]
            values = [v[order] for v in values]
            del order
            t, values, merged = _merge_equal_times(t, values)
            collapsed += merged
        if last_t is not None and t is not last_t and np.array_equal(t, last_t):
            t = last_t  # the same times as the GPU before: one array for both
        last_t = t
        release_free_memory()  # the GPU's blocks, now joined
        series[gpu] = GpuSeries(gpu, t, PackedFields(
            dict(zip(rows.fields, values, strict=True)),
            {f: k for f, k, v in zip(rows.fields, rows.factors, values, strict=True)
             if v.dtype != np.float64}))
    skipped = sorted(rows.skipped + strays)[:KEEP_SKIPPED]
    if not series:
        where = f"{skipped[0][0]}: first skipped line: {skipped[0][1]}" if skipped else "1"
        raise TraceError(f"{path}:{where}: no usable data rows ({rows.skipped_count} skipped)")
    return Trace(path, fmt, sorted(series), series, rows.skipped_count, {}, skipped,
                 rejected=dict(rows.rejected), skip_reasons=rows.reasons,
                 collapsed_rows=collapsed, out_of_order_rows=out_of_order)


def _bounds(rows: Rows) -> tuple[float, float] | None:
    # all_times is a new array of them all, no one else's: it may be reordered in place
    return time_bounds(rows.all_times(), overwrite=True) if rows.count >= 100 else None


def _merge_equal_times(t: np.ndarray, values: list[np.ndarray]
                       ) -> tuple[np.ndarray, list[np.ndarray], int]:
    """Rows of one GPU (sorted by time, stably) with the same time become one row: per
    field the last value that is not missing wins. Also: how many rows were merged away."""
    if not bool(np.any(t[1:] == t[:-1])):
        return t, values, 0
    new = np.r_[True, t[1:] != t[:-1]]
    group = np.cumsum(new) - 1
    ut = t[new]
    out = []
    for v in values:
        ok = np.flatnonzero(~np.isnan(v))
        g = group[ok]
        last = np.r_[g[1:] != g[:-1], True] if g.size else np.zeros(0, dtype=bool)
        # (whole numbers kept as uint8/uint16 have no missing value: every time gets one)
        merged = np.full(ut.size, np.nan if v.dtype.kind == "f" else 0, dtype=v.dtype)
        merged[g[last]] = v[ok[last]]
        out.append(merged)
    return ut, out, int(t.size - ut.size)
