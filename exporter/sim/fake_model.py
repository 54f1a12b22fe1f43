"""The fake's model: each catalogue value of a fake GPU at time t, in base units.

One method per catalogue key (`_model_<key>`); the fields and calls that carry a value
answer it divided by the catalogue's factor, so the fake and the sweep agree on units
by construction. A value the model does not have, or a replayed trace lacks, is None:
NVML's NotSupported.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from exporter.gpu import catalogue
from exporter.sim.fake_core import FakeCore
from exporter.sim.physics import FakeGpu
from exporter.sim.scenarios import CLOCK_EVENT_BITS

# Values no time changes for a GPU of the model (not a replay), and values only faults of
# one kind change (the same at any time in a scenario without such faults): the fields
# that carry them keep their first answer (fake_fields._fixed); tests/test_fake_lean.py
# checks both against the model over every scenario.
STATIC_KEYS = frozenset({
    "default_power_limit_watts", "power_max_limit_watts", "pcie_max_generation",
    "pcie_max_width", "sm_clock_max_hertz", "memory_total_bytes", "memory_clock_hertz",
    "memory_reserved_bytes", "fan_speed_ratio", "encoder_utilization_ratio",
    "decoder_utilization_ratio", "power_limit_watts", "performance_state"})
FAULT_KEYS = {
    "clock_event_sw_thermal_slowdown_seconds": "clock_event",
    "clock_event_thermal_seconds": "clock_event",
    "clock_event_hw_thermal_slowdown_seconds": "clock_event",
    "clock_event_hw_power_brake_slowdown_seconds": "clock_event",
    "pcie_replays": "pcie", "pcie_generation": "pcie", "pcie_width": "pcie"}


_SCALE = {key: entry.scale for key, entry in catalogue.BY_KEY.items()}  # NVML's unit


class ModelValues(FakeCore):
    """Mixin of FakeNvmlLibrary (which provides scenario, clock, now(), start, faults())."""

    def init_model(self) -> None:
        self._model_methods: dict[str, Callable[[FakeGpu, float], float | None] | None] = {}

    def model(self, gpu: FakeGpu, key: str, t: float | None = None) -> float | None:
        if gpu.replays and not gpu.provides(key):
            return None
        t = self.clock() if t is None else t
        if gpu.replays:
            replayed = gpu.recorded(key, t)
            if replayed is not None:
                return replayed
        method = self._model_methods.get(key) or self.model_method(key)
        return None if method is None else method(gpu, t)

    def modelled(self, gpu: FakeGpu, key: str, t: float) -> float:
        """A value the model always has for this GPU (one another value derives from)."""
        value = self.model(gpu, key, t)
        assert value is not None, key
        return value

    def model_method(self, key: str) -> Callable[[FakeGpu, float], float | None] | None:
        """The bound `_model_<key>` (None: the model has no such value), looked up once."""
        try:
            return self._model_methods[key]
        except KeyError:
            method = self._model_methods[key] = getattr(self, f"_model_{key}", None)
            return method

    def nvml_units(self, gpu: FakeGpu, key: str) -> int | None:
        """The value as NVML reports it (mW, MHz, percent, ...), a whole number."""
        value = self.model(gpu, key)
        return None if value is None else int(round(value / _SCALE[key]))

    # -- faults that change the physics ------------------------------------------
    def clock_events(self, gpu: FakeGpu, t: float) -> tuple[int, float, float]:
        """Active fault reason bits, SM clock scale and extra degrees at time t."""
        bits, scale, hotter = 0, 1.0, 0.0
        for event in self.faults("clock_event", gpu.index, t - self.start):
            for reason in event.params["reasons"]:
                bits |= CLOCK_EVENT_BITS[reason]
            scale = min(scale, event.params["clock_scale"])
            hotter = max(hotter, event.params["temperature_offset_celsius"])
        return bits, scale, hotter

    def at_power_cap(self, gpu: FakeGpu, t: float) -> bool:
        period = self.scenario.device.power_update_period_seconds
        return gpu.instant_power(t, period) >= 0.98 * gpu.power_limit

    def compute_phase(self, gpu: FakeGpu, t: float) -> bool:
        return gpu.training and gpu.ideal_power(t) > (gpu.high + gpu.wave.low) / 2

    # -- static ------------------------------------------------------------------------
    def _model_default_power_limit_watts(self, gpu: FakeGpu, t: float) -> float:
        return self.scenario.device.default_power_limit_watts

    def _model_power_max_limit_watts(self, gpu: FakeGpu, t: float) -> float:
        # an SXM H100 or H200 accepts no more than its default: NVIDIA's H100 and H200
        # SXM specifications give a maximum TDP of up to 700 W (configurable downwards)
        return self.scenario.device.default_power_limit_watts

    def _model_pcie_max_generation(self, gpu: FakeGpu, t: float) -> float:
        return self.scenario.device.pcie_generation

    def _model_pcie_max_width(self, gpu: FakeGpu, t: float) -> float:
        return self.scenario.device.pcie_width

    def _model_sm_clock_max_hertz(self, gpu: FakeGpu, t: float) -> float:
        return self.scenario.device.max_sm_clock_mhz * 1e6

    # -- every sweep ----------------------------------------------------------------------
    def _model_utilization_gpu_ratio(self, gpu: FakeGpu, t: float) -> float:
        writing = gpu.writer and gpu.in_checkpoint(t)
        return 1.0 if gpu.training and not writing else 0.0

    def _model_utilization_memory_ratio(self, gpu: FakeGpu, t: float) -> float:
        if not gpu.training:
            return 0.0
        return 0.55 if self.compute_phase(gpu, t) else 0.06

    def _model_memory_used_bytes(self, gpu: FakeGpu, t: float) -> float:
        used = self.scenario.workload.memory_used_bytes if gpu.training else 512 * 1024**2
        return min(used, self.scenario.device.memory_total_bytes)

    def _model_memory_total_bytes(self, gpu: FakeGpu, t: float) -> float:
        return self.scenario.device.memory_total_bytes

    def _model_power_average_watts(self, gpu: FakeGpu, t: float) -> float:
        return gpu.average_power(t, 1.0)

    def _model_temperature_celsius(self, gpu: FakeGpu, t: float) -> float:
        load = gpu.average_power(t, 30.0)
        return 28.0 + 0.056 * load + gpu.temperature_offset + self.clock_events(gpu, t)[2]

    def _model_memory_temperature_celsius(self, gpu: FakeGpu, t: float) -> float:
        return self.modelled(gpu, "temperature_celsius", t) + 6

    def _model_sm_clock_hertz(self, gpu: FakeGpu, t: float) -> float:
        dev = self.scenario.device
        if not gpu.training:
            return dev.idle_sm_clock_mhz * 1e6
        capped = self.at_power_cap(gpu, t)
        scale = gpu.clock_scale * self.clock_events(gpu, t)[1] * (0.93 if capped else 1.0)
        return round(dev.max_sm_clock_mhz * scale / 15) * 15 * 1e6

    def _model_memory_clock_hertz(self, gpu: FakeGpu, t: float) -> float:
        return self.scenario.device.memory_clock_mhz * 1e6

    def _model_fan_speed_ratio(self, gpu: FakeGpu, t: float) -> float | None:
        return 0.35 if self.scenario.device.has_fan else None

    def _model_clock_event_reasons(self, gpu: FakeGpu, t: float) -> float:
        faults = self.clock_events(gpu, t)[0]
        if not gpu.training:
            return 0x1 | faults  # GPU idle
        return (0x4 if self.at_power_cap(gpu, t) else 0x0) | faults  # SW power cap

    def _model_memory_reserved_bytes(self, gpu: FakeGpu, t: float) -> float:
        # ~0.66 % of the framebuffer, in whole MiB (538 MiB of an H100's 80 GB)
        return round(self.scenario.device.memory_total_bytes * 0.0066 / 2**20) * 2**20

    def _model_memory_free_bytes(self, gpu: FakeGpu, t: float) -> float:
        used = max(self.modelled(gpu, "memory_used_bytes", t),
                   self.modelled(gpu, "memory_reserved_bytes", t))
        return self.scenario.device.memory_total_bytes - used

    def _model_encoder_utilization_ratio(self, gpu: FakeGpu, t: float) -> float:
        return 0.0  # training does not use the video engines

    def _model_decoder_utilization_ratio(self, gpu: FakeGpu, t: float) -> float:
        return 0.0

    # -- the driver's clock-event (violation) counters ---------------------------------
    def _fault_seconds(self, gpu: FakeGpu, t: float, *reasons: str) -> float:
        """Seconds clock-event faults with one of `reasons` have been active by t."""
        since = t - self.start
        return sum(e.active_seconds(since) for e in self.faults("clock_event", gpu.index, since,
                                                                started=True)
                   if set(e.params["reasons"]) & set(reasons))

    def _model_clock_event_sw_power_cap_seconds(self, gpu: FakeGpu, t: float) -> float:
        # the instant power reaches 98 % of the limit (the bit the sweep samples) in the
        # compute phase when its noise takes it there: that share of the compute time
        margin = 0.98 * gpu.power_limit - gpu.high
        noise = max(self.scenario.workload.noise_watts, 1e-9)
        capped = 0.5 * math.erfc(margin / (noise * math.sqrt(2)))
        return (capped * gpu.compute_seconds_total(t)
                + self._fault_seconds(gpu, t, "sw_power_cap"))

    def _model_clock_event_sw_thermal_slowdown_seconds(self, gpu: FakeGpu, t: float) -> float:
        return self._fault_seconds(gpu, t, "sw_thermal_slowdown")

    def _model_clock_event_thermal_seconds(self, gpu: FakeGpu, t: float) -> float:
        return self._fault_seconds(gpu, t, "sw_thermal_slowdown", "hw_thermal_slowdown")

    def _model_clock_event_hw_thermal_slowdown_seconds(self, gpu: FakeGpu, t: float) -> float:
        return self._fault_seconds(gpu, t, "hw_thermal_slowdown")

    def _model_clock_event_hw_power_brake_slowdown_seconds(self, gpu: FakeGpu,
                                                            t: float) -> float:
        return self._fault_seconds(gpu, t, "hw_power_brake_slowdown")

    # -- the slow sweep -----------------------------------------------------------------
    def _model_power_limit_watts(self, gpu: FakeGpu, t: float) -> float:
        return gpu.power_limit

    def _model_performance_state(self, gpu: FakeGpu, t: float) -> float:
        return 0

    def _pcie_bytes(self, gpu: FakeGpu, t: float, share: float) -> float:
        rate = self.scenario.workload.pcie_bytes_per_second if gpu.training else 1e5
        return int(max(0.0, t - self.start) * rate * share) + 10**9 * (gpu.index + 1)

    def _model_pcie_transmit_bytes(self, gpu: FakeGpu, t: float) -> float:
        return self._pcie_bytes(gpu, t, 0.55)

    def _model_pcie_receive_bytes(self, gpu: FakeGpu, t: float) -> float:
        return self._pcie_bytes(gpu, t, 0.45)

    def _model_pcie_replays(self, gpu: FakeGpu, t: float) -> float:
        since = t - self.start
        return int(sum(e.active_seconds(since) * e.params["replays_per_minute"] / 60
                       for e in self.faults("pcie", gpu.index, since, started=True)) + 1e-9)

    def _pcie_link(self, gpu: FakeGpu, t: float, key: str, default: int) -> float:
        """The link's generation or width: a `pcie` fault's while it is active."""
        for e in self.faults("pcie", gpu.index, t - self.start):
            if e.params[key] is not None:
                return e.params[key]
        return default

    def _model_pcie_generation(self, gpu: FakeGpu, t: float) -> float:
        return self._pcie_link(gpu, t, "generation", self.scenario.device.pcie_generation)

    def _model_pcie_width(self, gpu: FakeGpu, t: float) -> float:
        return self._pcie_link(gpu, t, "width", self.scenario.device.pcie_width)

    # -- every energy interval -----------------------------------------------------------
    def _model_energy_joules(self, gpu: FakeGpu, t: float) -> float:
        return gpu.energy0_mj / 1000 + gpu.energy_joules(t)
