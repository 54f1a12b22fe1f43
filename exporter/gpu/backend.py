"""The one code path to NVML: pynvml calls with error accounting.

Everything the exporter reads from a GPU goes through NvmlBackend.call() or
NvmlBackend.fields(), which turn an NVMLError into a skipped value counted by
call and error name; one failing call never stops a sweep.
"""

from __future__ import annotations

import ctypes
import functools
import importlib.util
import sys
import threading
from collections import Counter
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any, cast

import numpy as np
import pynvml

from exporter.gpu import batched
from exporter.gpu import fields as fi

# Field value union members by valueType (nvml.h nvmlValueType_t).
_VALUE_MEMBERS = {
    pynvml.NVML_VALUE_TYPE_DOUBLE: "dVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_INT: "uiVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG: "ulVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: "ullVal",
    pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG: "sllVal",
    pynvml.NVML_VALUE_TYPE_SIGNED_INT: "siVal",
    getattr(pynvml, "NVML_VALUE_TYPE_UNSIGNED_SHORT", 6): "usVal",
}

FIELDS_PER_CALL = 64  # keep each nvmlDeviceGetFieldValues request modest


class NvmlUnavailable(RuntimeError):
    """NVML cannot be initialised here (no driver, no library)."""


def error_name(exc: BaseException) -> str:
    """`NotSupported` for pynvml.NVMLError_NotSupported; the class name otherwise."""
    name = type(exc).__name__
    return name.removeprefix("NVMLError_") if name != "NVMLError" else (
        f"Code{getattr(exc, 'value', None)}")


_PYNVML_FIELD_PREFIX = "NVML_FI_DEV_"
# field id -> its nvidia-ml-py name (the first where it has two), for the ids fields.py
# does not name
_PYNVML_FIELD_NAMES: dict[int, str] = {}
for _key, _value in vars(pynvml).items():
    if _key.startswith(_PYNVML_FIELD_PREFIX) and isinstance(_value, int):
        _PYNVML_FIELD_NAMES.setdefault(_value, _key.removeprefix(_PYNVML_FIELD_PREFIX))


def field_name(field_id: int) -> str:
    """A field's name in error labels: fields.py's, else nvidia-ml-py's, else its id."""
    return fi.NAMES.get(field_id) or _PYNVML_FIELD_NAMES.get(field_id, str(field_id))


class ErrorCounts:
    """Thread-safe cumulative counts of failed NVML calls by (call, error)."""

    def __init__(self) -> None:
        self._counts: Counter[tuple[str, str]] = Counter()
        self._lock = threading.Lock()

    def add(self, call: str, error: str) -> None:
        with self._lock:
            self._counts[(call, error)] += 1

    def totals(self) -> dict[tuple[str, str], int]:
        """A copy of the failure counts, by (call, error)."""
        with self._lock:
            return dict(self._counts)


# Errors that mean the GPU itself is gone (fell off the bus, or vanished from NVML).
LOST_ERRORS = ("GpuIsLost", "GpuNotFound")
# Answers that will not change while the driver stays loaded: asked once per GPU and call.
PERMANENT_ERRORS = ("NotSupported", "FunctionNotFound")


def private_nvml_module(name: str) -> ModuleType:
    """A separate copy of the pynvml module, with its own driver library and state.

    The fleet simulator gives each virtual node one, so several fake nodes (each with
    its own library under its own pynvml) run in one process."""
    module_name = f"_cte_pynvml_{name}"
    spec = importlib.util.spec_from_file_location(module_name, pynvml.__file__)
    assert spec is not None and spec.loader is not None, pynvml.__file__
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # pynvml looks itself up there while loading
    spec.loader.exec_module(module)
    return module


class NvmlBackend:
    """Initialises NVML once, caches device handles, and makes counted calls.

    Every call goes through `nvml` (the pynvml module, or a private copy of it)."""

    def __init__(self, nvml: ModuleType = pynvml) -> None:
        self.nvml = nvml
        self.errors = ErrorCounts()
        self.lost: set[int] = set()  # GPUs that answered GpuIsLost; cleared on recovery
        # (gpu, call, args) -> the error NVML answered for good (NotSupported: a property of
        # the device; FunctionNotFound: of the driver), so it is counted once, not asked again
        self._unsupported: dict[tuple, str] = {}
        self._unsupported_fields: set[tuple[int, int, int]] = set()  # (gpu, field, scope)
        self._batched = batched.layout_ok(nvml)  # numpy views of pynvml's structs
        self._requests: dict[tuple, batched.FieldRequest] = {}
        # (gpu, requests) -> (how many fields were unsupported, the calls to make)
        self._field_plans: dict[tuple, tuple[int, tuple[tuple[tuple[int, int], ...], ...]]] = {}
        self._sample_buffers: dict[int, batched.SampleBuffer] = {}
        self._bound: dict[tuple[int, int], tuple[tuple, tuple[Callable[[Any], Any], ...]]] = {}
        self.handles: list[Any] = []
        # the pointer behind each handle registered for events -> its GPU: an event names
        # its GPU by handle, and a lost GPU's handle answers nothing (not even its UUID)
        self._event_gpus: dict[int, int] = {}
        self.driver_version = ""
        self.nvml_version = ""
        self._open = False

    def open(self) -> int:
        """nvmlInit and enumerate devices; returns the GPU count."""
        try:
            self.nvml.nvmlInit()
        except self.nvml.NVMLError as exc:
            raise NvmlUnavailable(f"NVML is not available: {exc} ({error_name(exc)})") from None
        self._open = True
        self.driver_version = self.call("nvmlSystemGetDriverVersion") or ""
        self.nvml_version = self.call("nvmlSystemGetNVMLVersion") or ""
        count = self.call("nvmlDeviceGetCount") or 0
        self.handles = []
        for index in range(count):
            self.handles.append(self.call("nvmlDeviceGetHandleByIndex",
                                          index))
        return count

    def close(self) -> None:
        self._event_gpus.clear()  # a reopened NVML may give these pointers to other GPUs
        if self._open:
            self._open = False
            self.call("nvmlShutdown")

    def call(self, name: str, *args: Any, gpu: int | None = None,
             expected: tuple[str, ...] = ()) -> Any:
        """Call the pynvml function `name`; on NVMLError count it and return None.

        With `gpu`, an error saying the GPU is gone marks it lost (see `lost`), and a call
        the GPU does not support (or a driver without the symbol) is not made again. Errors
        named in `expected` are answers, not failures (NotFound for an empty MIG slot): None,
        not counted."""
        return self.attempt(name, *args, gpu=gpu, expected=expected)[0]

    def attempt(self, name: str, *args: Any, gpu: int | None = None,
                expected: tuple[str, ...] = ()) -> tuple[Any, str | None]:
        """As call(), with the name of the error (None on success), for callers whose next
        step depends on why a call failed (NoPermission is not NotSupported)."""
        key: tuple[object, ...] | None
        if gpu is None:
            key = None
        elif len(args) <= 1:  # the handle alone (most calls): no arguments to key by
            key = (gpu, name)
        else:
            key = (gpu, name, *[a for a in args[1:] if isinstance(a, int)])
        if key is not None and self._unsupported:  # mostly empty: no lookup, no hash
            known = self._unsupported.get(key)
            if known is not None:
                return None, known
        function = getattr(self.nvml, name, None)
        if function is None:  # bindings older than the call: as a driver without the symbol
            self.errors.add(name, "FunctionNotFound")
            if key is not None:
                self._unsupported[key] = "FunctionNotFound"
            return None, "FunctionNotFound"
        try:
            return function(*args), None
        except self.nvml.NVMLError as exc:
            if expected and error_name(exc) in expected:
                return None, error_name(exc)
            return None, self._failed(name, exc, gpu, key)

    def bound(self, gpu: int, name: str, args: tuple[int, ...] = ()
              ) -> Callable[[Any], Any]:
        """call(name, handle, *args, gpu=gpu) as a function of the handle, with the pynvml
        function and the key of unsupported calls looked up once, not at every call: the
        sweep makes each of its calls on each GPU every second."""
        function = getattr(self.nvml, name, None)
        if function is None:  # counted (once) as call() counts it
            return lambda handle: self.call(name, handle, *args, gpu=gpu)
        key = (gpu, name, *[a for a in args if isinstance(a, int)]) if args else (gpu, name)
        unsupported, nvml_error, failed = self._unsupported, self.nvml.NVMLError, self._failed

        def bound_call(handle: Any) -> Any:
            if key in unsupported:
                return None
            try:
                return function(handle, *args)
            except nvml_error as exc:
                failed(name, exc, gpu, key)
                return None

        return bound_call

    def bound_calls(self, gpu: int, calls: tuple[tuple[str, tuple[int, ...]], ...]
                    ) -> tuple[Callable[[Any], Any], ...]:
        """bound() of each (name, args), kept by the tuple's identity (a reading plan's:
        the same few every sweep)."""
        kept = self._bound.get((gpu, id(calls)))
        if kept is not None and kept[0] is calls:
            return kept[1]
        functions = tuple(self.bound(gpu, name, args) for name, args in calls)
        if len(self._bound) >= 1024:
            self._bound.clear()
        self._bound[(gpu, id(calls))] = (calls, functions)  # holds the tuple: its id stays
        return functions

    def process_utilization(self, gpu: int, last_seen_us: int, handle: Any = None
                            ) -> list | None:
        """`nvmlDeviceGetProcessUtilization` samples newer than `last_seen_us`: [] when
        none (NVML says NotFound); None when the call failed (counted) or the GPU does
        not support it (asked once, as `call` does; MIG mode answers NotSupported)."""
        handle = self.handle(gpu) if handle is None else handle
        key = (gpu, "nvmlDeviceGetProcessUtilization")
        if handle is None or key in self._unsupported:
            return None
        try:
            return list(self.nvml.nvmlDeviceGetProcessUtilization(handle, last_seen_us))
        except self.nvml.NVMLError as exc:
            if error_name(exc) == "NotFound":
                return []
            self._failed("nvmlDeviceGetProcessUtilization", exc, gpu, key)
            return None

    def _failed(self, name: str, exc: Exception, gpu: int | None, key: tuple | None) -> str:
        """Count a failed call; mark its GPU lost or the call unsupported as the error says."""
        name_of_error = error_name(exc)
        self.errors.add(name, name_of_error)
        if gpu is not None and name_of_error in LOST_ERRORS:
            self.lost.add(gpu)
        elif key is not None and name_of_error in PERMANENT_ERRORS:
            self._unsupported[key] = name_of_error
        return name_of_error

    def handle(self, gpu: int) -> Any:
        """The cached handle, re-acquired if the first attempt failed."""
        handle = self.handles[gpu]
        if handle is None:
            handle = self.call("nvmlDeviceGetHandleByIndex", gpu, gpu=gpu)
            self.handles[gpu] = handle
        return handle

    def reacquire(self, gpu: int) -> Any:
        """Drop the cached handle and ask NVML for a fresh one (recovering a lost GPU)."""
        self.handles[gpu] = None
        return self.handle(gpu)

    def fields(self, gpu: int, field_ids: Sequence[int]) -> dict[int, float]:
        """Read many fields in one nvmlDeviceGetFieldValues call, in NVML's units; failed
        fields are left out."""
        return {fid: r for (fid, _), r in self.scoped_fields(gpu, field_ids).items()}

    def scoped_fields(self, gpu: int, requests: Sequence[int | tuple[int, int]]
                      ) -> dict[tuple[int, int], float]:
        """Fields by (field id, scope id), e.g. one per NVLink; batched, failed ones left out.

        A field the GPU answers NotSupported for is counted once and not asked again."""
        handle = self.handle(gpu)
        if handle is None:
            return {}
        out: dict[tuple[int, int], float] = {}
        for chunk in self._field_chunks(gpu, requests):
            answer = self._field_answer(gpu, handle, chunk)
            if answer is None:
                return out
            values, failed = answer
            if not failed:  # entries come back in the order asked, every one answered
                out.update(zip(chunk, cast(list[float], values), strict=True))
                continue
            for position, code in failed:
                self._field_failed(gpu, *chunk[position], code)
            out.update((request, value) for request, value in zip(chunk, values, strict=True)
                       if value is not None)
        return out

    def _field_chunks(self, gpu: int, requests: Sequence[int | tuple[int, int]]
                      ) -> tuple[tuple[tuple[int, int], ...], ...]:
        """The (field, scope) pairs still worth asking, in calls of FIELDS_PER_CALL; worked
        out again only when a field has turned out NotSupported since."""
        key = (gpu, tuple(requests))
        known = self._field_plans.get(key)
        if known is not None and known[0] == len(self._unsupported_fields):
            return known[1]
        wanted = [_scoped(r) for r in requests]
        wanted = [r for r in wanted if (gpu, *r) not in self._unsupported_fields]
        chunks = tuple(tuple(wanted[start:start + FIELDS_PER_CALL])
                       for start in range(0, len(wanted), FIELDS_PER_CALL))
        if len(self._field_plans) >= 256:
            self._field_plans.clear()
        self._field_plans[key] = (len(self._unsupported_fields), chunks)
        return chunks

    def _field_answer(self, gpu: int, handle: Any, chunk: tuple[tuple[int, int], ...]
                      ) -> batched.FieldAnswer | None:
        """One nvmlDeviceGetFieldValues call: each entry's value, and the failed ones; None
        if the call itself failed (counted)."""
        try:
            if self._batched:
                request = self._requests.get((gpu, chunk))
                if request is None:
                    request = batched.FieldRequest(self.nvml, list(chunk))
                    self._requests[(gpu, chunk)] = request
                return request.read(self.nvml, handle)
            array = self.nvml.nvmlDeviceGetFieldValues(handle, chunk)
            return batched.field_answer(np.frombuffer(memoryview(array).cast("B"),
                                                      batched.FIELD_DTYPE))
        except self.nvml.NVMLError as exc:
            self._failed("nvmlDeviceGetFieldValues", exc, gpu, None)
            return None

    def _field_failed(self, gpu: int, fid: int, scope: int, code: int) -> None:
        error = error_name(self.nvml.NVMLError(code))
        self.errors.add(f"nvmlDeviceGetFieldValues({field_name(fid)})", error)
        if error == "NotSupported":
            self._unsupported_fields.add((gpu, fid, scope))

    def samples(self, gpu: int, sampling_type: int, last_seen_us: int
                ) -> tuple[np.ndarray, np.ndarray] | None:
        """The driver's buffered samples newer than `last_seen_us`, oldest first, as
        (timestamps in us, values); empty arrays when there are none (NVML says
        NotFound); None when the call failed (counted) or the GPU keeps no such buffer."""
        handle = self.handle(gpu)
        key = (gpu, "nvmlDeviceGetSamples", sampling_type)
        if handle is None or key in self._unsupported:
            return None
        try:
            if self._batched:
                buffer = self._sample_buffers.get(gpu)
                if buffer is None:
                    buffer = self._sample_buffers[gpu] = batched.SampleBuffer(self.nvml)
                stamps, values = buffer.read(self.nvml, handle, sampling_type, last_seen_us)
            else:
                value_type, got = self.nvml.nvmlDeviceGetSamples(handle, sampling_type,
                                                                 last_seen_us)
                member = _VALUE_MEMBERS.get(value_type, "uiVal")
                stamps = np.array([s.timeStamp for s in got], dtype=np.uint64)
                values = np.array([getattr(s.sampleValue, member) for s in got], dtype=float)
        except self.nvml.NVMLError as exc:
            if error_name(exc) == "NotFound":
                return np.zeros(0, dtype=np.uint64), np.zeros(0)
            self._failed("nvmlDeviceGetSamples", exc, gpu, key)
            return None
        if len(stamps) > 1 and (stamps[1:] < stamps[:-1]).any():
            order = np.argsort(stamps, kind="stable")
            return stamps[order], values[order]
        return stamps, values

    # -- XID events ------------------------------------------------------------------
    def register_xid_events(self) -> tuple[Any, int]:
        """An event set with every GPU registered for critical XIDs alone (if any bit of
        a mask is unsupported, nothing registers); (set or None, GPUs registered)."""
        self._event_gpus.clear()  # the handles of this registration alone
        event_set = self.call("nvmlEventSetCreate")
        if event_set is None:
            return None, 0
        registered = 0
        for gpu in range(len(self.handles)):
            handle = self.handle(gpu)
            if handle is None:
                continue
            try:  # pynvml answers None either way: only an exception says it failed
                self.nvml.nvmlDeviceRegisterEvents(
                    handle, pynvml.nvmlEventTypeXidCriticalError, event_set)
                registered += 1
                address = _address(handle)
                if address is not None:
                    self._event_gpus[address] = gpu
            except self.nvml.NVMLError as exc:
                self.errors.add("nvmlDeviceRegisterEvents", error_name(exc))
        return event_set, registered

    def wait_xid(self, event_set: Any, timeout_ms: int) -> tuple[Any, int] | None:
        """(device handle, XID) of the next event, or None after the timeout.
        Raises NvmlEventError when waiting itself fails (counted)."""
        try:
            data = self.nvml.nvmlEventSetWait(event_set, timeout_ms)
        except self.nvml.NVMLError_Timeout:
            return None
        except self.nvml.NVMLError as exc:
            self.errors.add("nvmlEventSetWait", error_name(exc))
            raise NvmlEventError(error_name(exc)) from None
        return data.device, int(data.eventData)

    def gpu_of(self, handle: Any, uuids: dict[str, int]) -> int | None:
        """The index of the GPU behind an event's handle: the GPU it was registered for,
        without asking the handle (the GPU may be lost: an XID 79 comes just then). A
        handle not registered here is asked its UUID, else NVML's index."""
        address = _address(handle)
        if address is not None and address in self._event_gpus:
            return self._event_gpus[address]
        uuid = self.call("nvmlDeviceGetUUID", handle)
        gpu = uuids.get(uuid) if uuid is not None else None
        return gpu if gpu is not None else self.call("nvmlDeviceGetIndex", handle)

    @functools.cached_property
    def bindings_version(self) -> str:
        """The bindings' version, read once: it is asked at every snapshot, and pynvml
        has no `__version__`, so each getattr raised and caught an AttributeError."""
        return getattr(self.nvml, "__version__", "") or "unknown"


def _address(handle: Any) -> int | None:
    """The pointer a device handle holds (pynvml's handles are ctypes pointers)."""
    try:
        return ctypes.cast(handle, ctypes.c_void_p).value
    except (TypeError, ctypes.ArgumentError):
        return None


def _scoped(request: int | tuple[int, int]) -> tuple[int, int]:
    return (request, 0) if isinstance(request, int) else request


class NvmlEventError(RuntimeError):
    """Waiting for NVML events failed (the error was counted)."""
