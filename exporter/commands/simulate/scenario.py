"""A fleet scenario: which jobs run on which virtual nodes, and the faults injected into
chosen nodes, GPUs and HCAs at chosen times (docs/simulator.md has the format).

The built-ins are exporter/fleet_scenarios/NAME.yaml (data beside the node scenarios of
exporter/scenarios/, which name them when a fleet scenario is given to `run --fake`); any
other YAML file loads by its path.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from exporter.sim.scenarios import (
    FAULT_PARAMS,
    FaultEvent,
    GpuOverride,
    Scenario,
    Workload,
    _parse_event,
    load_scenario,
)
from exporter.yamlfile import (
    ConfigError,
    LineDict,
    Where,
    expect_mapping,
    get_int,
    get_number,
    get_string,
    load_yaml,
    load_yaml_file,
)

log = logging.getLogger(__name__)

MAX_NODES = 256
# InfiniBand fault kinds and their parameters: name -> default.
IB_FAULTS: dict[str, dict[str, float | str]] = {
    # the port goes DOWN while active (link_downed counts one more at `at`)
    "ib_down": {},
    # the port renegotiates a lower rate while active
    "ib_rate": {"rate": "200 Gb/sec (4X HDR)"},
    # error counters rise while active (per second)
    "ib_errors": {"symbol_error_per_second": 0.0, "link_error_recovery_per_second": 0.0,
                  "link_downed_per_second": 0.0, "local_link_integrity_errors_per_second": 0.0,
                  "excessive_buffer_overrun_errors_per_second": 0.0,
                  "rnr_nak_retry_err_per_second": 0.0},
}
# A GPU slower than its peers for the whole run (a GpuOverride: lockstep peers wait for it).
STRAGGLER_PARAMS = {"clock_scale": 0.8, "temperature_offset_celsius": 5.0}
GPU_FAULTS = tuple(FAULT_PARAMS)


@dataclass(frozen=True)
class FleetJob:
    name: str  # the hpc_job id written into the mapping files
    nodes: tuple[int, ...]
    step_period_seconds: float = 2.0
    phase_seconds: float = 0.0
    compute_fraction: float = 0.65
    # rank 0 (GPU 0 of the job's first node) writes a checkpoint every this many seconds
    # (0: never), aligned to the wall clock, while every other GPU of the job spins
    checkpoint_every_seconds: float = 0.0
    checkpoint_seconds: float = 20.0


@dataclass(frozen=True)
class IbFault:
    kind: str
    node: int
    hca: int
    at: float
    until: float | None
    params: dict = field(default_factory=dict)

    def active(self, t: float) -> bool:
        return t >= self.at and (self.until is None or t < self.until)

    def active_seconds(self, t: float) -> float:
        end = t if self.until is None else min(t, self.until)
        return max(0.0, end - self.at)


@dataclass(frozen=True)
class InfinibandSpec:
    hcas: int = 2
    rate: str = "400 Gb/sec (4X NDR)"
    link_layer: str = "InfiniBand"
    bytes_per_second: float = 2.0e10  # per port while the node trains


@dataclass(frozen=True)
class FleetScenario:
    name: str
    description: str = ""
    nodes: int = 8
    gpus_per_node: int = 8
    seed: int = 1
    infiniband: InfinibandSpec = field(default_factory=InfinibandSpec)
    jobs: tuple[FleetJob, ...] = ()
    gpu_faults: tuple[tuple[int, FaultEvent], ...] = ()  # (node, event)
    stragglers: tuple[tuple[int, int, GpuOverride], ...] = ()  # (node, gpu, override)
    ib_faults: tuple[IbFault, ...] = ()

    def job_of(self, node: int) -> FleetJob | None:
        return next((j for j in self.jobs if node in j.nodes), None)

    def node_scenario(self, node: int) -> Scenario:
        """The fake NVML scenario of one node: its job's workload, stragglers, GPU faults."""
        base = load_scenario("training")
        job = self.job_of(node)
        overrides = {gpu: o for n, gpu, o in self.stragglers if n == node}
        if job is None:
            workload = Workload(type="idle")
        else:
            period, fraction = job.step_period_seconds, job.compute_fraction
            slowest = min((o.clock_scale for n, _, o in self.stragglers if n in job.nodes),
                          default=1.0)
            if slowest < 1.0 and not overrides:
                # Lockstep across nodes: this node's GPUs wait for the job's slowest GPU
                # elsewhere, as the straggler's own node does (see fake._step_timing).
                compute = fraction * period
                period = compute / slowest + period - compute
                fraction = compute / period
            workload = dataclasses.replace(
                base.workload, step_period_seconds=period, phase_seconds=job.phase_seconds,
                compute_fraction=fraction, checkpoint_every_seconds=job.checkpoint_every_seconds,
                checkpoint_seconds=job.checkpoint_seconds,
                # the first after a period of steps, as a job saves after N steps
                checkpoint_after_seconds=job.checkpoint_every_seconds,
                # rank 0 writes on the job's first node; elsewhere no GPU does, all spin
                checkpoint_gpu=0 if node == job.nodes[0] else -1)
        events = tuple(sorted((e for n, e in self.gpu_faults if n == node), key=lambda e: e.at))
        return Scenario(name=f"{self.name}/node{node}", description=self.description,
                        gpus=self.gpus_per_node, seed=self.seed * 1000 + node,
                        device=base.device, workload=workload, overrides=overrides,
                        events=events)


def builtin_fleet_names() -> list[str]:
    folder = resources.files("exporter") / "fleet_scenarios"
    return sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".yaml"))


def load_fleet_scenario(name_or_path: str, nodes: int | None = None,
                        gpus_per_node: int | None = None) -> FleetScenario:
    """A built-in fleet scenario by name, or a YAML file; `nodes`/`gpus_per_node` override."""
    if name_or_path in builtin_fleet_names():
        resource = resources.files("exporter") / "fleet_scenarios" / f"{name_or_path}.yaml"
        source = f"fleet scenario {name_or_path}"
        data = load_yaml(resource.read_text(encoding="utf-8"), source)
        return parse_fleet_scenario(data, source, name_or_path, nodes, gpus_per_node)
    path = Path(name_or_path)
    if not path.suffix and not path.exists():
        raise ConfigError(f"unknown fleet scenario {name_or_path!r} (built-in: "
                          f"{', '.join(builtin_fleet_names())}; or give a path to a YAML file)")
    return parse_fleet_scenario(load_yaml_file(path), str(path), path.stem, nodes,
                                gpus_per_node)


def _node_list(value: object, where: Where, key: str, nodes: int,
               clip: bool = False) -> tuple[int, ...]:
    """`all`, a list of node indices, or 'A-B' (inclusive); `clip` drops nodes past the end."""
    if value == "all":
        return tuple(range(nodes))
    if isinstance(value, str) and "-" in value:
        low, _, high = value.partition("-")
        if low.strip().isdigit() and high.strip().isdigit():
            value = list(range(int(low), int(high) + 1))
    if not isinstance(value, list) or not value or not all(
            isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise where.error(key, "expected 'all', 'A-B' or a list of node indices")
    if clip:
        value = [v for v in value if v < nodes]
    for v in value:
        if not 0 <= v < nodes:
            raise where.error(key, f"node {v} is out of range [0, {nodes - 1}] "
                              f"(the fleet has {nodes} nodes)")
    return tuple(value)


def _without(mapping: dict, *keys: str) -> LineDict:
    out = LineDict({k: v for k, v in mapping.items() if k not in keys})
    out.lines = getattr(mapping, "lines", {})
    out.start_line = getattr(mapping, "start_line", 0)
    return out


def parse_fleet_scenario(data: object, source: str, name: str, nodes: int | None = None,
                         gpus_per_node: int | None = None) -> FleetScenario:
    where = Where(source, data)
    top = expect_mapping(data, where, {"description", "nodes", "gpus_per_node", "seed",
                                       "infiniband", "jobs", "faults"})
    n = nodes or get_int(top, "nodes", where, 8, low=1, high=MAX_NODES)
    g = gpus_per_node or get_int(top, "gpus_per_node", where, 8, low=1, high=64)
    ib = _parse_infiniband(top.get("infiniband") or {}, where)
    jobs = _parse_jobs(_list(top, "jobs", where), where, n, clip=nodes is not None)
    faults = _Faults(where, n, g, ib, clip=nodes is not None)
    for item in _list(top, "faults", where):
        faults.add(item)
    return FleetScenario(
        name=name, description=get_string(top, "description", where, "") or "", nodes=n,
        gpus_per_node=g, seed=get_int(top, "seed", where, 1, low=0, high=2**20),
        infiniband=ib, jobs=tuple(jobs), gpu_faults=tuple(faults.gpu),
        stragglers=tuple(faults.stragglers), ib_faults=tuple(faults.ib))


def _list(top: dict, key: str, where: Where) -> list:
    value = top.get(key) or []
    if not isinstance(value, list):
        raise where.error(key, "expected a list")
    return value


def _parse_infiniband(raw: object, where: Where) -> InfinibandSpec:
    ib_where = where.child("infiniband", raw)
    raw = expect_mapping(raw, ib_where, {f.name for f in dataclasses.fields(InfinibandSpec)})
    defaults = InfinibandSpec()
    ib = InfinibandSpec(
        hcas=get_int(raw, "hcas", ib_where, defaults.hcas, low=0, high=16),
        rate=get_string(raw, "rate", ib_where, defaults.rate),
        link_layer=get_string(raw, "link_layer", ib_where, defaults.link_layer),
        bytes_per_second=get_number(raw, "bytes_per_second", ib_where,
                                    defaults.bytes_per_second, low=0, high=1e13))
    if ib.link_layer not in ("InfiniBand", "Ethernet"):
        raise ib_where.error("link_layer", "expected InfiniBand or Ethernet")
    return ib


def _parse_jobs(raw_jobs: list, where: Where, n: int, clip: bool) -> list[FleetJob]:
    jobs: list[FleetJob] = []
    taken: dict[int, str] = {}
    for item in raw_jobs:
        jw = where.child("jobs", item)
        expect_mapping(item, jw, {"name", "nodes", "step_period_seconds", "phase_seconds",
                                  "compute_fraction", "checkpoint_every_seconds",
                                  "checkpoint_seconds"})
        job_name = item.get("name")
        if not isinstance(job_name, str | int) or isinstance(job_name, bool) or not str(
                job_name).strip() or any(c.isspace() for c in str(job_name)):
            raise jw.error("name", "expected a job id without spaces")
        job = FleetJob(
            name=str(job_name),
            nodes=_node_list(item.get("nodes", "all"), jw, "nodes", n, clip=clip),
            step_period_seconds=get_number(item, "step_period_seconds", jw, 2.0, low=0.2,
                                           high=60),
            phase_seconds=get_number(item, "phase_seconds", jw, 0.0, low=-1e6, high=1e6),
            compute_fraction=get_number(item, "compute_fraction", jw, 0.65, low=0.05,
                                        high=0.95),
            checkpoint_every_seconds=get_number(item, "checkpoint_every_seconds", jw, 0.0,
                                                low=0.0, high=86400),
            checkpoint_seconds=get_number(item, "checkpoint_seconds", jw, 20.0, low=1.0,
                                          high=3600))
        if not job.nodes:
            continue  # --nodes left this job no node
        for node in job.nodes:
            if node in taken:
                raise jw.error("nodes", f"node {node} already runs job {taken[node]}")
            taken[node] = job.name
        jobs.append(job)
    return jobs


class _Faults:
    """A fleet scenario's faults, parsed one by one into GPU faults, stragglers and
    InfiniBand faults."""

    def __init__(self, where: Where, nodes: int, gpus: int, ib: InfinibandSpec, clip: bool):
        self.where, self.nodes, self.gpus, self.ib_spec, self.clip = where, nodes, gpus, ib, clip
        self.gpu: list[tuple[int, FaultEvent]] = []
        self.stragglers: list[tuple[int, int, GpuOverride]] = []
        self.ib: list[IbFault] = []

    def add(self, item: object) -> None:
        fw = self.where.child("faults", item)
        kind = item.get("kind") if isinstance(item, dict) else None
        known = (*GPU_FAULTS, "straggler", *IB_FAULTS)
        if kind not in known:
            expect_mapping(item, fw, set(item) if isinstance(item, dict) else set())
            raise fw.error("kind", f"expected one of {', '.join(known)}, got {kind!r}")
        assert isinstance(item, dict)  # it has a kind
        if "node" not in item:
            raise fw.error("node", "required: the node index (0-based)")
        if self.clip and isinstance(item["node"], int) and item["node"] >= self.nodes:
            log.info("fault %s on node %s left out: the fleet has %d nodes", kind,
                     item["node"], self.nodes)
            return
        node = get_int(item, "node", fw, -1, low=0, high=self.nodes - 1)
        if kind in GPU_FAULTS:
            self.gpu.append((node, _parse_event(_without(item, "node"), fw, self.gpus)))
        elif kind == "straggler":
            self._straggler(item, fw, node)
        else:
            self._infiniband(item, fw, node, kind)

    def _straggler(self, item: dict, fw: Where, node: int) -> None:
        expect_mapping(item, fw, {"kind", "node", "gpu", *STRAGGLER_PARAMS})
        if "gpu" not in item:
            raise fw.error("gpu", "required for kind straggler")
        gpu = get_int(item, "gpu", fw, -1, low=0, high=self.gpus - 1)
        self.stragglers.append((node, gpu, GpuOverride(
            clock_scale=get_number(item, "clock_scale", fw, 0.8, low=0.05, high=1),
            temperature_offset_celsius=get_number(
                item, "temperature_offset_celsius", fw, 5.0, low=-50, high=100))))

    def _infiniband(self, item: dict, fw: Where, node: int, kind: str) -> None:
        spec, hcas = IB_FAULTS[kind], self.ib_spec.hcas
        expect_mapping(item, fw, {"kind", "node", "hca", "at", "until", *spec})
        at = get_number(item, "at", fw, 0, low=0, high=1e9)
        until = item.get("until")
        if until is not None:
            until = get_number(item, "until", fw, 0, low=at, high=1e9)
        hca = get_int(item, "hca", fw, 0, low=0, high=max(0, hcas - 1))
        if hcas == 0:
            raise fw.error("kind", "the fleet has no InfiniBand HCAs (infiniband.hcas: 0)")
        params: dict[str, float | str] = {}
        for key, default in spec.items():
            if isinstance(default, str):
                params[key] = get_string(item, key, fw, default)
            else:
                params[key] = get_number(item, key, fw, default, low=0, high=1e9)
        self.ib.append(IbFault(kind, node, hca, at, until, params))
