"""GPU metric families from a Snapshot. Every GPU series has labels gpu and uuid.

The sweep's values are rendered from the catalogue (gpu/catalogue.py), each through the
family its entries declare; identity goes on `gpu_info` and the sampled power on
`gpu_power_watts`, declared here (why they are not catalogue entries: beside each).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from prometheus_client.metrics_core import Metric

from exporter.families import MINIMAL, Family
from exporter.gpu import catalogue
from exporter.gpu.reading import GpuIdentity
from exporter.metrics.exposition import Rows
from exporter.sampling.snapshot import Snapshot

GPU_LABELS = list(catalogue.GPU)

# Not a catalogue entry: its labels are several NVML calls' answers (and the fabric's
# registration from the board read), read once per identity, not a number of the sweep.
INFO = catalogue.per_gpu(
    "gpu_info", "info", "GPU identity; value 1.", "name", "pci_bus_id", "serial",
    "driver_version", "nvml_version", "fabric_clique_id", "fabric_cluster_uuid",
    source="`nvmlDeviceGetName`, `GetPciInfo`, `GetSerial`, `nvmlSystemGetDriverVersion`, "
           "`GetNVMLVersion`, `nvmlDeviceGetGpuFabricInfoV`", profile=MINIMAL,
    doc="GPU identity; value 1. Join on `uuid` to add names to other series. The fabric "
        "labels are the NVLink fabric's clique id and cluster UUID once the GPU registered "
        "(NVSwitch systems), empty on PCIe cards.")
# Not a catalogue entry: the power loop drains it from the driver's sample buffer (or
# polls the instant field) at the sensor's rate, apart from the sweep (gpu/power_reader.py).
POWER = catalogue.per_gpu(
    "gpu_power_watts", "gauge", "Instant power: the latest sample of the driver's "
    "power-sample buffer (or of the polled instant field).", unit="W", profile=MINIMAL,
    source="`nvmlDeviceGetSamples(NVML_TOTAL_POWER_SAMPLES)` (or field "
           "`NVML_FI_DEV_POWER_INSTANT`, 186)",
    doc="Instant power: the GPU's latest power sample. Not the 1 s average.")

# The catalogue's families rendered with the hardware families (exporter/metrics/
# gpu_hardware.py, cached with the NVLink families) and shown under "GPU hardware" in
# docs/metrics.md; the others are rendered here, in catalogue order, and shown under
# "GPU (NVML)".
WITH_HARDWARE: tuple[Family, ...] = catalogue.MEMORY_ERRORS
_RENDERED_HERE = tuple(f for f in catalogue.DECLARED if f not in WITH_HARDWARE)
DECLARED: tuple[Family, ...] = (INFO, POWER, *_RENDERED_HERE)


def gpu_labels(snapshot: Snapshot) -> dict[int, list[str]]:
    """[gpu, uuid] of every GPU with an identity."""
    return {i.index: [str(i.index), i.uuid] for i in snapshot.identities if i is not None}


def identified(snapshot: Snapshot) -> dict[int, GpuIdentity]:
    """Every GPU with an identity, by index."""
    return {i.index: i for i in snapshot.identities if i is not None}


def gpu_families(snapshot: Snapshot) -> Iterator[Metric]:
    identities = identified(snapshot)
    labels = gpu_labels(snapshot)

    info = INFO.info(by=catalogue.GPU)
    for gpu, ident in sorted(identities.items()):
        clique, cluster = _fabric_identity(snapshot, gpu)
        info.add_metric(labels[gpu], {
            "name": ident.name, "pci_bus_id": ident.pci_bus_id, "serial": ident.serial,
            "driver_version": snapshot.driver_version, "nvml_version": snapshot.nvml_version,
            "fabric_clique_id": clique, "fabric_cluster_uuid": cluster})
    yield info

    power = POWER.gauge()
    for gpu, sample in sorted(snapshot.power.items()):
        if gpu in labels:
            power.add_metric(labels[gpu], sample.watts)
    yield power

    for family in _RENDERED_HERE:
        yield catalogue_family(family, snapshot, identities, labels)


def _fabric_identity(snapshot: Snapshot, gpu: int) -> tuple[str, str]:
    """The NVLink fabric's clique id and cluster UUID once the GPU registered; empty on
    PCIe cards and before registration."""
    board = snapshot.board.get(gpu)
    fabric = board.fabric if board is not None else None
    if fabric is None or fabric.state != "completed":
        return "", ""
    return str(fabric.clique_id), fabric.cluster_uuid


def catalogue_family(declared: Family, snapshot: Snapshot,
                     identities: Mapping[int, GpuIdentity],
                     labels: Mapping[int, list[str]]) -> Metric:
    """A family from its catalogue entries (one series each per GPU, told apart by their
    label values where several entries share the family). `identities` and `labels`: the
    snapshot's (identified, gpu_labels), worked out once for all its families."""
    values = catalogue.FAMILIES[declared]
    family = Rows.of(declared)
    rows = []
    for value in values:
        tail = value.labels
        if value.cadence == catalogue.ONCE:
            got = [(gpu, ident.values.get(value.key)) for gpu, ident in identities.items()]
        else:
            got = [(gpu, reading.get(value.key)) for gpu, reading in snapshot.readings.items()]
        rows += [(gpu, tail, number) for gpu, number in got]
    for gpu, tail, number in sorted(rows, key=lambda r: (r[0], r[1])):
        if number is not None and gpu in labels:
            family.add((*labels[gpu], *tail), number)
    return family
