"""Who runs on a fake node: GPU processes that come and go, and MIG instances.

A scenario's ``processes`` key lists process specs (one process per GPU listed, started
once or again every ``every`` seconds, each run a new pid); its ``mig`` key splits GPUs
into MIG instances. Both are parsed here (the format is in docs/scenarios.md) and asked
by time: :func:`processes_at` says which processes are alive in a span of scenario time.

Without a ``processes`` key, a training workload runs one trainer process per GPU for
good (pid 4100 + GPU index): what a node in data-parallel training shows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from exporter.yamlfile import Where, expect_mapping, get_int, get_number, get_string

__all__ = ["DEFAULT_TRAINER_PID", "FakeProcess", "MigInstanceSpec", "MigSpec", "ProcessSpec",
           "mig_uuid", "parse_mig", "parse_processes", "processes_at", "uuid5_oid",
           "uuid5_oid_bytes"]

DEFAULT_TRAINER_PID = 4100
MAX_RUNS = 1_000_000  # runs of a repeating process a span may ask about, at most
_CONTAINER_CHARS = frozenset("0123456789abcdef")


@dataclass(frozen=True)
class ProcessSpec:
    gpus: tuple[int, ...]  # one process on each GPU listed
    pid: int  # the first run's pid on the first GPU listed
    name: str = "python"
    container: str = ""  # the container id its cgroup path names (64 hex digits; "" none)
    memory_bytes: int = 0
    sm_util: float = 0.0  # share of time its kernels keep the SMs busy while it runs (0-1)
    start: float = 0.0  # seconds after the scenario starts
    duration: float | None = None  # None: runs for good
    every: float | None = None  # a new run (a new pid) every `every` seconds
    gpu_instance: int | None = None  # MIG: the GPU instance it runs in

    def pid_of(self, slot: int, run: int) -> int:
        """Run `run` on the `slot`-th GPU listed: every run and GPU gets its own pid."""
        return self.pid + slot + run * len(self.gpus)


@dataclass(frozen=True)
class FakeProcess:
    pid: int
    gpu: int
    name: str
    container: str
    memory_bytes: int
    sm_util: float
    start: float  # scenario seconds
    end: float  # scenario seconds (inf: for good)
    gpu_instance: int | None = None

    def alive(self, t: float) -> bool:
        return self.start <= t < self.end

    def overlap(self, t0: float, t1: float) -> float:
        """Seconds of (t0, t1] it was alive."""
        return max(0.0, min(t1, self.end) - max(t0, self.start))


def processes_at(specs: tuple[ProcessSpec, ...], t0: float, t1: float) -> list[FakeProcess]:
    """Processes alive at some time in [t0, t1] (scenario seconds), by GPU then pid."""
    out = []
    for spec in specs:
        length = math.inf if spec.duration is None else spec.duration
        if spec.every is None:
            runs = range(1)
        else:
            first = max(0, math.floor((t0 - spec.start - length) / spec.every))
            last = math.floor((t1 - spec.start) / spec.every)
            runs = range(first, min(last, first + MAX_RUNS) + 1)
        for run in runs:
            begin = spec.start + run * (spec.every or 0.0)
            end = begin + length
            if begin > t1 or end <= t0:
                continue
            for slot, gpu in enumerate(spec.gpus):
                out.append(FakeProcess(spec.pid_of(slot, run), gpu, spec.name, spec.container,
                                       spec.memory_bytes, spec.sm_util, begin, end,
                                       spec.gpu_instance))
    return sorted(out, key=lambda p: (p.gpu, p.pid))


def default_processes(gpus: tuple[int, ...], training: bool, memory_bytes: int,
                      sm_util: float) -> tuple[ProcessSpec, ...]:
    """One trainer per whole GPU for good, in a training workload."""
    if not training or not gpus:
        return ()
    return tuple(ProcessSpec((gpu,), DEFAULT_TRAINER_PID + gpu, "python", "", memory_bytes,
                             sm_util) for gpu in gpus)


def _gpu_list(value: object, where: Where, key: str, gpus: int) -> tuple[int, ...]:
    """`all`, one index, or a list of indices."""
    if value == "all":
        return tuple(range(gpus))
    items = value if isinstance(value, list) else [value]
    out = []
    for item in items:
        if isinstance(item, bool) or not isinstance(item, int) or not 0 <= item < gpus:
            raise where.error(key, f"expected 'all', a GPU index 0-{gpus - 1} or a list of "
                              "them")
        out.append(item)
    if not out or len(set(out)) != len(out):
        raise where.error(key, "expected distinct GPU indices")
    return tuple(out)


_PROCESS_KEYS = {"gpu", "pid", "name", "container", "memory_bytes", "sm_util", "start",
                 "duration", "every", "gpu_instance"}


def _parse_process(item: object, where: Where, gpus: int) -> ProcessSpec:
    mapping = expect_mapping(item, where, _PROCESS_KEYS)
    for required in ("gpu", "pid"):
        if required not in mapping:
            raise where.error(required, "required for a process")
    name = get_string(mapping, "name", where, "python") or ""
    if not 0 < len(name) <= 15 or not name.isprintable():
        raise where.error("name", "expected 1-15 printable characters (a comm name)")
    container = get_string(mapping, "container", where, "") or ""
    if container and (len(container) != 64 or not set(container) <= _CONTAINER_CHARS):
        raise where.error("container", "expected a container id of 64 lowercase hex digits")
    optional = {k: get_number(mapping, k, where, 0, low=0.001, high=1e9)
                for k in ("duration", "every") if k in mapping}
    spec = ProcessSpec(
        gpus=_gpu_list(mapping["gpu"], where, "gpu", gpus),
        pid=get_int(mapping, "pid", where, 0, low=1, high=4_000_000),
        name=name, container=container,
        memory_bytes=get_int(mapping, "memory_bytes", where, 0, low=0, high=2**50),
        sm_util=get_number(mapping, "sm_util", where, 0.0, low=0, high=1),
        start=get_number(mapping, "start", where, 0.0, low=0, high=1e9),
        duration=optional.get("duration"), every=optional.get("every"),
        gpu_instance=(get_int(mapping, "gpu_instance", where, 0, low=0, high=63)
                      if "gpu_instance" in mapping else None))
    if spec.every is not None and (spec.duration is None or spec.duration > spec.every):
        raise where.error("every", "a repeating process needs a duration of at most `every`")
    return spec


def _check_placement(spec: ProcessSpec, where: Where, mig: tuple[MigSpec, ...]) -> None:
    """A process on a MIG GPU runs in one of its GPU instances; elsewhere, in none."""
    split = {gpu: {i.gpu_instance for i in m.instances} for m in mig for gpu in m.gpus}
    for gpu in spec.gpus:
        if gpu in split and spec.gpu_instance not in split[gpu]:
            raise where.error("gpu_instance", f"GPU {gpu} is split into MIG instances: "
                              f"expected one of {sorted(split[gpu])}")
        if gpu not in split and spec.gpu_instance is not None:
            raise where.error("gpu_instance", f"GPU {gpu} is not split into MIG instances")


def parse_processes(raw: object, where: Where, gpus: int, mig: tuple[MigSpec, ...] = ()
                    ) -> tuple[ProcessSpec, ...]:
    """The `processes` key (null: none)."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise where.error("processes", "expected a list")
    specs = []
    for item in raw:
        item_where = where.child("processes", item)
        spec = _parse_process(item, item_where, gpus)
        _check_placement(spec, item_where, mig)
        specs.append(spec)
    pids: set[int] = set()
    for spec in specs:  # first runs only: repeats are checked when they are asked for
        own = {spec.pid_of(slot, 0) for slot in range(len(spec.gpus))}
        if own & pids:
            raise where.error("processes", f"pid {min(own & pids)} is used twice")
        pids |= own
    return tuple(specs)


# -- MIG ------------------------------------------------------------------------------

@dataclass(frozen=True)
class MigInstanceSpec:
    gpu_instance: int
    slices: int  # GPU instance slices: the "3g" of 3g.71gb
    memory_mib: int  # the instance's memory (the device plugin names it ceil(MiB / 1024) GB)
    compute_instance: int = 0
    compute_slices: int | None = None  # None: the whole GPU instance


@dataclass(frozen=True)
class MigSpec:
    gpus: tuple[int, ...]
    instances: tuple[MigInstanceSpec, ...]  # in MIG device index order


_NAMESPACE_OID = bytes.fromhex("6ba7b8129dad11d180b400c04fd430c8")  # uuid.NAMESPACE_OID


def uuid5_oid_bytes(name: str) -> bytes:
    """The 16 bytes of uuid.uuid5(NAMESPACE_OID, name), hashed by the interpreter's own
    SHA-1 (uuid5 asks hashlib, which loads OpenSSL's libcrypto, ~3.5 MiB, into the fake
    node for it), without the uuid module (~75 KiB that nothing else in `run` loads)."""
    try:
        from _sha1 import sha1  # type: ignore[import-not-found]  # CPython's
    except ImportError:
        from hashlib import sha1
    digest = bytearray(sha1(_NAMESPACE_OID + name.encode()).digest()[:16])
    digest[6] = digest[6] & 0x0F | 0x50  # version 5
    digest[8] = digest[8] & 0x3F | 0x80  # RFC 4122 variant
    return bytes(digest)


def uuid5_oid(name: str) -> str:
    """str(uuid.uuid5(NAMESPACE_OID, name)): 8-4-4-4-12 lowercase hex digits."""
    h = uuid5_oid_bytes(name).hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def mig_uuid(seed: int, gpu: int, instance: MigInstanceSpec) -> str:
    key = f"cte-{seed}-{gpu}-mig-{instance.gpu_instance}-{instance.compute_instance}"
    return "MIG-" + str(uuid5_oid(key))


_INSTANCE_KEYS = {"gpu_instance", "compute_instance", "slices", "compute_slices", "memory_mib"}
MAX_MIG_DEVICES = 7  # nvmlDeviceGetMaxMigDeviceCount on A100/H100/H200


def _parse_instance(item: object, where: Where) -> MigInstanceSpec:
    mapping = expect_mapping(item, where, _INSTANCE_KEYS)
    for required in ("gpu_instance", "slices", "memory_mib"):
        if required not in mapping:
            raise where.error(required, "required for a MIG instance")
    slices = get_int(mapping, "slices", where, 1, low=1, high=8)
    compute = (get_int(mapping, "compute_slices", where, 1, low=1, high=slices)
               if "compute_slices" in mapping else None)
    return MigInstanceSpec(
        gpu_instance=get_int(mapping, "gpu_instance", where, 0, low=0, high=63),
        slices=slices,
        memory_mib=get_int(mapping, "memory_mib", where, 1, low=1, high=2**24),
        compute_instance=get_int(mapping, "compute_instance", where, 0, low=0, high=63),
        compute_slices=compute)


def parse_mig(raw: object, where: Where, gpus: int) -> tuple[MigSpec, ...]:
    """The `mig` key: a list of {gpu: ..., instances: [...]}."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise where.error("mig", "expected a list")
    out: list[MigSpec] = []
    seen: set[int] = set()
    for item in raw:
        item_where = where.child("mig", item)
        mapping = expect_mapping(item, item_where, {"gpu", "instances"})
        if "gpu" not in mapping or not isinstance(mapping.get("instances"), list):
            raise item_where.error(None, "expected gpu and a list of instances")
        targets = _gpu_list(mapping["gpu"], item_where, "gpu", gpus)
        if seen & set(targets):
            raise item_where.error("gpu", "a GPU is split twice")
        seen |= set(targets)
        instances = tuple(_parse_instance(i, item_where.child("instances", i))
                          for i in mapping["instances"])
        ids = [(i.gpu_instance, i.compute_instance) for i in instances]
        if not instances or len(instances) > MAX_MIG_DEVICES or len(set(ids)) != len(ids):
            raise item_where.error("instances", f"expected 1-{MAX_MIG_DEVICES} instances "
                                   "with distinct (gpu_instance, compute_instance)")
        out.append(MigSpec(targets, instances))
    return tuple(out)
