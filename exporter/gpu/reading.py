"""What the sweep reads from each GPU, as plain values keyed by the catalogue.

- read_identity: once at start (and when a lost GPU comes back): the labels of every
  GPU series, and the catalogue's static values.
- read_gpu: every sweep, the catalogue's values of the cadences that are due (a
  GpuReading); values of the others are carried over from the previous reading.
A value NVML cannot give is absent (the backend counted the error).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from exporter.gpu import catalogue
from exporter.gpu import fields as fi
from exporter.gpu.catalogue import Call, Field, GpuValue

if TYPE_CHECKING:  # reading needs the backend; the dataclasses (rendered) must not need NVML
    from exporter.gpu.backend import NvmlBackend

_EMPTY: Mapping[str, float] = MappingProxyType({})
# nvml.h's NVML_VALUE_NOT_AVAILABLE (-1) in an unsigned member: a value the driver lacks
NOT_AVAILABLE = (0xFFFFFFFF, 0xFFFFFFFFFFFFFFFF)


@dataclass(frozen=True)
class GpuIdentity:
    index: int
    uuid: str
    name: str
    pci_bus_id: str
    serial: str
    nvlinks: int = 0  # NVLinks the GPU has (field 91): the ones that should be active
    values: Mapping[str, float] = field(default_factory=lambda: _EMPTY)  # static values

    @property
    def default_power_limit_watts(self) -> float | None:
        return self.values.get("default_power_limit_watts")


@dataclass(frozen=True)
class GpuReading:
    time: float  # seconds since the epoch
    values: Mapping[str, float] = field(default_factory=lambda: _EMPTY)  # key -> base units

    def get(self, key: str) -> float | None:
        return self.values.get(key)


# What version 1 of nvmlDeviceGetMemoryInfo answers, from version 2's answer: the same total,
# and version 1's used, which counts what the driver reserves (nvml.h: "Sum of Reserved and
# Allocated"), as total - free: the one v2 call each sweep serves all four values. Version 1
# is asked only where version 2 answers nothing (a driver before it, or an error).
_MEMORY_V1 = ("nvmlDeviceGetMemoryInfo", ())
_MEMORY_V2 = ("nvmlDeviceGetMemoryInfo", (catalogue.MEMORY_INFO_V2,))


def _v1_used(memory: Any) -> int | None:
    total, free = memory.total, memory.free
    if total in NOT_AVAILABLE or free in NOT_AVAILABLE or free > total:
        return None
    return total - free


Member = str | int | Callable[[Any], Any] | None  # a struct member, a list index, derived
_V1_FROM_V2: dict[Member, Callable[[Any], Any]] = {
    "total": lambda memory: memory.total, "used": _v1_used}


@dataclass(frozen=True)
class _CallPlan:
    """One call and the entries it serves: (key, member of its answer, scale); `at`: its
    place in the plan's `specs`; `fallback` is asked instead when it answers nothing."""

    name: str
    args: tuple[int, ...]
    served: tuple[tuple[str, Member, float], ...]
    at: int = 0
    fallback: _CallPlan | None = None


@dataclass(frozen=True)
class _Plan:
    """How to read a set of entries: the fields for one batched call, and each call once
    with the entries it serves (worked out once per set, not every sweep)."""

    field_ids: tuple[int, ...]
    fields: tuple[tuple[str, int, float], ...]  # (key, field id, scale)
    calls: tuple[_CallPlan, ...]
    # (name, args) of each call and fallback, by `at`: the backend binds them once a GPU
    specs: tuple[tuple[str, tuple[int, ...]], ...] = ()


_PLANS: dict[int, tuple[tuple[GpuValue, ...], _Plan]] = {}  # by id() of the entries


def _plan(entries: tuple[GpuValue, ...]) -> _Plan:
    """The plan of a tuple of entries, kept by the tuple's identity: the sweep passes the
    same few (catalogue.of_cadence's), and hashing one costs more than a simple getter."""
    kept = _PLANS.get(id(entries))
    if kept is not None and kept[0] is entries:
        return kept[1]
    plan = _make_plan(entries)
    if len(_PLANS) >= 64:
        _PLANS.clear()
    _PLANS[id(entries)] = (entries, plan)  # holds the tuple, so its id is not reused
    return plan


def _make_plan(entries: tuple[GpuValue, ...]) -> _Plan:
    fields = tuple((e.key, e.nvml.id, e.scale) for e in entries
                   if isinstance(e.nvml, Field))
    calls: dict[tuple[str, tuple[int, ...]], list[tuple[str, Member, float]]] = {}
    for e in entries:
        if isinstance(e.nvml, Call):
            calls.setdefault((e.nvml.name, e.nvml.args), []).append(
                (e.key, e.nvml.member, e.scale))
    served = {call: tuple(keys) for call, keys in calls.items()}
    fallbacks: dict[tuple[str, tuple[int, ...]], tuple[str, tuple[int, ...]]] = {}
    v1, v2 = served.get(_MEMORY_V1), served.get(_MEMORY_V2)
    if v1 is not None and v2 is not None and all(m in _V1_FROM_V2 for _, m, _ in v1):
        served[_MEMORY_V2] = v2 + tuple((key, _V1_FROM_V2[member], scale)
                                        for key, member, scale in v1)
        fallbacks[_MEMORY_V2] = _MEMORY_V1
        del served[_MEMORY_V1]
    specs = (*served, *fallbacks.values())
    plans = []
    for call, keys in served.items():
        fallback = fallbacks.get(call)
        plans.append(_CallPlan(*call, keys, specs.index(call), None if fallback is None else
                               _CallPlan(*fallback, tuple(calls[fallback]),
                                         specs.index(fallback, len(served)))))
    return _Plan(tuple(f[1] for f in fields), fields, tuple(plans), specs)


def read_values(backend: NvmlBackend, gpu: int, entries: Iterable[GpuValue]
                ) -> dict[str, float]:
    """The entries' values: their fields in one batched call, each call made once (the
    memory-info calls: one, see _MEMORY_V1)."""
    handle = backend.handle(gpu)
    if handle is None:
        return {}
    plan = _plan(entries if isinstance(entries, tuple) else tuple(entries))
    out: dict[str, float] = {}
    if plan.field_ids:
        readings = backend.fields(gpu, plan.field_ids)
        for key, field_id, scale in plan.fields:
            raw = readings.get(field_id)
            if raw is not None and raw not in NOT_AVAILABLE:
                out[key] = float(raw) * scale
    bound = backend.bound_calls(gpu, plan.specs)
    for nvml_call in plan.calls:  # the member read inline: ~15 a GPU each sweep
        answer = bound[nvml_call.at](handle)
        if answer is None and nvml_call.fallback is not None:
            nvml_call = nvml_call.fallback
            answer = bound[nvml_call.at](handle)
        if answer is None:
            continue
        for key, member, scale in nvml_call.served:
            if member is None:
                raw = answer
            elif isinstance(member, str):
                raw = getattr(answer, member)
            else:
                raw = answer[member] if isinstance(member, int) else member(answer)
            if raw is not None and raw not in NOT_AVAILABLE:
                out[key] = float(raw) * scale
    return out


def read_identity(backend: NvmlBackend, gpu: int) -> GpuIdentity | None:
    handle = backend.handle(gpu)
    if handle is None:
        return None
    uuid = backend.call("nvmlDeviceGetUUID", handle, gpu=gpu)
    if uuid is None:
        return None  # without a UUID there is no stable identity to label series with
    pci = backend.call("nvmlDeviceGetPciInfo", handle, gpu=gpu)
    bus_id = pci.busId if pci is not None else ""
    if isinstance(bus_id, bytes):
        bus_id = bus_id.decode(errors="replace")
    links = backend.fields(gpu, [fi.NVLINK_LINK_COUNT]).get(fi.NVLINK_LINK_COUNT)
    return GpuIdentity(
        index=gpu,
        uuid=uuid,
        name=backend.call("nvmlDeviceGetName", handle, gpu=gpu) or "",
        pci_bus_id=bus_id,
        serial=backend.call("nvmlDeviceGetSerial", handle, gpu=gpu) or "",
        nvlinks=0 if links is None else int(links),
        values=MappingProxyType(read_values(backend, gpu, catalogue.of_cadence(
            catalogue.ONCE))),
    )


@functools.lru_cache(maxsize=32)
def _not_of(cadences: tuple[str, ...]) -> frozenset[str]:
    """The catalogue's keys of cadences other than these: what a reading carries over."""
    return frozenset(v.key for v in catalogue.CATALOGUE if v.cadence not in cadences)


def read_gpu(backend: NvmlBackend, gpu: int, now: float, cadences: Iterable[str],
             previous: GpuReading | None = None) -> GpuReading | None:
    """The values of the due cadences, over the previous reading's; None without a
    handle."""
    if backend.handle(gpu) is None:
        return None
    cadences = tuple(cadences)
    values: dict[str, float] = {}
    if previous is not None:
        carried = _not_of(cadences)
        values = {k: v for k, v in previous.values.items() if k in carried}
    values.update(read_values(backend, gpu, catalogue.of_cadence(*cadences)))
    return GpuReading(now, MappingProxyType(values))
