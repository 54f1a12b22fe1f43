"""The fake's answers about who uses a GPU: its compute processes, their SM utilization
samples, and MIG (GPUs split into instances, each a device handle of its own).

As on the hardware:
- `nvmlDeviceGetComputeRunningProcesses_v3` lists the processes alive now with their
  device memory, and on a MIG GPU the GPU and compute instance each runs in (asked on
  a MIG device handle: only that instance's processes);
- `nvmlDeviceGetProcessUtilization(lastSeen)` gives one sample per process that ran
  since `lastSeen` (microseconds), its SM utilization averaged over that span, stamped
  now; NotFound when none ran; NotSupported in MIG mode (as NVML answers there);
- MIG device handles answer their own UUID (`MIG-...`), GPU and compute instance ids,
  attributes (slices, memory: the device plugin's profile name comes from them) and
  memory; the parent's utilization rates are NotSupported in MIG mode;
- `nvmlDeviceGetGpuInstanceById` and `nvmlGpuInstanceGetInfo` give each GPU instance's
  profile id and placement (H100/H200 profile ids; instances placed in the order the
  scenario lists them, each at the next start aligned to its size), which NVIDIA's DRA
  driver names its MIG devices by.
"""

from __future__ import annotations

from exporter.sim.cstructs import target, value_of
from exporter.sim.fake_core import FakeCore
from exporter.sim.physics import HANDLE_BASE, FakeGpu
from exporter.sim.tenants import MigInstanceSpec, mig_uuid, processes_at

SUCCESS, ERROR_UNINITIALIZED, ERROR_INVALID_ARGUMENT, ERROR_NOT_SUPPORTED = 0, 1, 2, 3
ERROR_NOT_FOUND, ERROR_INSUFFICIENT_SIZE = 6, 7
MIG_HANDLE_BASE = 0x7E59_0000  # MIG device handles: this + 8 * GPU index + MIG device index
MIG_SLOTS = 8
GI_HANDLE_BASE = 0x7E5B_0000  # GPU instance handles: this + 64 * GPU index + GPU instance id
# H100/H200 GPU instance profile ids and placement sizes (memory slices), by compute slices
PROFILE_IDS = {1: 19, 2: 14, 3: 9, 4: 5, 7: 0}
PLACEMENT_SIZES = {1: 1, 2: 2, 3: 4, 4: 4, 7: 8}
NO_INSTANCE = 0xFFFFFFFF  # the instance ids of a process on a GPU not in MIG mode
SMS_PER_SLICE = 16  # H100/H200: 132 SMs, 16 per compute slice
MIB = 1024 * 1024
INSTANCE_BASE_MEMORY = 512 * MIB  # a MIG instance's context memory with no process


class TenantSymbols(FakeCore):
    """Mixin of FakeNvmlLibrary (which provides scenario, gpus, gpu(), now(), elapsed())."""

    # -- MIG layout ---------------------------------------------------------------------
    def mig_instances(self, gpu: int) -> tuple[MigInstanceSpec, ...]:
        """The GPU's MIG instances in MIG device index order; () when not in MIG mode."""
        for spec in self.scenario.mig:
            if gpu in spec.gpus:
                return spec.instances
        return ()

    def mig_device(self, handle) -> tuple[FakeGpu, int, MigInstanceSpec] | None:
        """(parent GPU, MIG device index, instance) behind a MIG device handle."""
        if self.initialized <= 0:
            return None
        address = self.handles.address(handle, self.nvml.c_nvmlDevice_t)
        if address is None:
            return None
        address -= MIG_HANDLE_BASE
        gpu, slot = divmod(address, MIG_SLOTS)
        if address < 0 or not 0 <= gpu < len(self.gpus):
            return None
        instances = self.mig_instances(gpu)
        return (self.gpus[gpu], slot, instances[slot]) if slot < len(instances) else None

    def mig_parent(self, handle) -> int | None:
        found = self.mig_device(handle)
        return None if found is None else found[0].index

    def _mig_call(self, handle, out, compute) -> int:
        """A getter on a MIG device handle: compute(parent, instance) into `out`."""
        if self.initialized <= 0:
            return ERROR_UNINITIALIZED
        found = self.mig_device(handle)
        if found is None:
            return ERROR_NOT_SUPPORTED if self.gpu(handle) is not None else (
                ERROR_INVALID_ARGUMENT)
        target(out).value = compute(found[0], found[2])
        return SUCCESS

    def _nvmlDeviceGetMigMode(self, handle, current, pending) -> int:
        gpu = self.gpu(handle)
        if gpu is None:
            return ERROR_UNINITIALIZED if self.initialized <= 0 else ERROR_INVALID_ARGUMENT
        mode = 1 if self.mig_instances(gpu.index) else 0
        target(current).value = target(pending).value = mode
        return SUCCESS

    def _nvmlDeviceGetMaxMigDeviceCount(self, handle, count) -> int:
        return self.device_call(handle, count,
                                lambda g: 7 if self.mig_instances(g.index) else 0)

    def _nvmlDeviceGetMigDeviceHandleByIndex(self, handle, index, mig) -> int:
        gpu = self.gpu(handle)
        if gpu is None:
            return ERROR_UNINITIALIZED if self.initialized <= 0 else ERROR_INVALID_ARGUMENT
        instances, slot = self.mig_instances(gpu.index), value_of(index)
        if not instances:
            return ERROR_NOT_SUPPORTED
        if not 0 <= slot < 7:
            return ERROR_INVALID_ARGUMENT
        if slot >= len(instances):
            return ERROR_NOT_FOUND
        self.handles.write(mig, MIG_HANDLE_BASE + MIG_SLOTS * gpu.index + slot)
        return SUCCESS

    def _nvmlDeviceIsMigDeviceHandle(self, handle, is_mig) -> int:
        if self.initialized <= 0:
            return ERROR_UNINITIALIZED
        if self.mig_device(handle) is None and self.gpu(handle) is None:
            return ERROR_INVALID_ARGUMENT
        target(is_mig).value = 1 if self.mig_device(handle) is not None else 0
        return SUCCESS

    def _nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, handle, device) -> int:
        found = self.mig_device(handle)
        if found is None:
            return ERROR_UNINITIALIZED if self.initialized <= 0 else ERROR_INVALID_ARGUMENT
        self.handles.write(device, HANDLE_BASE + found[0].index)
        return SUCCESS

    def _nvmlDeviceGetGpuInstanceId(self, handle, out) -> int:
        return self._mig_call(handle, out, lambda g, i: i.gpu_instance)

    def _nvmlDeviceGetComputeInstanceId(self, handle, out) -> int:
        return self._mig_call(handle, out, lambda g, i: i.compute_instance)

    def _nvmlDeviceGetAttributes_v2(self, handle, attributes) -> int:
        found = self.mig_device(handle)
        if found is None:  # the whole GPU: all 7 slices
            gpu = self.gpu(handle)
            if gpu is None:
                return ERROR_UNINITIALIZED if self.initialized <= 0 else ERROR_INVALID_ARGUMENT
            slices, compute = 7, 7
            memory = self.scenario.device.memory_total_bytes // MIB
        else:
            instance = found[2]
            slices = instance.slices
            compute = instance.compute_slices or instance.slices
            memory = instance.memory_mib
        out = target(attributes)
        out.multiprocessorCount = SMS_PER_SLICE * compute + (4 if compute == 7 else 0)
        out.sharedCopyEngineCount = out.sharedDecoderCount = slices
        out.sharedEncoderCount = out.sharedJpegCount = out.sharedOfaCount = 0
        out.gpuInstanceSliceCount, out.computeInstanceSliceCount = slices, compute
        out.memorySizeMB = memory
        return SUCCESS

    def mig_placements(self, gpu: int) -> dict[int, tuple[int, int, int]]:
        """GPU instance -> (profile id, placement start, placement size)."""
        out, start = {}, 0
        for instance in self.mig_instances(gpu):
            size = PLACEMENT_SIZES.get(instance.slices, instance.slices)
            start = -(-start // size) * size  # aligned to its size, as NVML places them
            out[instance.gpu_instance] = (PROFILE_IDS.get(instance.slices, 0), start, size)
            start += size
        return out

    def _nvmlDeviceGetGpuInstanceById(self, handle, gpu_instance, out) -> int:
        gpu = self.gpu(handle)
        if gpu is None:
            return ERROR_UNINITIALIZED if self.initialized <= 0 else ERROR_INVALID_ARGUMENT
        if not self.mig_instances(gpu.index):
            return ERROR_NOT_SUPPORTED
        gi = value_of(gpu_instance)
        if gi not in self.mig_placements(gpu.index):
            return ERROR_NOT_FOUND
        self.handles.write(out, GI_HANDLE_BASE + 64 * gpu.index + gi)
        return SUCCESS

    def _nvmlGpuInstanceGetInfo(self, gpu_instance, info) -> int:
        if self.initialized <= 0:
            return ERROR_UNINITIALIZED
        address = self.handles.address(gpu_instance, self.nvml.c_nvmlGpuInstance_t)
        if address is None or address < GI_HANDLE_BASE:
            return ERROR_INVALID_ARGUMENT
        gpu, gi = divmod(address - GI_HANDLE_BASE, 64)
        placements = self.mig_placements(gpu) if gpu < len(self.gpus) else {}
        if gi not in placements:
            return ERROR_INVALID_ARGUMENT
        out = target(info)
        out.id = gi
        out.profileId, out.placement.start, out.placement.size = placements[gi]
        return SUCCESS

    def mig_uuid_of(self, handle) -> str | None:
        found = self.mig_device(handle)
        return None if found is None else mig_uuid(self.scenario.seed, found[0].index,
                                                   found[2])

    def mig_memory(self, handle) -> tuple[int, int] | None:
        """(total, used) bytes of the MIG instance behind a handle."""
        found = self.mig_device(handle)
        if found is None:
            return None
        gpu, _, instance = found
        total = instance.memory_mib * MIB
        used = INSTANCE_BASE_MEMORY + sum(p.memory_bytes for p in self.running(gpu.index)
                                          if p.gpu_instance == instance.gpu_instance)
        return total, min(total, used)

    # -- processes ------------------------------------------------------------------------
    def running(self, gpu: int, t0: float | None = None, t1: float | None = None) -> list:
        """The GPU's processes alive now, or at some time in (t0, t1] (epoch seconds)."""
        now = self.elapsed()
        a = now if t0 is None else t0 - self.start
        b = now if t1 is None else t1 - self.start
        found = processes_at(self.scenario.process_specs(), a, b)
        if t0 is None:
            return [p for p in found if p.gpu == gpu and p.alive(now)]
        return [p for p in found if p.gpu == gpu and p.overlap(a, b) > 0]

    def _nvmlDeviceGetComputeRunningProcesses_v3(self, handle, count, procs) -> int:
        found = self.mig_device(handle)
        if found is not None:
            gpu, instance = found[0], found[2]
            listed = [p for p in self.running(gpu.index)
                      if p.gpu_instance == instance.gpu_instance]
        else:
            whole = self.gpu(handle)
            if whole is None:
                return ERROR_UNINITIALIZED if self.initialized <= 0 else ERROR_INVALID_ARGUMENT
            gpu = whole
            listed = self.running(gpu.index)
        size = target(count)
        if procs is None or size.value < len(listed):
            size.value = len(listed)
            return SUCCESS if not listed else ERROR_INSUFFICIENT_SIZE
        cis = {i.gpu_instance: i.compute_instance for i in self.mig_instances(gpu.index)}
        for i, process in enumerate(listed):
            entry = procs[i]
            entry.pid, entry.usedGpuMemory = process.pid, process.memory_bytes
            gi = process.gpu_instance
            entry.gpuInstanceId = NO_INSTANCE if gi is None else gi
            entry.computeInstanceId = NO_INSTANCE if gi is None else cis.get(gi, 0)
        size.value = len(listed)
        return SUCCESS

    def _nvmlDeviceGetProcessUtilization(self, handle, samples, count, last_seen) -> int:
        gpu = self.gpu(handle)
        if gpu is None:
            if self.mig_device(handle) is not None:
                return ERROR_NOT_SUPPORTED
            return ERROR_UNINITIALIZED if self.initialized <= 0 else ERROR_INVALID_ARGUMENT
        if self.mig_instances(gpu.index):
            return ERROR_NOT_SUPPORTED  # NVML has no per-process utilization in MIG mode
        now = self.now()
        since = max(value_of(last_seen) / 1e6, self.start)
        span = now - since
        listed = self.running(gpu.index, since, now) if span > 0 else []
        if not listed:
            return ERROR_NOT_FOUND
        size = target(count)
        if samples is None:
            size.value = len(listed)
            return ERROR_INSUFFICIENT_SIZE
        stamp = int(now * 1e6)
        a, b = since - self.start, now - self.start
        for i, process in enumerate(listed[:size.value]):
            entry = samples[i]
            share = process.overlap(a, b) / span
            entry.pid, entry.timeStamp = process.pid, stamp
            entry.smUtil = round(100 * process.sm_util * share)
            entry.memUtil = round(45 * process.sm_util * share)
            entry.encUtil = entry.decUtil = 0
        size.value = min(size.value, len(listed))
        return SUCCESS
