"""MIG: which GPUs are split into instances, each instance's identity and memory.

Per GPU, `nvmlDeviceGetMigMode`; on a GPU in MIG mode, each MIG device handle
(`nvmlDeviceGetMigDeviceHandleByIndex`, up to `nvmlDeviceGetMaxMigDeviceCount`) gives
its UUID (`MIG-...`, the device id the Kubernetes device plugin hands out), its GPU and
compute instance ids, its attributes and memory. The profile is named as NVIDIA's
device plugin names its `nvidia.com/mig-<profile>` resources, from the attributes: GPU
instance slices, and memory rounded up to whole GB (`3g.71gb`), with the compute slices
first when a compute instance is smaller than its GPU instance (`1c.3g.71gb`). Reading
the attributes needs no privilege, unlike the GPU-instance profile calls.

Cost: one ~5 us call per GPU when MIG is off; on a MIG GPU about five more per
instance, every collector interval (5 s).

What MIG does not give: power and energy are per GPU, not per instance, and NVML has no
per-process utilization in MIG mode. The profiling collector samples each GPU instance
(`nvmlGpmMigSampleGet`, taking the instances from :func:`read_mig_devices`) and splits
the GPU's energy between them by activity (exporter/collectors/profiling/mig.py); its
per-instance series carry ``gpu, uuid, gpu_instance`` as ``gpu_mig_memory_*`` do, so
they join ``gpu_mig_instance_info``. :func:`read_placements` gives each instance's
profile id and placement, by which NVIDIA's DRA driver names MIG devices.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from typing import Any

from exporter.sampling.collector_api import CollectorContext

__all__ = ["MAX_MIG_DEVICES", "MIG_SLICES", "MigDevice", "MigReading", "MigCollector",
           "Placement", "profile_name", "read_mig_devices", "read_placements"]

#: MIG device handles asked per GPU at most (7 on A100/H100/H200).
MAX_MIG_DEVICES = 16
#: Compute slices of a whole GPU in MIG mode (A100, H100, H200, B200: 7g is the whole).
MIG_SLICES = 7
_NA = (0xFFFFFFFF, 0xFFFFFFFFFFFFFFFF)


@dataclass(frozen=True)
class MigDevice:
    gpu: int  # the parent GPU's NVML index
    index: int  # the MIG device index on the parent
    mig_uuid: str
    gpu_instance: int
    compute_instance: int
    profile: str  # "" when NVML gave no attributes
    memory_total_bytes: float | None = None
    memory_used_bytes: float | None = None
    slices: int = 0  # GPU instance slices (of MIG_SLICES); 0 when NVML gave no attributes


@dataclass(frozen=True)
class MigReading:
    devices: tuple[MigDevice, ...]  # by GPU, then MIG device index
    mig_mode: dict[int, bool]  # GPU -> in MIG mode (GPUs that answered)

    def gpu_instances(self) -> list[tuple[int, int]]:
        """(GPU, GPU instance) pairs, once each: what per-instance GPM would sample."""
        return list(dict.fromkeys((d.gpu, d.gpu_instance) for d in self.devices))


def profile_name(gpu_slices: int, compute_slices: int, memory_mib: int) -> str:
    """The device plugin's name for a MIG profile: `3g.71gb`, or `1c.3g.71gb`."""
    gb = math.ceil(memory_mib / 1024)
    if compute_slices and compute_slices != gpu_slices:
        return f"{compute_slices}c.{gpu_slices}g.{gb}gb"
    return f"{gpu_slices}g.{gb}gb"


def _value(number: Any) -> float | None:
    return None if number is None or number in _NA else float(number)


def _mig_device(backend: Any, gpu: int, index: int, handle: Any) -> MigDevice | None:
    """One MIG device's identity and memory; None when its UUID or ids cannot be read.
    Calls on a MIG handle pass no `gpu`: the backend's NotSupported memory is per
    parent GPU and call, and a MIG device's answer must not stop the parent's reads."""
    mig_uuid = backend.call("nvmlDeviceGetUUID", handle)
    gi = backend.call("nvmlDeviceGetGpuInstanceId", handle)
    ci = backend.call("nvmlDeviceGetComputeInstanceId", handle)
    if not isinstance(mig_uuid, str) or gi is None or ci is None:
        return None
    attributes = backend.call("nvmlDeviceGetAttributes_v2", handle)
    profile = "" if attributes is None else profile_name(
        attributes.gpuInstanceSliceCount, attributes.computeInstanceSliceCount,
        attributes.memorySizeMB)
    slices = 0 if attributes is None else int(attributes.gpuInstanceSliceCount)
    memory = backend.call("nvmlDeviceGetMemoryInfo", handle)
    total = _value(memory.total) if memory is not None else None
    used = _value(memory.used) if memory is not None else None
    return MigDevice(gpu, index, mig_uuid, int(gi), int(ci), profile, total, used, slices)


def read_mig_devices(backend: Any, gpu: int) -> tuple[bool | None, list[MigDevice]]:
    """(whether the GPU is in MIG mode, None if it cannot say; its MIG devices)."""
    handle = backend.handle(gpu)
    if handle is None:
        return None, []
    mode = backend.call("nvmlDeviceGetMigMode", handle, gpu=gpu)
    if mode is None:
        return None, []
    if not mode[0]:
        return False, []
    count = backend.call("nvmlDeviceGetMaxMigDeviceCount", handle, gpu=gpu) or 0
    devices = []
    for index in range(min(int(count), MAX_MIG_DEVICES)):
        mig = backend.call("nvmlDeviceGetMigDeviceHandleByIndex", handle, index, gpu=gpu,
                           expected=("NotFound",))  # an empty slot
        if mig is None:
            continue
        device = _mig_device(backend, gpu, index, mig)
        if device is not None:
            devices.append(device)
    return True, devices


@dataclass(frozen=True)
class Placement:
    profile_id: int  # the GPU instance profile (NVML_GPU_INSTANCE_PROFILE_*'s id)
    start: int  # first memory slice
    size: int  # memory slices


def read_placements(backend: Any, gpu: int, gpu_instances: list[int]) -> dict[int, Placement]:
    """GPU instance -> its profile id and placement (`nvmlDeviceGetGpuInstanceById`,
    `nvmlGpuInstanceGetInfo`): what NVIDIA's DRA driver names its MIG devices by. Asked
    only when a DRA MIG device is to be matched; an instance NVML will not describe
    (NoPermission without the MIG capability) is left out and the failure counted."""
    handle = backend.handle(gpu)
    if handle is None:
        return {}
    out = {}
    for gi in gpu_instances:
        instance = backend.call("nvmlDeviceGetGpuInstanceById", handle, gi)
        info = None if instance is None else backend.call("nvmlGpuInstanceGetInfo", instance)
        if info is not None:
            out[gi] = Placement(int(info.profileId), int(info.placement.start),
                                int(info.placement.size))
    return out


class MigCollector:
    """Reads every readable GPU's MIG mode and devices."""

    name = "mig"

    def __init__(self, context: CollectorContext) -> None:
        self.context = context
        self._lock = threading.Lock()

    def read(self) -> MigReading:
        ctx = self.context
        devices: list[MigDevice] = []
        modes: dict[int, bool] = {}
        with self._lock:
            for gpu in range(ctx.gpu_count):
                if ctx.backend is None or not ctx.readable(gpu):
                    continue
                mode, found = read_mig_devices(ctx.backend, gpu)
                if mode is not None:
                    modes[gpu] = mode
                devices += found
        return MigReading(tuple(devices), modes)
