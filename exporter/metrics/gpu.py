"""GPU metric families from a Snapshot. Every GPU series has labels gpu and uuid.

The sweep's values are rendered from the catalogue (gpu/catalogue.py), each through the
family its entries declare; identity goes on `gpu_info` and the sampled power on
`gpu_power_watts`, declared here (why they are not catalogue entries: beside each).
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.metrics_core import Metric

from exporter.families import MINIMAL, Family
from exporter.gpu import catalogue
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

# docs/metrics.md "GPU (NVML)"; the catalogue's clock-event counter and memory errors
# are shown under "GPU health" (exporter/metrics/gpu_health.py), which renders the latter
# with the NVLink families
_ELSEWHERE = (catalogue.CLOCK_EVENT_DRIVER, *catalogue.MEMORY_ERRORS)
DECLARED: tuple[Family, ...] = (
    INFO, POWER, *(f for f in catalogue.DECLARED if f not in _ELSEWHERE))


def gpu_labels(snapshot: Snapshot) -> dict[int, list[str]]:
    """[gpu, uuid] of every GPU with an identity."""
    return {i.index: [str(i.index), i.uuid] for i in snapshot.identities if i is not None}


def gpu_families(snapshot: Snapshot) -> Iterator[Metric]:
    identities = {i.index: i for i in snapshot.identities if i is not None}
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

    for family in catalogue.FAMILIES:
        if family not in catalogue.MEMORY_ERRORS:
            yield catalogue_family(family, snapshot)


def _fabric_identity(snapshot: Snapshot, gpu: int) -> tuple[str, str]:
    """The NVLink fabric's clique id and cluster UUID once the GPU registered; empty on
    PCIe cards and before registration."""
    board = snapshot.board.get(gpu)
    fabric = board.fabric if board is not None else None
    if fabric is None or fabric.state != "completed":
        return "", ""
    return str(fabric.clique_id), fabric.cluster_uuid


def catalogue_family(declared: Family, snapshot: Snapshot) -> Metric:
    """A family from its catalogue entries (one series each per GPU, told apart by their
    label values where several entries share the family)."""
    identities = {i.index: i for i in snapshot.identities if i is not None}
    labels = gpu_labels(snapshot)
    values = catalogue.FAMILIES[declared]
    family = Rows.of(declared)
    rows = []
    for value in values:
        tail = value.labels
        if value.cadence == catalogue.ONCE:
            got = [(gpu, ident.values.get(value.key)) for gpu, ident in identities.items()]
        else:
            got = [(gpu, state.get(value.key)) for gpu, state in snapshot.states.items()]
        rows += [(gpu, tail, number) for gpu, number in got]
    for gpu, tail, number in sorted(rows, key=lambda r: (r[0], r[1])):
        if number is not None and gpu in labels:
            family.add((*labels[gpu], *tail), number)
    return family
