"""MIG reading -> `gpu_mig_enabled`, `gpu_mig_instance_info` and per-instance memory.

Series carry the parent GPU's `gpu` and `uuid` (so they join every GPU series) and the
`gpu_instance` id, the key `gpu_hpc_job_info` and `gpu_pod_info` also carry for MIG
devices. Memory belongs to the GPU instance (its compute instances share it), so it has
one series per GPU instance.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.metrics_core import Metric

from exporter.collectors.mig.reading import MigReading
from exporter.families import MINIMAL, Family
from exporter.sampling.snapshot import Snapshot

__all__ = ["DECLARED", "INSTANCE_LABELS", "mig_families"]

INSTANCE_LABELS = ("gpu", "uuid", "gpu_instance")  # a MIG GPU instance's series
_PRESENT = "(present only when a GPU is in MIG mode)"

ENABLED = Family(
    "gpu_mig_enabled", "gauge", "1 if the GPU is split into MIG instances "
    "(nvmlDeviceGetMigMode).", ("gpu", "uuid"), source="`nvmlDeviceGetMigMode`",
    doc="1 if the GPU is split into MIG instances (GPUs that cannot tell are left out).")
INSTANCE_INFO = Family(
    "gpu_mig_instance_info", "info",
    "A MIG device: its UUID (the device id Kubernetes hands out), GPU and compute instance, "
    "and profile as the device plugin names it; value 1.",
    ("gpu", "uuid", "mig_uuid", "gpu_instance", "compute_instance", "profile"),
    source="`nvmlDeviceGetMigDeviceHandleByIndex`, `GetUUID`, `GetGpuInstanceId`, "
           "`GetComputeInstanceId`, `GetAttributes`", profile=MINIMAL,
    doc=f"A MIG device; value 1 {_PRESENT}.")
MEMORY_USED = Family(
    "gpu_mig_memory_used_bytes", "gauge", "Device memory in use in the MIG GPU instance.",
    INSTANCE_LABELS, unit="bytes", source="`nvmlDeviceGetMemoryInfo` on the MIG device",
    doc=f"Device memory in use in the GPU instance {_PRESENT}.")
MEMORY_TOTAL = Family(
    "gpu_mig_memory_total_bytes", "gauge", "Device memory of the MIG GPU instance.",
    INSTANCE_LABELS, unit="bytes", source="`nvmlDeviceGetMemoryInfo` on the MIG device",
    doc=f"Device memory of the GPU instance {_PRESENT}.")

DECLARED = (ENABLED, INSTANCE_INFO, MEMORY_USED, MEMORY_TOTAL)


def mig_families(reading: MigReading, snapshot: Snapshot) -> Iterator[Metric]:
    uuids = {i.index: i.uuid for i in snapshot.identities if i is not None}
    enabled = ENABLED.gauge()
    for gpu, mode in sorted(reading.mig_mode.items()):
        if gpu in uuids:
            enabled.add_metric([str(gpu), uuids[gpu]], 1.0 if mode else 0.0)
    yield enabled
    info = INSTANCE_INFO.info(by=INSTANCE_INFO.labels)
    used, total = MEMORY_USED.gauge(), MEMORY_TOTAL.gauge()
    seen: set[tuple[int, int]] = set()
    for device in reading.devices:
        uuid = uuids.get(device.gpu)
        if uuid is None:
            continue
        gpu_label, gi = str(device.gpu), str(device.gpu_instance)
        info.add_metric([gpu_label, uuid, device.mig_uuid, gi, str(device.compute_instance),
                         device.profile], {})
        if (device.gpu, device.gpu_instance) in seen:
            continue  # a second compute instance of the same GPU instance
        seen.add((device.gpu, device.gpu_instance))
        if device.memory_used_bytes is not None:
            used.add_metric([gpu_label, uuid, gi], device.memory_used_bytes)
        if device.memory_total_bytes is not None:
            total.add_metric([gpu_label, uuid, gi], device.memory_total_bytes)
    for family in (info, used, total):
        if family.samples:
            yield family
