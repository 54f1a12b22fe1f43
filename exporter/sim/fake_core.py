"""What the fake library's symbol groups share: the state and plumbing that
FakeNvmlLibrary (fake.py) sets and defines, declared here so that each group
(fake_device, fake_fields, fake_gpm, fake_model, fake_tenants) names what it relies on
and a type checker can follow it."""

from __future__ import annotations

import threading
from collections.abc import Callable
from types import ModuleType

from exporter.sim import costs as cost_model
from exporter.sim.cstructs import HandleAddresses
from exporter.sim.physics import FakeGpu
from exporter.sim.scenarios import FaultEvent, Scenario
from exporter.sim.tenants import MigInstanceSpec


class FakeCore:
    """Declarations only: FakeNvmlLibrary or one of the groups defines each."""

    nvml: ModuleType
    handles: HandleAddresses
    scenario: Scenario
    clock: Callable[[], float]
    costs: cost_model.CostModel | None
    pending_cost: cost_model.Cost | None
    start: float
    gpus: list[FakeGpu]
    initialized: int
    fault_kinds: frozenset[str]
    fixed_answers: dict[bytes, dict]
    _lock: threading.Lock
    _released: threading.Event
    _event_sets: dict[int, dict]
    _next_set: int

    # fake.py
    def now(self) -> float:
        raise NotImplementedError

    def elapsed(self) -> float:
        raise NotImplementedError

    def faults(self, kind: str, gpu: int, t: float, *, started: bool = False
               ) -> list[FaultEvent]:
        raise NotImplementedError

    def gpu(self, handle: object) -> FakeGpu | None:
        raise NotImplementedError

    def device_call(self, handle: object, out: object, compute: Callable[..., object],
                    *args: object) -> int:
        raise NotImplementedError

    def answer(self, handle: object, out: object, key: str) -> int:
        raise NotImplementedError

    def string_call(self, buffer: object, size: object, text: str) -> int:
        raise NotImplementedError

    # fake_model.py
    def model(self, gpu: FakeGpu, key: str, t: float | None = None) -> float | None:
        raise NotImplementedError

    def nvml_units(self, gpu: FakeGpu, key: str) -> int | None:
        raise NotImplementedError

    # fake_tenants.py
    def mig_instances(self, gpu: int) -> tuple[MigInstanceSpec, ...]:
        raise NotImplementedError

    def mig_uuid_of(self, handle: object) -> str | None:
        raise NotImplementedError

    def mig_memory(self, handle: object) -> tuple[int, int] | None:
        raise NotImplementedError

    def running(self, gpu: int, t0: float | None = None, t1: float | None = None) -> list:
        raise NotImplementedError
