"""What the sampler asks of a collector (its plug-ins): the protocol, the context it is
built with, and the typed hooks a reading may offer to the live analyses.

Collectors depend on this module; the sampler never imports a collector.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:  # the type only: collectors' specs load without pynvml
    from exporter.gpu.backend import NvmlBackend
    from exporter.gpu.reading import GpuIdentity

#: GPU -> ((end of a profiling interval, compute share), ...), oldest first
ComputeShares = Mapping[int, tuple[tuple[float, float], ...]]


class Collector(Protocol):
    """A running collector: `read()` returns a plain reading, or raises on failure."""

    name: str

    def read(self) -> object: ...


def _no_identities() -> list[GpuIdentity | None]:
    return []


@dataclass(frozen=True)
class CollectorContext:
    """What a collector may use besides its config: the node's GPUs and their NVML
    backend (None on a node without NVML), for collectors that read per GPU."""

    gpu_count: int = 0
    backend: NvmlBackend | None = None
    identities: Callable[[], list[GpuIdentity | None]] = _no_identities  # by GPU index
    readable: Callable[[int], bool] = lambda gpu: True  # not lost, not hung
    energy_joules: Callable[[int], float | None] = lambda gpu: None  # sampled, per GPU
    clock: Callable[[], float] = time.time  # the sampler's clock (simulated in tests)
    simulated: bool = False  # a fake or replayed node: its PIDs and devices are made up


class JobGrouping(ABC):
    """A reading that knows which job (or pod) holds each GPU: stragglers are then
    compared with the peers in their own job."""

    @abstractmethod
    def gpu_groups(self) -> dict[int, str]:
        """GPU index -> its job's name, for the GPUs a job holds."""


class JobHolders(ABC):
    """A reading that knows every job holding each GPU (the live page names them)."""

    @abstractmethod
    def jobs_by_gpu(self) -> Mapping[int, tuple[str, ...]]:
        """GPU index -> the ids of the jobs holding it."""


class HoldsResources(ABC):
    """A collector that holds something to give back (NVML GPM buffers, a gRPC channel):
    the sampler calls close() once its loop has stopped."""

    @abstractmethod
    def close(self) -> None:
        """Free what the collector holds."""


class RankSource(ABC):
    """A reading that knows the global rank working on GPUs (the goodput account uses it
    to find a job's rank 0)."""

    @abstractmethod
    def gpu_ranks(self) -> Mapping[int, int]:
        """GPU index -> the global rank of the process that holds it, where known."""


class ComputeShareSource(ABC):
    """A reading with each GPU's recent compute share (the straggler analysis uses it)."""

    @abstractmethod
    def compute_shares(self) -> ComputeShares:
        """GPU -> its recent (time, compute share), oldest first."""
