"""What the sweep reads from each GPU, as plain values keyed by the catalogue.

- read_identity: once at start (and when a lost GPU comes back): the labels of every
  GPU series, and the catalogue's static values.
- read_state: every sweep, the catalogue's values of the cadences that are due; values
  of the others are carried over from the previous state.
A value NVML cannot give is absent (the backend counted the error).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from exporter.gpu import catalogue
from exporter.gpu import fields as fi
from exporter.gpu.catalogue import Field, GpuValue

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
class GpuState:
    time: float  # seconds since the epoch
    values: Mapping[str, float] = field(default_factory=lambda: _EMPTY)  # key -> base units

    def get(self, key: str) -> float | None:
        return self.values.get(key)


def read_values(backend: NvmlBackend, gpu: int, entries: Iterable[GpuValue]
                ) -> dict[str, float]:
    """The entries' values: their fields in one batched call, each call made once."""
    entries = list(entries)
    handle = backend.handle(gpu)
    if handle is None:
        return {}
    field_ids = [e.source.id for e in entries if isinstance(e.source, Field)]
    readings = backend.fields(gpu, field_ids) if field_ids else {}
    answers: dict[tuple, Any] = {}
    out: dict[str, float] = {}
    for entry in entries:
        source = entry.source
        if isinstance(source, Field):
            raw = readings.get(source.id)
        else:
            key = (source.name, source.args)
            if key not in answers:
                answers[key] = backend.call(source.name, handle, *source.args, gpu=gpu)
            raw = answers[key]
            if raw is not None and isinstance(source.member, int):
                raw = raw[source.member]
            elif raw is not None and source.member is not None:
                raw = getattr(raw, source.member)
        if raw is not None and raw not in NOT_AVAILABLE:
            out[entry.key] = float(raw) * entry.scale
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


def read_state(backend: NvmlBackend, gpu: int, now: float, cadences: Iterable[str],
               previous: GpuState | None = None) -> GpuState | None:
    """The values of the due cadences, over the previous state's; None without a handle."""
    if backend.handle(gpu) is None:
        return None
    cadences = tuple(cadences)
    kept = previous.values.items() if previous is not None else ()
    values = {k: v for k, v in kept if catalogue.BY_KEY[k].cadence not in cadences}
    values.update(read_values(backend, gpu, catalogue.of_cadence(*cadences)))
    return GpuState(now, MappingProxyType(values))
