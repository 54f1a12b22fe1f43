"""A fake NVML driver library that stands in *under* pynvml.

pynvml (nvidia-ml-py) loads libnvidia-ml.so.1 into its module global `nvmlLib`
only while that is None, then looks every C symbol up by name with getattr and
caches it. Installing a FakeNvmlLibrary there makes every pynvml wrapper,
ctypes struct and NVMLError subclass run for real: the exporter's backend takes
exactly the production code path, and only the silicon is simulated.

Each symbol takes the ctypes arguments pynvml passes (byref targets, string
buffers, field-value arrays), fills them and returns an NVML return code. Values come
from a Scenario evaluated at the time of the call (sim/fake_model.py), and each call
takes the wall time and CPU a real H200 charges for it (sim/costs.py; `costs=None`
turns that off for fast tests).
"""

from __future__ import annotations

import ctypes
import threading
import time
from collections.abc import Callable
from contextlib import contextmanager
from threading import get_ident
from time import thread_time
from types import ModuleType

import pynvml

from exporter.sim import costs as cost_model
from exporter.sim.cstructs import HandleAddresses, target
from exporter.sim.fake_device import DeviceSymbols
from exporter.sim.fake_fields import FieldSymbols
from exporter.sim.fake_gpm import GpmSymbols
from exporter.sim.fake_model import ModelValues
from exporter.sim.fake_tenants import TenantSymbols
from exporter.sim.physics import HANDLE_BASE, FakeGpu, step_timing
from exporter.sim.scenarios import ERROR_CODES, FaultEvent, Scenario
from exporter.sim.symbols import WAITING

SUCCESS = 0
ERROR_UNINITIALIZED = 1
ERROR_INVALID_ARGUMENT = 2
ERROR_NOT_SUPPORTED = 3



class FakeHookError(RuntimeError):
    """pynvml no longer exposes the globals the fake hooks into."""


class _Symbol:
    """A callable standing for one C symbol; pynvml may set attributes (restype) on it.

    Each call counts in `lib.calls` and, per thread, the CPU it took in
    `lib.busy_by_thread` (time.thread_time() around the call: the fake's own Python, or
    with a cost model what the model burnt where that is more) and what the model
    charged in `lib.modelled_by_thread` (0 without one). A call that may wait
    (symbols.WAITING) counts in `calls` only."""

    def __init__(self, lib: FakeNvmlLibrary, name: str, impl: Callable[..., int]):
        self.lib, self.name, self.impl = lib, name, impl
        self.waits = name in WAITING

    def __call__(self, *args):
        lib, name = self.lib, self.name
        calls = lib.calls
        calls[name] = calls.get(name, 0) + 1
        if self.waits:
            return self.impl(*args)
        if lib.costs is not None:
            return self._charged(args)
        c0 = thread_time()  # CPU: GIL waits are not ours
        try:
            may_fail = lib._call_faults.get(name)
            if may_fail or (may_fail is None and lib.may_fail(name)):
                fault = lib.fault_for(name, args)
                if fault is not None:
                    return fault
            return self.impl(*args)
        finally:
            spent = thread_time() - c0
            # each thread adds to its own entries only: no update is lost to another
            busy, thread = lib.busy_by_thread, get_ident()
            before = busy.get(thread)
            if before is None:
                busy[thread] = spent
                lib.modelled_by_thread.setdefault(thread, 0.0)
            else:
                busy[thread] = before + spent

    def _charged(self, args: tuple):
        """The call, charged what the cost model says it costs."""
        lib, name, model = self.lib, self.name, self.lib.costs
        assert model is not None
        t0, c0 = time.perf_counter(), thread_time()
        lib.pending_cost = None
        try:
            fault = lib.fault_for(name, args) if lib.may_fail(name) else None
            return fault if fault is not None else self.impl(*args)
        finally:
            cost = lib.pending_cost or model.of_call(name)
            spent, modelled = cost_model.charge(cost, c0, t0), cost.cpu
            busy, charged, thread = lib.busy_by_thread, lib.modelled_by_thread, get_ident()
            busy[thread] = busy.get(thread, 0.0) + spent
            charged[thread] = charged.get(thread, 0.0) + modelled


class FakeNvmlLibrary(DeviceSymbols, FieldSymbols, GpmSymbols, ModelValues, TenantSymbols):
    """Answers the NVML C symbols pynvml looks up, from a Scenario."""

    def __init__(self, scenario: Scenario, clock: Callable[[], float] = time.time,
                 costs: cost_model.CostModel | None = cost_model.H200,
                 start: float | None = None):
        """`start`: when the scenario's time 0 is (default: now, by `clock`)."""
        self.nvml = pynvml  # the pynvml module it is installed under (install() sets it)
        self.handles = HandleAddresses()
        self.scenario = scenario  # and its faults, indexed (the setter)
        self.clock = clock
        self.costs = costs
        self.pending_cost: cost_model.Cost | None = None  # set by calls whose cost varies
        self.start = clock() if start is None else start
        timing = step_timing(scenario)
        self.gpus = [FakeGpu(i, scenario, self.start, *timing[i]) for i in range(scenario.gpus)]
        self.initialized = 0
        self.calls: dict[str, int] = {}
        self.looked_up: set[str] = set()
        self.missing: set[str] = set()
        # CPU inside the fake per thread (threading.get_ident()): the modelled driver's,
        # or the fake's own Python where that costs more; and what the model charged
        self.busy_by_thread: dict[int, float] = {}
        self.modelled_by_thread: dict[int, float] = {}
        self._released = threading.Event()
        self._hangs_done: set[int] = set()
        self._lock = threading.Lock()
        self._event_sets: dict[int, dict] = {}
        self._next_set = 0
        self.init_gpm()
        self.init_model()

    @property
    def busy_seconds(self) -> float:
        """CPU time inside the fake, all threads: the modelled driver's, or the fake's
        own Python where that costs more (less the credit it gave back: sim/costs.py)."""
        return sum(list(self.busy_by_thread.values()))

    @property
    def modelled_seconds(self) -> float:
        """The CPU the cost model charged, all threads (the H200's figure: less than
        busy_seconds where the fake's own Python costs more than the model)."""
        return sum(list(self.modelled_by_thread.values()))

    @property
    def scenario(self) -> Scenario:
        return self._scenario

    @scenario.setter
    def scenario(self, scenario: Scenario) -> None:
        """Index the faults by kind, so that a call asks only about the faults that could
        apply to it (most scenarios have none)."""
        self._scenario = scenario
        by_kind: dict[str, list[FaultEvent]] = {}
        for event in scenario.events:
            by_kind.setdefault(event.kind, []).append(event)
        self._faults_by_kind = {kind: tuple(events) for kind, events in by_kind.items()}
        self.fault_kinds = frozenset(by_kind)
        self._call_faults: dict[str, bool] = {}  # symbol -> whether a fault could fail it
        self.fixed_answers: dict[bytes, dict] = {}  # fake_fields: answers no time changes

    # -- plumbing ---------------------------------------------------------
    def __getattr__(self, name: str) -> _Symbol:
        impl = getattr(type(self), "_" + name, None)
        if impl is None or not name.startswith("nvml"):
            self.__dict__.setdefault("missing", set()).add(name)
            raise AttributeError(name)
        self.looked_up.add(name)
        return _Symbol(self, name, impl.__get__(self))

    def now(self) -> float:
        return self.clock()

    def elapsed(self) -> float:
        return self.clock() - self.start

    def release_hangs(self) -> None:
        """Wake any call blocked by a hang fault (used on shutdown)."""
        self._released.set()

    def may_fail(self, call: str) -> bool:
        """Whether some hang or error fault names this call (or every call)."""
        found = self._call_faults.get(call)
        if found is None:
            found = self._call_faults[call] = any(
                e.kind in ("hang", "error") and e.call in (None, call)
                for e in self.scenario.events)
        return found

    def fault_for(self, call: str, args: tuple) -> int | None:
        """The return code of an active fault for this call, after any injected hang."""
        if not self.scenario.events:
            return None
        gpu = self._gpu_of(args[0]) if args else None
        if gpu is None and args:  # a MIG device handle: its parent's faults apply
            gpu = self.mig_parent(args[0])
        t = self.elapsed()
        for number, event in enumerate(self.scenario.events):
            if not event.active(t) or not event.matches(call, gpu):
                continue
            if event.kind == "hang":
                with self._lock:
                    first = number not in self._hangs_done
                    self._hangs_done.add(number)
                if first:
                    self._released.wait(event.seconds)
            elif event.kind == "error" and (event.gpu is None or gpu == event.gpu):
                assert event.error is not None  # an error fault names its error
                return ERROR_CODES[event.error]
        return None

    def _gpu_of(self, handle) -> int | None:
        address = self.handles.address(handle, self.nvml.c_nvmlDevice_t)
        if address is None:
            if isinstance(handle, ctypes.c_uint):  # nvmlDeviceGetHandleByIndex_v2(index, ..)
                return handle.value if 0 <= handle.value < len(self.gpus) else None
            return None
        index = address - HANDLE_BASE
        return index if 0 <= index < len(self.gpus) else None

    def faults(self, kind: str, gpu: int, t: float, *, started: bool = False) -> list[FaultEvent]:
        """Faults of a kind on a GPU: active at t, or (started=True) begun by t."""
        events = self._faults_by_kind.get(kind)
        if not events:
            return []
        return [e for e in events if (e.gpu is None or e.gpu == gpu)
                and (t >= e.at if started else e.active(t))]

    def gpu(self, handle) -> FakeGpu | None:
        if self.initialized <= 0:
            return None
        known = self.handles.entries.get(id(handle))  # _gpu_of's answer for a known handle
        if known is not None and known[0] is handle and known[1] is self.nvml.c_nvmlDevice_t:
            index = known[2] - HANDLE_BASE
            return self.gpus[index] if 0 <= index < len(self.gpus) else None
        found = self._gpu_of(handle)
        return None if found is None else self.gpus[found]

    def device_call(self, handle, out, compute: Callable[..., object], *args) -> int:
        """Answer a getter: compute(gpu, *args) into `out`; None means NotSupported."""
        if self.initialized <= 0:
            return ERROR_UNINITIALIZED
        gpu = self.gpu(handle)
        if gpu is None:
            return ERROR_INVALID_ARGUMENT
        value = compute(gpu, *args)
        if value is None:
            return ERROR_NOT_SUPPORTED
        target(out).value = value
        return SUCCESS

    def answer(self, handle, out, key: str) -> int:
        """A getter whose answer is a catalogue value, in NVML's unit."""
        return self.device_call(handle, out, self.nvml_units, key)

    # -- library ----------------------------------------------------------
    def _nvmlInitWithFlags(self, flags) -> int:
        self.initialized += 1
        return SUCCESS

    def _nvmlInit_v2(self) -> int:
        return self._nvmlInitWithFlags(0)

    def _nvmlShutdown(self) -> int:
        if self.initialized <= 0:
            return ERROR_UNINITIALIZED
        self.initialized -= 1
        return SUCCESS

    def _nvmlErrorString(self, result) -> bytes:
        code = result.value if hasattr(result, "value") else int(result)
        names = {v: k for k, v in ERROR_CODES.items()}
        return names.get(code, f"Error {code}").encode()

    def string_call(self, buffer, size, text: str) -> int:
        if self.initialized <= 0:
            return ERROR_UNINITIALIZED
        data = text.encode()
        if len(data) + 1 > target(size).value:
            return pynvml.NVML_ERROR_INSUFFICIENT_SIZE
        buffer.value = data
        return SUCCESS

    def _nvmlSystemGetDriverVersion(self, buffer, size) -> int:
        return self.string_call(buffer, size, self.scenario.device.driver_version)

    def _nvmlSystemGetNVMLVersion(self, buffer, size) -> int:
        return self.string_call(buffer, size, self.scenario.device.nvml_version)

    def _nvmlDeviceGetCount_v2(self, count) -> int:
        if self.initialized <= 0:
            return ERROR_UNINITIALIZED
        target(count).value = len(self.gpus)
        return SUCCESS

    def _nvmlDeviceGetHandleByIndex_v2(self, index, device) -> int:
        if self.initialized <= 0:
            return ERROR_UNINITIALIZED
        i = target(index).value
        if not 0 <= i < len(self.gpus):
            return ERROR_INVALID_ARGUMENT
        self.handles.write(device, HANDLE_BASE + i)
        return SUCCESS


# -- installing under pynvml -------------------------------------------------------
_HOOKED_GLOBALS = ("nvmlLib", "_nvmlGetFunctionPointer_cache", "_nvmlLib_refcount",
                   "libLoadLock")


def check_hook(nvml: ModuleType = pynvml) -> None:
    """Fail loudly if this nvidia-ml-py no longer has the globals the fake replaces."""
    missing = [name for name in _HOOKED_GLOBALS if not hasattr(nvml, name)]
    cache = getattr(nvml, "_nvmlGetFunctionPointer_cache", None)
    if missing or not isinstance(cache, dict):
        raise FakeHookError(
            "this nvidia-ml-py release changed how it loads the driver library "
            f"(missing: {', '.join(missing) or '_nvmlGetFunctionPointer_cache as dict'}); "
            "the fake NVML cannot hook it: pin a tested release (see pyproject.toml)"
        )


def install(lib: FakeNvmlLibrary, nvml: ModuleType = pynvml) -> None:
    """Put the fake under pynvml (or a private copy of it). Refuses if a real driver
    library is already loaded there."""
    check_hook(nvml)
    with nvml.libLoadLock:
        current = nvml.nvmlLib
        if current is not None and not isinstance(current, FakeNvmlLibrary):
            raise RuntimeError("a real NVML library is already loaded; not replacing it")
        lib.nvml = nvml
        nvml.nvmlLib = lib  # type: ignore[attr-defined]  # (set before its first use)
        nvml._nvmlGetFunctionPointer_cache.clear()
        nvml._nvmlLib_refcount = 0  # type: ignore[attr-defined]


def uninstall(nvml: ModuleType = pynvml) -> None:
    """Remove the fake, leaving pynvml as if nothing had been loaded."""
    with nvml.libLoadLock:
        lib = nvml.nvmlLib
        if isinstance(lib, FakeNvmlLibrary):
            lib.release_hangs()
            nvml.nvmlLib = None  # type: ignore[attr-defined]
        nvml._nvmlGetFunctionPointer_cache.clear()
        nvml._nvmlLib_refcount = 0  # type: ignore[attr-defined]


@contextmanager
def installed(scenario: Scenario, clock: Callable[[], float] = time.time,
              costs: cost_model.CostModel | None = cost_model.H200):
    lib = FakeNvmlLibrary(scenario, clock, costs)
    install(lib)
    try:
        yield lib
    finally:
        uninstall()
