"""GPU metric families from a Snapshot. Every GPU series has labels gpu and uuid.

The sweep's values are rendered from the catalogue (gpu/catalogue.py): one family per
catalogue entry that names a metric; identity goes on `gpu_info`.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily, InfoMetricFamily
from prometheus_client.metrics_core import Metric

from exporter.gpu import catalogue
from exporter.metrics.exposition import Rows
from exporter.sampling.snapshot import Snapshot

GPU_LABELS = ["gpu", "uuid"]


def gpu_labels(snapshot: Snapshot) -> dict[int, list[str]]:
    """[gpu, uuid] of every GPU with an identity."""
    return {i.index: [str(i.index), i.uuid] for i in snapshot.identities if i is not None}


def gpu_families(snapshot: Snapshot) -> Iterator[Metric]:
    identities = {i.index: i for i in snapshot.identities if i is not None}
    labels = gpu_labels(snapshot)

    info = InfoMetricFamily("gpu", "GPU identity; value 1.", labels=[
        *GPU_LABELS, "name", "pci_bus_id", "serial", "driver_version", "nvml_version",
        "fabric_clique_id", "fabric_cluster_uuid"])
    for gpu, ident in sorted(identities.items()):
        clique, cluster = _fabric_identity(snapshot, gpu)
        info.add_metric(labels[gpu], {
            "name": ident.name, "pci_bus_id": ident.pci_bus_id, "serial": ident.serial,
            "driver_version": snapshot.driver_version, "nvml_version": snapshot.nvml_version,
            "fabric_clique_id": clique, "fabric_cluster_uuid": cluster})
    yield info

    power = GaugeMetricFamily("gpu_power_watts", "Instant power: the latest sample of the "
                              "driver's power-sample buffer (or of the polled instant "
                              "field).", labels=GPU_LABELS)
    for gpu, sample in sorted(snapshot.power.items()):
        if gpu in labels:
            power.add_metric(labels[gpu], sample.watts)
    yield power

    for name, values in catalogue.FAMILIES.items():
        yield _catalogue_family(name, values, identities, snapshot, labels)


def _fabric_identity(snapshot: Snapshot, gpu: int) -> tuple[str, str]:
    """The NVLink fabric's clique id and cluster UUID once the GPU registered; empty on
    PCIe cards and before registration."""
    board = snapshot.board.get(gpu)
    fabric = board.fabric if board is not None else None
    if fabric is None or fabric.state != "completed":
        return "", ""
    return str(fabric.clique_id), fabric.cluster_uuid


def _catalogue_family(name: str, values: tuple[catalogue.GpuValue, ...], identities: dict,
                      snapshot: Snapshot, labels: dict[int, list[str]]) -> Metric:
    """One family from its catalogue entries (one series each per GPU, told apart by their
    `label` where several entries share the family)."""
    first = values[0]
    extra = [first.label[0]] if first.label is not None else []
    family = Rows(name, first.help, first.kind, [*GPU_LABELS, *extra])
    rows = []
    for value in values:
        tail = (value.label[1],) if value.label is not None else ()
        if value.cadence == catalogue.ONCE:
            got = [(gpu, ident.values.get(value.key)) for gpu, ident in identities.items()]
        else:
            got = [(gpu, state.get(value.key)) for gpu, state in snapshot.states.items()]
        rows += [(gpu, tail, number) for gpu, number in got]
    for gpu, tail, number in sorted(rows, key=lambda r: (r[0], r[1])):
        if number is not None and gpu in labels:
            family.add((*labels[gpu], *tail), number)
    return family
