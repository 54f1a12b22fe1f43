"""GPU metric families from a Snapshot. Every GPU series has labels gpu and uuid.

The sweep's values are rendered from the catalogue (gpu/catalogue.py): one family per
catalogue entry that names a metric; identity goes on `gpu_info`.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily
from prometheus_client.metrics_core import Metric

from exporter.gpu import catalogue
from exporter.sampling.snapshot import Snapshot

GPU_LABELS = ["gpu", "uuid"]


def gpu_labels(snapshot: Snapshot) -> dict[int, list[str]]:
    """[gpu, uuid] of every GPU with an identity."""
    return {i.index: [str(i.index), i.uuid] for i in snapshot.identities if i is not None}


def gpu_families(snapshot: Snapshot) -> Iterator[Metric]:
    identities = {i.index: i for i in snapshot.identities if i is not None}
    labels = gpu_labels(snapshot)

    info = InfoMetricFamily("gpu", "GPU identity; value 1.", labels=[
        *GPU_LABELS, "name", "pci_bus_id", "serial", "driver_version", "nvml_version"])
    for gpu, ident in sorted(identities.items()):
        info.add_metric(labels[gpu], {
            "name": ident.name, "pci_bus_id": ident.pci_bus_id, "serial": ident.serial,
            "driver_version": snapshot.driver_version, "nvml_version": snapshot.nvml_version})
    yield info

    power = GaugeMetricFamily("gpu_power_watts", "Instant power: the latest sample of the "
                              "driver's power-sample buffer (or of the polled instant "
                              "field).", labels=GPU_LABELS)
    for gpu, sample in sorted(snapshot.power.items()):
        if gpu in labels:
            power.add_metric(labels[gpu], sample.watts)
    yield power

    for value in catalogue.CATALOGUE:
        if value.metric is None:
            continue
        cls = CounterMetricFamily if value.kind == "counter" else GaugeMetricFamily
        family = cls(value.metric, value.help, labels=GPU_LABELS)
        if value.cadence == catalogue.ONCE:
            rows = [(gpu, ident.values.get(value.key)) for gpu, ident in identities.items()]
        else:
            rows = [(gpu, state.get(value.key)) for gpu, state in snapshot.states.items()]
        for gpu, number in sorted(rows):
            if number is not None and gpu in labels:
                family.add_metric(labels[gpu], number)
        yield family
