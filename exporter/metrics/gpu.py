"""GPU metric families from a Snapshot. Every GPU series has labels gpu and uuid."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily
from prometheus_client.metrics_core import Metric

from exporter.sampling.sampler import Snapshot

GPU_LABELS = ["gpu", "uuid"]

# (metric name, help, GpuState attribute, kind) for the sweep's values.
STATE_METRICS: tuple[tuple[str, str, str, str], ...] = (
    ("gpu_utilization_ratio", "Share of time a kernel was running (0-1).",
     "utilization_gpu_ratio", "gauge"),
    ("gpu_memory_utilization_ratio", "Share of time device memory was read or written (0-1).",
     "utilization_memory_ratio", "gauge"),
    ("gpu_memory_used_bytes", "Device memory in use.", "memory_used_bytes", "gauge"),
    ("gpu_memory_total_bytes", "Device memory in total.", "memory_total_bytes", "gauge"),
    ("gpu_power_average_watts", "Power averaged by the driver over about 1 s.",
     "power_average_watts", "gauge"),
    ("gpu_power_limit_watts", "Enforced power limit.", "power_limit_watts", "gauge"),
    ("gpu_temperature_celsius", "GPU core temperature.", "temperature_celsius", "gauge"),
    ("gpu_memory_temperature_celsius", "HBM temperature.", "memory_temperature_celsius",
     "gauge"),
    ("gpu_sm_clock_hertz", "Current SM clock.", "sm_clock_hertz", "gauge"),
    ("gpu_memory_clock_hertz", "Current memory clock.", "memory_clock_hertz", "gauge"),
    ("gpu_performance_state", "Performance state (0 = P0, fastest; 15 = P15).",
     "performance_state", "gauge"),
    ("gpu_fan_speed_ratio", "Fan speed as a share of its maximum (0-1).", "fan_speed_ratio",
     "gauge"),
    ("gpu_pcie_transmit_bytes", "Bytes the GPU sent over PCIe.", "pcie_transmit_bytes",
     "counter"),
    ("gpu_pcie_receive_bytes", "Bytes the GPU received over PCIe.", "pcie_receive_bytes",
     "counter"),
    ("gpu_pcie_replays", "PCIe replays (link-level retransmissions).", "pcie_replays",
     "counter"),
    ("gpu_pcie_link_generation", "Current PCIe link generation.", "pcie_generation", "gauge"),
    ("gpu_pcie_link_width", "Current PCIe link width (lanes).", "pcie_width", "gauge"),
)


def gpu_families(snapshot: Snapshot) -> Iterator[Metric]:
    identities = {i.index: i for i in snapshot.identities if i is not None}
    labels = {gpu: [str(gpu), ident.uuid] for gpu, ident in identities.items()}

    info = InfoMetricFamily("gpu", "GPU identity; value 1.", labels=[
        *GPU_LABELS, "name", "pci_bus_id", "serial", "driver_version", "nvml_version"])
    for gpu, ident in sorted(identities.items()):
        info.add_metric(labels[gpu], {
            "name": ident.name, "pci_bus_id": ident.pci_bus_id, "serial": ident.serial,
            "driver_version": snapshot.driver_version, "nvml_version": snapshot.nvml_version})
    yield info

    static = (
        ("gpu_power_default_limit_watts", "Default power limit (the board's TDP).",
         "default_power_limit_watts"),
        ("gpu_pcie_link_max_generation", "Maximum PCIe link generation of the GPU and slot.",
         "pcie_max_generation"),
        ("gpu_pcie_link_max_width", "Maximum PCIe link width (lanes).", "pcie_max_width"),
        ("gpu_sm_clock_max_hertz", "Maximum SM clock.", "sm_clock_max_hertz"),
    )
    for name, doc, attr in static:
        family = GaugeMetricFamily(name, doc, labels=GPU_LABELS)
        for gpu, ident in sorted(identities.items()):
            value = getattr(ident, attr)
            if value is not None:
                family.add_metric(labels[gpu], value)
        yield family

    power = GaugeMetricFamily("gpu_power_watts",
                              "Instant power (NVML_FI_DEV_POWER_INSTANT), latest fast sample.",
                              labels=GPU_LABELS)
    energy = CounterMetricFamily("gpu_energy_joules",
                                 "Energy used since the driver was loaded.", labels=GPU_LABELS)
    for gpu, sample in sorted(snapshot.power.items()):
        if gpu not in labels:
            continue
        if sample.watts is not None:
            power.add_metric(labels[gpu], sample.watts)
        if sample.joules is not None:
            energy.add_metric(labels[gpu], sample.joules)
    yield power
    yield energy

    for name, doc, attr, kind in STATE_METRICS:
        cls = CounterMetricFamily if kind == "counter" else GaugeMetricFamily
        family = cls(name, doc, labels=GPU_LABELS)
        for gpu, state in sorted(snapshot.states.items()):
            value = getattr(state, attr)
            if value is not None and gpu in labels:
                family.add_metric(labels[gpu], value)
        yield family
