"""Scenarios for the fake NVML: a node described over time, in YAML.

A scenario names the GPU model, the workload every GPU runs (a training step
waveform or idle), per-GPU differences, and faults injected at given times.
The format is documented in docs/scenarios.md; built-ins live in
exporter/scenarios/NAME.yaml and are selected by name.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from exporter.gpu.fields import CLOCK_EVENT_REASONS as CLOCK_EVENT_BITS
from exporter.sim.symbols import SYMBOLS, WAITING
from exporter.sim.tenants import (
    MigSpec,
    ProcessSpec,
    default_processes,
    parse_mig,
    parse_processes,
)
from exporter.yamlfile import (
    ConfigError,
    Where,
    expect_mapping,
    get_bool,
    get_int,
    get_number,
    get_string,
    load_yaml,
    load_yaml_file,
)

# NVML error names a scenario may inject, as pynvml spells the class suffix.
ERROR_CODES = {
    "Uninitialized": 1,
    "InvalidArgument": 2,
    "NotSupported": 3,
    "NoPermission": 4,
    "NotFound": 6,
    "InsufficientSize": 7,
    "DriverNotLoaded": 9,
    "Timeout": 10,
    "IrqIssue": 11,
    "GpuIsLost": 15,
    "ResetRequired": 16,
    "OperatingSystem": 17,
    "Memory": 20,
    "NoData": 21,
    "CorruptedInforom": 14,
    "Unknown": 999,
}


# Each fault kind and its own parameters: name -> (type, default, required).
_INT, _FLOAT, _BOOL, _STR, _LIST = "int", "float", "bool", "str", "list"
FAULT_PARAMS: dict[str, dict[str, tuple[str, object, bool]]] = {
    # the call returns an NVML error while active
    "error": {"call": (_STR, None, False), "error": (_STR, None, True)},
    # the first matching call after `at` blocks for `seconds`
    "hang": {"call": (_STR, None, False), "seconds": (_FLOAT, 0.0, True)},
    # an XID event delivered through nvmlEventSetWait at `at`
    "xid": {"code": (_INT, 0, True)},
    # ECC error counts added at `at` (volatile and aggregate)
    "ecc": {"corrected": (_INT, 0, False), "uncorrected": (_INT, 0, False)},
    # pages retired at `at`, and the pending flag from then on
    "retired_pages": {"single_bit": (_INT, 0, False), "double_bit": (_INT, 0, False),
                      "pending": (_BOOL, False, False)},
    # rows remapped at `at`; pending / failure flags while active
    "row_remap": {"correctable": (_INT, 0, False), "uncorrectable": (_INT, 0, False),
                  "pending": (_BOOL, False, False), "failure": (_BOOL, False, False)},
    # NVLink error rates (per second, while active) on one link or all; `down` drops it
    "nvlink": {"link": (_INT, None, False), "crc_flit_per_second": (_FLOAT, 0.0, False),
               "crc_data_per_second": (_FLOAT, 0.0, False),
               "replay_per_second": (_FLOAT, 0.0, False),
               "recovery_per_second": (_FLOAT, 0.0, False), "down": (_BOOL, False, False)},
    # clock-event reasons set while active, with the SM clock scaled and the GPU hotter
    "clock_event": {"reasons": (_LIST, [], True), "clock_scale": (_FLOAT, 1.0, False),
                    "temperature_offset_celsius": (_FLOAT, 0.0, False)},
    # the recovery action NVML reports (field 230) while active
    "recovery_action": {"action": (_STR, None, True)},
    # another GPU in the slot from `at` on: a new serial number (and UUID), as after a swap
    "replace": {"serial": (_STR, None, True)},
    # PCIe replays at a rate while active, and the link's generation or width while active
    "pcie": {"replays_per_minute": (_FLOAT, 0.0, False), "generation": (_INT, None, False),
             "width": (_INT, None, False)},
    # the NVLink fabric's registration while active (nvmlDeviceGetGpuFabricInfoV): its
    # state (a fabric that never registers: not_started with no `until`), the status of
    # the registration (an NVML error name, or Success) and a degraded health mask
    "fabric": {"state": (_STR, "completed", False), "status": (_STR, "Success", False),
               "degraded": (_BOOL, False, False)},
}
FAULT_KINDS = tuple(FAULT_PARAMS)

FABRIC_STATES = {"not_supported": 0, "not_started": 1, "in_progress": 2, "completed": 3}
# a recovery_action fault names the driver's token (gpu/fields.py), as nvidia-smi shows it
DRIVER_RECOVERY_CODES = {"none": 0, "gpu_reset": 1, "node_reboot": 2, "drain_p2p": 3,
                         "drain_and_reset": 4}


@dataclass(frozen=True)
class DeviceSpec:
    name: str = "NVIDIA H100 80GB HBM3"
    memory_total_bytes: int = 81559 * 1024 * 1024
    power_limit_watts: float = 700.0
    default_power_limit_watts: float = 700.0
    max_sm_clock_mhz: float = 1980.0
    idle_sm_clock_mhz: float = 345.0
    memory_clock_mhz: float = 2619.0
    pcie_generation: int = 5
    pcie_width: int = 16
    has_fan: bool = False
    # The instant-power field changes every ~100 ms on an H200; the driver buffers a
    # power sample every ~20 ms (jittered), 119 of them (0: no buffer, as on drivers
    # without nvmlDeviceGetSamples power samples). docs/nvml-costs.md.
    power_update_period_seconds: float = 0.1
    power_sample_interval_seconds: float = 0.02
    power_sample_buffer: int = 119
    # Hopper replaced page retirement by row remapping: fields 29-31 are NotSupported.
    retired_pages: bool = False
    # GPM (profiling metrics: nvmlGpmQueryDeviceSupport) exists from Hopper on.
    gpm: bool = True
    nvlinks: int = 18
    # An NVSwitch system (HGX): the GPU registers with the fabric manager; False: a PCIe
    # card, whose fabric state reads not_supported.
    fabric: bool = True
    driver_version: str = "570.133.20"
    nvml_version: str = "12.570.133.20"


@dataclass(frozen=True)
class Workload:
    type: str = "training"  # "training" or "idle"
    step_period_seconds: float = 2.0
    compute_fraction: float = 0.65
    compute_watts: float = 680.0
    communication_watts: float = 190.0
    idle_watts: float = 72.0
    ramp_seconds: float = 0.08
    noise_watts: float = 12.0
    phase_seconds: float = 0.0
    memory_used_bytes: int = 74 * 1024**3
    pcie_bytes_per_second: float = 2.5e9
    # Checkpoints: every `checkpoint_every_seconds` (0: never, aligned to the wall clock),
    # rank `checkpoint_gpu` writes for `checkpoint_seconds` near idle at 0 % utilization
    # while its peers busy-wait in the collective at 100 % utilization and `wait_watts`.
    checkpoint_every_seconds: float = 0.0
    checkpoint_seconds: float = 20.0
    checkpoint_gpu: int = 0
    wait_watts: float = 150.0
    # a sharded checkpoint instead (FSDP, DeepSpeed, Megatron's distributed checkpoint):
    # every rank writes its shard, every GPU near idle together
    checkpoint_sharded: bool = False
    # no checkpoint begins in the first this many seconds after start (0: as the clock
    # falls; a job saves after its first steps)
    checkpoint_after_seconds: float = 0.0


@dataclass(frozen=True)
class GpuOverride:
    power_limit_watts: float | None = None
    temperature_offset_celsius: float = 0.0
    # <1: a slower GPU; in lockstep training its compute phase takes 1/clock_scale longer
    # and every peer waits for it
    clock_scale: float = 1.0
    power_scale: float = 1.0
    # set on any GPU: the GPUs step independently (not in lockstep)
    step_period_seconds: float | None = None
    phase_seconds: float = 0.0


@dataclass(frozen=True)
class FaultEvent:
    """A fault: from `at` seconds after start until `until` (None: for good)."""

    kind: str
    at: float
    until: float | None = None
    gpu: int | None = None  # None: every GPU
    params: dict = field(default_factory=dict)  # the kind's own parameters (FAULT_PARAMS)

    @property
    def call(self) -> str | None:
        return self.params.get("call")

    @property
    def error(self) -> str | None:
        return self.params.get("error")

    @property
    def seconds(self) -> float:
        return float(self.params.get("seconds", 0.0))

    def active_seconds(self, t: float) -> float:
        """How long the fault has been active by time t."""
        end = t if self.until is None else min(t, self.until)
        return max(0.0, end - self.at)

    def active(self, t: float) -> bool:
        return t >= self.at and (self.until is None or t < self.until)

    def matches(self, call: str, gpu: int | None) -> bool:
        if self.call is not None and self.call != call:
            return False
        return self.gpu is None or self.gpu == gpu


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str = ""
    gpus: int = 8
    seed: int = 1
    device: DeviceSpec = field(default_factory=DeviceSpec)
    workload: Workload = field(default_factory=Workload)
    overrides: dict[int, GpuOverride] = field(default_factory=dict)
    events: tuple[FaultEvent, ...] = ()
    # who runs on the GPUs (sim/tenants.py): None means the default for the workload
    processes: tuple[ProcessSpec, ...] | None = None
    mig: tuple[MigSpec, ...] = ()

    def process_specs(self) -> tuple[ProcessSpec, ...]:
        if self.processes is not None:
            return self.processes
        split = {gpu for spec in self.mig for gpu in spec.gpus}
        whole = tuple(gpu for gpu in range(self.gpus) if gpu not in split)
        return default_processes(whole, self.workload.type == "training",
                                 self.workload.memory_used_bytes,
                                 self.workload.compute_fraction)


# the package's data folders, beside its modules (read as paths: importlib.resources
# would load zipfile for them into every fake node)
_PACKAGE = Path(__file__).resolve().parent.parent


def builtin_names() -> list[str]:
    folder = _PACKAGE / "scenarios"
    return sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".yaml"))


def load_scenario(name_or_path: str) -> Scenario:
    """Load a built-in scenario by name, or a YAML file by path."""
    if name_or_path in builtin_names():
        resource = _PACKAGE / "scenarios" / f"{name_or_path}.yaml"
        source = f"scenario {name_or_path}"
        return parse_scenario(load_yaml(resource.read_text(encoding="utf-8"), source),
                              source, name_or_path)
    path = Path(name_or_path)
    fleet = _PACKAGE / "fleet_scenarios" / f"{name_or_path}.yaml"
    if not path.suffix and not path.exists() and fleet.is_file():
        raise ConfigError(
            f"{name_or_path!r} is a fleet scenario: run it with `simulate --scenario "
            f"{name_or_path}` (many nodes); a node's scenarios are: "
            f"{', '.join(builtin_names())}")
    if not path.suffix and not path.exists():
        raise ConfigError(
            f"unknown scenario {name_or_path!r} (built-in: {', '.join(builtin_names())}; "
            "or give a path to a YAML file)"
        )
    return parse_scenario(load_yaml_file(path), str(path), path.stem)


def _spec(cls, mapping: dict, where: Where, *, strings=(), ints=(), bools=(), bounds=None):
    """Build a flat dataclass from a mapping, checking each field's type and range."""
    defaults = cls()
    names = {f for f in cls.__dataclass_fields__}
    expect_mapping(mapping, where, names)
    values: dict[str, object] = {}
    for name in names:
        default = getattr(defaults, name)
        if name in strings:
            values[name] = get_string(mapping, name, where, default)
        elif name in bools:
            values[name] = get_bool(mapping, name, where, default)
        else:
            low, high = (bounds or {}).get(name, (0, 1e15))
            if default is None and name not in mapping:
                values[name] = None
                continue
            values[name] = get_number(mapping, name, where, 0 if default is None else default,
                                      low=low, high=high, integer=name in ints)
    return cls(**values)


def parse_scenario(data: object, source: str, name: str) -> Scenario:
    where = Where(source, data)
    top = expect_mapping(data, where, {"description", "gpus", "seed", "device", "workload",
                                       "gpu_overrides", "events", "processes", "mig"})
    gpus = get_int(top, "gpus", where, 8, low=1, high=64)
    device = _spec(DeviceSpec, top.get("device") or {}, where.child("device", top.get("device")),
                   strings=("name", "driver_version", "nvml_version"),
                   ints=("memory_total_bytes", "pcie_generation", "pcie_width", "nvlinks",
                         "power_sample_buffer"),
                   bools=("has_fan", "retired_pages", "gpm", "fabric"),
                   bounds={"power_update_period_seconds": (0.001, 10),
                           "power_sample_interval_seconds": (0.001, 1),
                           "power_sample_buffer": (0, 100000),
                           "pcie_generation": (1, 6), "pcie_width": (1, 32),
                           "nvlinks": (0, 36)})
    workload = _spec(Workload, top.get("workload") or {},
                     where.child("workload", top.get("workload")),
                     strings=("type",), ints=("memory_used_bytes", "checkpoint_gpu"),
                     bools=("checkpoint_sharded",),
                     bounds={"step_period_seconds": (0.01, 3600), "compute_fraction": (0, 1),
                             "phase_seconds": (-1e6, 1e6)})
    if workload.type not in ("training", "idle"):
        raise where.child("workload", top.get("workload")).error(
            "type", f"expected 'training' or 'idle', got {workload.type!r}")
    overrides = {}
    raw_overrides = top.get("gpu_overrides") or []
    if not isinstance(raw_overrides, list):
        raise where.error("gpu_overrides", "expected a list")
    for item in raw_overrides:
        item_where = where.child("gpu_overrides", item)
        expect_mapping(item, item_where, set(GpuOverride.__dataclass_fields__) | {"gpu"})
        gpu = get_int(item, "gpu", item_where, -1, low=0, high=gpus - 1)
        rest = {k: v for k, v in item.items() if k != "gpu"}
        overrides[gpu] = _spec(GpuOverride, rest, item_where,
                               bounds={"temperature_offset_celsius": (-50, 100),
                                       "clock_scale": (0.05, 2), "power_scale": (0, 5),
                                       "step_period_seconds": (0.01, 3600),
                                       "phase_seconds": (-1e6, 1e6)})
    events = []
    raw_events = top.get("events") or []
    if not isinstance(raw_events, list):
        raise where.error("events", "expected a list")
    for item in raw_events:
        events.append(_parse_event(item, where.child("events", item), gpus))
    mig = parse_mig(top.get("mig"), where, gpus)
    processes = (parse_processes(top["processes"], where, gpus, mig)
                 if "processes" in top else None)
    return Scenario(
        name=name,
        description=get_string(top, "description", where, "") or "",
        gpus=gpus,
        seed=get_int(top, "seed", where, 1, low=0, high=2**31),
        device=device,
        workload=workload,
        overrides=overrides,
        events=tuple(sorted(events, key=lambda e: e.at)),
        processes=processes,
        mig=mig,
    )


def _parse_event(item: object, where: Where, gpus: int) -> FaultEvent:
    kind = item.get("kind") if isinstance(item, dict) else None
    if kind not in FAULT_PARAMS:
        expect_mapping(item, where, {"kind"} | (set(item) if isinstance(item, dict) else set()))
        raise where.error("kind", f"expected one of {', '.join(FAULT_KINDS)}, got {kind!r}")
    assert isinstance(item, dict)  # it has a kind
    spec = FAULT_PARAMS[kind]
    mapping = expect_mapping(item, where, {"kind", "at", "until", "gpu"} | set(spec))
    at = get_number(mapping, "at", where, 0, low=0, high=1e9)
    until = mapping.get("until")
    if until is not None:
        until = get_number(mapping, "until", where, 0, low=at, high=1e9)
    gpu = mapping.get("gpu")
    if gpu is not None:
        gpu = get_int(mapping, "gpu", where, 0, low=0, high=gpus - 1)
    params: dict = {}
    for name, (kind_of, default, required) in spec.items():
        if required and name not in mapping:
            raise where.error(name, f"required for kind {kind}")
        if kind_of == _STR:
            params[name] = get_string(mapping, name, where,
                                      default if isinstance(default, str) else None)
        elif kind_of == _BOOL:
            params[name] = get_bool(mapping, name, where, bool(default))
        elif kind_of == _LIST:
            value = mapping.get(name, default)
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise where.error(name, "expected a list of names")
            params[name] = tuple(value)
        elif default is None and name not in mapping:
            params[name] = None
        else:
            number = default if isinstance(default, int | float) else 0
            params[name] = get_number(mapping, name, where, number, low=0, high=1e12,
                                      integer=kind_of == _INT)
    if kind == "error" and params["error"] not in ERROR_CODES:
        raise where.error("error", f"expected one of {', '.join(ERROR_CODES)}, "
                          f"got {params['error']!r}")
    if kind in ("hang", "error") and params["call"] is not None:
        _check_call(params["call"], where)
    if kind == "hang" and params["seconds"] <= 0:
        raise where.error("seconds", "a hang needs seconds > 0")
    if kind == "clock_event":
        unknown = [r for r in params["reasons"] if r not in CLOCK_EVENT_BITS]
        if unknown:
            raise where.error("reasons", f"unknown reason {unknown[0]!r} (known: "
                              f"{', '.join(CLOCK_EVENT_BITS)})")
    if kind == "recovery_action" and params["action"] not in DRIVER_RECOVERY_CODES:
        raise where.error("action", f"expected one of {', '.join(DRIVER_RECOVERY_CODES)}")
    if kind == "fabric" and params["state"] not in FABRIC_STATES:
        raise where.error("state", f"expected one of {', '.join(FABRIC_STATES)}")
    if kind == "fabric" and params["status"] not in ("Success", *ERROR_CODES):
        raise where.error("status", f"expected Success or one of {', '.join(ERROR_CODES)}")
    return FaultEvent(kind=kind, at=at, until=until, gpu=gpu, params=params)


def _check_call(call: str, where: Where) -> None:
    """A fault's call must be a symbol the fake answers, where a fault can fire."""
    if call in WAITING:
        raise where.error("call", f"{call} blocks by design: a fault there never fires")
    if call in SYMBOLS:
        return
    import difflib  # only for a misspelt call

    close = difflib.get_close_matches(call, sorted(SYMBOLS), n=1, cutoff=0.8)
    hint = f"did you mean {close[0]}?" if close else (
        "known: " + ", ".join(sorted(SYMBOLS - WAITING)))
    raise where.error("call", f"unknown NVML call {call!r} ({hint})")
