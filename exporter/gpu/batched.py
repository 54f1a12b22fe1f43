"""Batched NVML reads without pynvml's per-struct Python.

pynvml's wrappers for nvmlDeviceGetFieldValues and nvmlDeviceGetSamples build and read
their ctypes structs one attribute at a time through a slow `__getattribute__`: for the
~120 fields of an H100's device read, or the ~50 power samples a drain returns every
second per GPU, that Python costs more than the driver's call. These call the same C
symbols, looked up through pynvml itself (`_nvmlGetFunctionPointer`, so a fake library
installed under pynvml answers them just the same), on buffers made of pynvml's own
struct types, and read the answers through numpy views. If a pynvml release changes
those structs' layout, `LAYOUT_OK` is False and the backend uses pynvml's wrappers.
"""

from __future__ import annotations

import ctypes
import struct
from types import ModuleType

import numpy as np

FIELD_DTYPE = np.dtype([("fieldId", "<u4"), ("scopeId", "<u4"), ("timestamp", "<i8"),
                        ("latencyUsec", "<i8"), ("valueType", "<u4"), ("nvmlReturn", "<u4"),
                        ("value", "<u8")])
SAMPLE_DTYPE = np.dtype([("timeStamp", "<u8"), ("value", "<u8")])
SAMPLE_CAPACITY = 256  # above any driver's buffer (119 samples on an H200)
MAX_CALLS = 64  # calls one drain may make when each comes back full
# Requests of up to this many fields are read with struct and plain Python (the sweep's 4,
# the slow sweep's 20, a polled power field): for so few, numpy's per-operation cost is
# most of the read. Longer ones (a device read's ~120 NVLink fields) through numpy views.
SMALL_REQUEST = 24

# nvmlValueType_t -> how the 8-byte value union reads
_DOUBLE, _UINT, _ULONG, _ULL, _SLL, _SINT, _USHORT = range(7)
_LOW32 = np.uint64(0xFFFFFFFF)  # a numpy scalar: a Python int is converted each use


def layout_ok(nvml: ModuleType) -> bool:
    """Whether pynvml's structs are laid out as the numpy views assume."""
    field, sample = nvml.c_nvmlFieldValue_t, nvml.c_nvmlSample_t
    offsets, names = FIELD_DTYPE.fields, FIELD_DTYPE.names
    assert offsets is not None and names is not None  # a structured dtype
    return (ctypes.sizeof(field) == FIELD_DTYPE.itemsize
            and ctypes.sizeof(sample) == SAMPLE_DTYPE.itemsize
            and all(getattr(field, name).offset == offsets[name][1] for name in names)
            and sample.timeStamp.offset == 0 and sample.sampleValue.offset == 8)


def _view(array: ctypes.Array, dtype: np.dtype) -> np.ndarray:
    return np.frombuffer(memoryview(array).cast("B"), dtype=dtype)


def field_values(raw: np.ndarray) -> np.ndarray:
    """The value union of field entries as float64, by each entry's valueType."""
    value, kind = raw["value"], raw["valueType"]
    out = value.astype(np.float64)  # unsigned long (long)
    low = value & 0xFFFFFFFF
    # each conversion only for the types present (a sweep's few fields are one or two)
    for present in set(kind.tolist()) - {_ULONG, _ULL}:
        chosen = kind == present
        if present == _UINT:
            out[chosen] = low[chosen]
        elif present == _USHORT:
            out[chosen] = value[chosen] & 0xFFFF
        elif present == _DOUBLE:
            out[chosen] = value[chosen].view(np.float64)
        elif present == _SLL:
            out[chosen] = value[chosen].view(np.int64)
        elif present == _SINT:
            out[chosen] = low[chosen].astype(np.uint32).view(np.int32)
    return out


# (valueType, nvmlReturn, value) of each entry, the rest skipped: FIELD_DTYPE as struct reads it
_ENTRY_TAIL = "24xIIQ"
_U64 = struct.Struct("<Q")
_F64 = struct.Struct("<d")


def union_value(kind: int, value: int) -> float:
    """One field's value union as float, by its valueType: as field_values reads it."""
    if kind == _UINT:
        return float(value & 0xFFFFFFFF)
    if kind == _DOUBLE:
        return _F64.unpack(_U64.pack(value))[0]
    if kind == _SLL:
        return float(value - (1 << 64) if value >> 63 else value)
    if kind == _SINT:
        low = value & 0xFFFFFFFF
        return float(low - (1 << 32) if low >> 31 else low)
    if kind == _USHORT:
        return float(value & 0xFFFF)
    return float(value)  # unsigned long (long), and a type this code does not know


# A read's answer: each entry's value in order (None where it failed), and the failed
# entries' (position, nvmlReturn).
FieldAnswer = tuple[list[float | None], list[tuple[int, int]]]


def field_answer(raw: np.ndarray) -> FieldAnswer:
    """A FieldAnswer of field entries as a numpy array (FIELD_DTYPE)."""
    values: list[float | None] = field_values(raw).tolist()
    codes = raw["nvmlReturn"]
    if not codes.any():
        return values, []
    failed = [(int(i), int(codes[i])) for i in np.flatnonzero(codes)]
    for i, _ in failed:
        values[i] = None
    return values, failed


class FieldRequest:
    """One GPU's request for a fixed list of (field, scope) pairs, reused every read: the
    ctypes arguments made once, the request restored before each call with one copy."""

    def __init__(self, nvml: ModuleType, requests: list[tuple[int, int]]):
        n = len(requests)
        self.array = (nvml.c_nvmlFieldValue_t * n)()
        self.view = _view(self.array, FIELD_DTYPE)
        self.view["fieldId"] = [f for f, _ in requests]
        self.view["scopeId"] = [s for _, s in requests]
        self._request = bytes(self.array)  # the ids and scopes, every answer member zero
        self._count = ctypes.c_int32(n)
        self._pointer = ctypes.byref(self.array)
        self._unpack = (struct.Struct("<" + _ENTRY_TAIL * n).unpack_from
                        if n <= SMALL_REQUEST else None)

    def read(self, nvml: ModuleType, handle) -> FieldAnswer:
        """The entries' values; raises pynvml's NVMLError if the call fails."""
        ctypes.memmove(self.array, self._request, len(self._request))
        fn = nvml._nvmlGetFunctionPointer("nvmlDeviceGetFieldValues")
        ret = fn(handle, self._count, self._pointer)
        if ret != nvml.NVML_SUCCESS:
            raise nvml.NVMLError(ret)
        if self._unpack is None:
            return field_answer(self.view)
        flat = self._unpack(self.array)
        values: list[float | None] = []
        failed: list[tuple[int, int]] = []
        for i in range(0, len(flat), 3):
            if flat[i + 1]:  # nvmlReturn: this entry failed
                failed.append((i // 3, flat[i + 1]))
                values.append(None)
            elif flat[i] == _UINT:  # the common type, without the call
                values.append(float(flat[i + 2] & 0xFFFFFFFF))
            else:
                values.append(union_value(flat[i], flat[i + 2]))
        return values, failed


class SampleBuffer:
    """One GPU's buffer for nvmlDeviceGetSamples: one C call per drain (pynvml makes two,
    the first to ask the count), the answer read through a numpy view."""

    def __init__(self, nvml: ModuleType):
        self.array = (nvml.c_nvmlSample_t * SAMPLE_CAPACITY)()
        self.view = _view(self.array, SAMPLE_DTYPE)
        self.value_type = ctypes.c_uint()
        self.count = ctypes.c_uint()
        # the call's arguments, made once: pointers to the answers, the time asked from
        self._value_type_ref, self._count_ref = ctypes.byref(self.value_type), ctypes.byref(
            self.count)
        self._since = ctypes.c_ulonglong()
        self._types: dict[int, ctypes.c_uint] = {}

    def read(self, nvml: ModuleType, handle, sampling_type: int, last_seen_us: int
             ) -> tuple[np.ndarray, np.ndarray]:
        """(timestamps in us, values) of the samples newer than last_seen_us, as the
        driver returned them; raises pynvml's NVMLError (NotFound: none new).

        A full answer may have left newer samples behind (a replay at speed fills a
        larger buffer than any driver's): ask again from the newest one, up to
        MAX_CALLS times, so a drain takes everything there is."""
        stamps, values = self._read_once(nvml, handle, sampling_type, last_seen_us)
        parts = [(stamps, values)]
        while len(stamps) == SAMPLE_CAPACITY and len(parts) < MAX_CALLS:
            try:
                stamps, values = self._read_once(nvml, handle, sampling_type,
                                                 int(stamps[-1]))
            except nvml.NVMLError as exc:
                if exc.value != nvml.NVML_ERROR_NOT_FOUND:
                    raise
                break
            parts.append((stamps, values))
        if len(parts) == 1:
            return parts[0]
        return (np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]))

    def _read_once(self, nvml: ModuleType, handle, sampling_type: int, last_seen_us: int
                   ) -> tuple[np.ndarray, np.ndarray]:
        self.count.value = SAMPLE_CAPACITY
        self._since.value = last_seen_us
        kind = self._types.get(sampling_type)
        if kind is None:
            kind = self._types[sampling_type] = ctypes.c_uint(sampling_type)
        fn = nvml._nvmlGetFunctionPointer("nvmlDeviceGetSamples")
        ret = fn(handle, kind, self._since, self._value_type_ref, self._count_ref, self.array)
        if ret != nvml.NVML_SUCCESS:
            raise nvml.NVMLError(ret)
        got = self.view[:min(self.count.value, SAMPLE_CAPACITY)]
        raw = got["value"]
        if self.value_type.value == _DOUBLE:
            values = raw.view(np.float64).copy()
        elif self.value_type.value in (_UINT, _SINT):
            values = (raw & _LOW32).astype(np.float64)
        else:
            values = raw.astype(np.float64)
        return got["timeStamp"].copy(), values
