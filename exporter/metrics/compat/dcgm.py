"""dcgm-exporter's metric families, served from our own snapshot (`--metrics.compat
dcgm-exporter`): its names, TYPEs, units and labels, so dashboards, alerts, autoscalers and
cost tools written for it keep working.

Nothing here reads hardware: every value is one the sampler already has (the sweep's
catalogue values, the power, the NVLink reading, the XIDs, the profiling, MIG, Kubernetes
and Slurm collectors, the health verdict), converted into DCGM's unit. The fields and their
sources are a table (dcgm_fields.csv, with its source named there); a field whose source
is `-` is not served, and `summary()` says so in one log line at start. Rendered once per
snapshot, with the rest of the exposition (exporter/metrics/render.py).

The label set follows dcgm-exporter's template: `gpu`, `UUID`, `pci_bus_id`, `device`
(`nvidia<N>`), `modelName`, `Hostname` (or `hostname`), `DCGM_FI_DRIVER_VERSION`;
`GPU_I_PROFILE` and `GPU_I_ID` only on a MIG instance's samples (its profiling and
framebuffer fields); `pod`, `namespace`, `container` where the Kubernetes mapping is on
(empty on a device no container holds, as dcgm-exporter writes them); `hpc_job` where a
Slurm job holds the device. Every sample of one device carries the
same set; `DCGM_FI_DEV_XID_ERRORS` adds `err_code` and `err_msg`, the XID families `xid`,
the health family `health_watch` and `health_error_code`, as dcgm-exporter does.
"""

from __future__ import annotations

import csv
import os
import socket
import threading
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from exporter.collectors.jobs.reading import JobsReading
from exporter.collectors.kubernetes.reading import KubernetesReading
from exporter.collectors.mig.reading import MigReading
from exporter.collectors.profiling.reading import ProfilingReading
from exporter.health.model import FAILED, OK, UNKNOWN, WARNING, NodeHealth
from exporter.metrics.exposition import WRITER, go_float
from exporter.metrics.settings import HOSTNAME_LABELS
from exporter.sampling.snapshot import Snapshot

#: dcgm-exporter's default window of DCGM_EXP_XID_ERRORS_COUNT (--xid-count-window-size)
XID_WINDOW_MS = 300_000
#: DCGM's health results (dcgmHealthWatchResults_t): pass, warn, fail
HEALTH_RESULT = {WARNING: 10.0, FAILED: 20.0}
#: The watch systems dcgm-exporter reports per GPU, in its order
HEALTH_WATCHES = ("PCIE", "NVLINK", "PMU", "MCU", "MEM", "SM", "INFOROM", "THERMAL",
                  "POWER", "DRIVER")

_HERE = Path(__file__).parent


def _rows(name: str) -> list[dict[str, str]]:
    """A data file's rows (lines starting with # are comments)."""
    with open(_HERE / name, newline="") as f:
        return list(csv.DictReader(line for line in f if not line.startswith("#")))


@dataclass(frozen=True)
class DcgmField:
    """One dcgm-exporter field: its name, TYPE, help and unit as dcgm-exporter serves it,
    where its value comes from here and the factor from our unit to its unit."""

    name: str
    type: str  # gauge, counter or label
    unit: str
    list: str  # default (dcgm-exporter serves it out of the box) or extra
    source: str  # "-": not served
    scale: float
    family: str  # ours with the same meaning
    help: str
    note: str
    mig: str = ""  # a MIG GPU instance's source ("" : whole GPUs only)

    @property
    def served(self) -> bool:
        return self.source != "-"


FIELDS: tuple[DcgmField, ...] = tuple(
    DcgmField(r["field"], r["type"], r["unit"], r["list"], r["source"], float(r["scale"]),
              r["family"], r["help"], r["note"], r["mig"]) for r in _rows("dcgm_fields.csv"))
BY_NAME = {f.name: f for f in FIELDS}
MIG_SOURCES = ("", "mig:used", "mig:free", "mig:total")
# the sources a row may name (the part before `:`), each a rule below
SOURCES = ("-", "state", "identity", "gpm", "pcie_rate", "fb_used", "nvlink_traffic",
           "nvlink_errors", "xid_last", "xid_total", "xid_window", "health", "driver_version")
#: pcie_rate:KEY -> (its place in the sweep's (sent, received) rates, GPM's key)
PCIE_RATES = {"transmit": (0, "pcie_transmit_bytes_per_second"),
              "receive": (1, "pcie_receive_bytes_per_second")}
for _f in FIELDS:
    if (_f.source.partition(":")[0] not in SOURCES or _f.mig not in MIG_SOURCES
            or _f.type not in ("gauge", "counter", "label")):
        raise ValueError(f"dcgm_fields.csv: {_f.name}: source {_f.source!r}, type {_f.type!r}")
#: our check -> (DCGM health watch, DCGM failure code)
HEALTH_CHECKS = {r["check"]: (r["health_watch"], r["health_error_code"])
                 for r in _rows("dcgm_health.csv")}
XID_MESSAGES = {int(r["xid"]): r["message"] for r in _rows("xid_messages.csv")}
UNKNOWN_XID = "Unknown Error"
#: namespace, pod and container of a device no container holds, where the Kubernetes
#: mapping is on: empty, as dcgm-exporter writes them. An empty label is no label in a
#: query, and it keeps the scrape target's own pod off the sample under honor_labels
#: (Prometheus adds a target label only where the sample has none).
NO_POD = ("", "", "")


def unserved(profiling: bool = True, nvlink_traffic: bool = True,
             nvlink_errors: bool = True) -> list[tuple[DcgmField, str]]:
    """The fields not served, each with why: those we have no source for, and those
    whose source the configuration leaves unread."""
    out = [(f, f.note) for f in FIELDS if not f.served]
    off = [(profiling, "gpm:", "the profiling collector is off"),
           (nvlink_traffic, "nvlink_traffic", "NVLink traffic is not read under this "
                                              "profile"),
           (nvlink_errors, "nvlink_errors:", "NVLink errors are not read under this profile")]
    for on, prefix, why in off:
        if not on:
            out += [(f, why) for f in FIELDS if f.source.startswith(prefix)]
    return out


def summary(profiling: bool = True, nvlink_traffic: bool = True,
            nvlink_errors: bool = True) -> str:
    """The start's one log line: how many fields are served, and which are not, why."""
    missing = unserved(profiling, nvlink_traffic, nvlink_errors)
    served = sum(1 for f in FIELDS if f.type != "label") - len(missing)
    return (f"metrics compat dcgm-exporter: {served} DCGM fields served (the DCGM_FI_PROF_* "
            "ratios where the GPU has GPM: Hopper and later); not served: "
            + "; ".join(f"{f.name} ({why})" for f, why in missing))


def node_hostname() -> str:
    """The node's name as dcgm-exporter labels it: NODE_NAME (the downward API's, on
    Kubernetes), else the host name."""
    return os.environ.get("NODE_NAME") or socket.gethostname()


@dataclass(frozen=True)
class _Device:
    """A device dcgm-exporter reports on: a whole GPU, or one MIG GPU instance of it."""

    gpu: int
    instance: int | None
    labels: str  # the label text, without the braces' closing


class DcgmCompat:
    """Renders dcgm-exporter's families from a snapshot (and its health verdict).

    Holds one piece of state: the XID counts seen at earlier renders, for the windowed
    DCGM_EXP_XID_ERRORS_COUNT (a render is a scrape's, so counted between scrapes)."""

    def __init__(self, hostname: str = "", hostname_label: str = "Hostname"):
        if hostname_label not in HOSTNAME_LABELS:
            raise ValueError(f"hostname label {hostname_label!r}: one of {HOSTNAME_LABELS}")
        self.hostname = hostname or node_hostname()
        self.hostname_label = hostname_label
        self._xid_seen: dict[tuple[int, int], deque[tuple[float, int]]] = {}
        self._lock = threading.Lock()

    # -- the devices and their labels ---------------------------------------------------
    def devices(self, snapshot: Snapshot) -> list[_Device]:
        """Every identified GPU, then each MIG GPU instance, each with its label text."""
        pods = _pods(snapshot)
        k8s = "kubernetes" in snapshot.collectors  # the mapping is on (read or not yet)
        jobs = _jobs(snapshot)
        profiles = _mig_profiles(snapshot)
        out: list[_Device] = []
        for ident in snapshot.identities:
            if ident is None:
                continue
            gpu = ident.index
            base = {"gpu": str(gpu), "UUID": ident.uuid, "pci_bus_id": ident.pci_bus_id,
                    "device": f"nvidia{gpu}", "modelName": ident.name,
                    self.hostname_label: self.hostname,
                    "DCGM_FI_DRIVER_VERSION": snapshot.driver_version}
            for instance in (None, *sorted(gi for g, gi in profiles if g == gpu)):
                labels = dict(base)
                if instance is not None:
                    labels["GPU_I_PROFILE"] = profiles[(gpu, instance)]
                    labels["GPU_I_ID"] = str(instance)
                job = jobs.get((gpu, instance))
                if job:
                    labels["hpc_job"] = job
                pod = pods.get((gpu, instance), NO_POD if k8s else None)
                if pod is not None:
                    labels.update(zip(("namespace", "pod", "container"), pod, strict=True))
                out.append(_Device(gpu, instance, WRITER.labels(labels)[:-1]))
        return out

    # -- rendering ------------------------------------------------------------------------
    def render(self, snapshot: Snapshot, verdict: NodeHealth) -> bytes:
        """dcgm-exporter's families from a published value: the snapshot and its verdict."""
        devices = self.devices(snapshot)
        whole = [d for d in devices if d.instance is None]
        # what several fields read, worked out once a render
        xids = list(_xids(snapshot, whole))
        memory = _mig_memory(snapshot) if len(devices) > len(whole) else {}
        out: list[str] = []
        for f in FIELDS:
            if not f.served or f.type == "label":
                continue
            lines = list(self._lines(f, snapshot, verdict, whole, devices, xids, memory))
            if lines:
                out.append(f"# HELP {f.name} {f.help}\n# TYPE {f.name} {f.type}\n")
                out.extend(lines)
        return "".join(out).encode()

    def _lines(self, f: DcgmField, snapshot: Snapshot, verdict: NodeHealth,
               whole: list[_Device], devices: list[_Device], xids: list[tuple],
               memory: Mapping[tuple[int, int | None], Mapping[str, float]]) -> Iterator[str]:
        kind, _, key = f.source.partition(":")
        if kind == "gpm":
            yield from self._gpm_lines(f, key, snapshot, devices)
        elif kind == "xid_last":
            yield from _xid_last_lines(f, snapshot, whole)
        elif kind == "xid_total":
            for d, code, record in xids:
                yield f'{f.name}{d.labels},xid="{code}"}} {go_float(record.count)}\n'
        elif kind == "xid_window":
            yield from self._xid_window_lines(f, snapshot, xids)
        elif kind == "health":
            yield from _health_lines(f, verdict, whole)
        else:
            for d in whole:
                value = _value(kind, key, d.gpu, snapshot)
                if value is not None:
                    yield f"{f.name}{d.labels}}} {go_float(value * f.scale)}\n"
            if f.mig and memory:
                for d in devices:
                    value = memory.get((d.gpu, d.instance), {}).get(f.mig.partition(":")[2])
                    if d.instance is not None and value is not None:
                        yield f"{f.name}{d.labels}}} {go_float(value * f.scale)}\n"

    def _gpm_lines(self, f: DcgmField, key: str, snapshot: Snapshot,
                   devices: list[_Device]) -> Iterator[str]:
        reading = _reading(snapshot, "profiling", ProfilingReading)
        if reading is None:
            return
        for d in devices:
            if d.instance is None:
                profile = reading.gpus.get(d.gpu)
                got = profile.reading if profile is not None else None
            else:
                got = reading.instances.get((d.gpu, d.instance))
            value = got.values.get(key) if got is not None else None
            if value is not None:
                yield f"{f.name}{d.labels}}} {go_float(value * f.scale)}\n"

    def _xid_window_lines(self, f: DcgmField, snapshot: Snapshot,
                          xids: list[tuple]) -> Iterator[str]:
        """XIDs of each code in the last window: the count now less the count the newest
        render at or before the window's start saw (before the exporter has rendered one
        that old: the count, if the newest XID of the code is in the window)."""
        window = XID_WINDOW_MS / 1000
        start = snapshot.time - window
        with self._lock:
            for d, code, record in xids:
                seen = self._xid_seen.setdefault((d.gpu, code), deque())
                seen.append((snapshot.time, record.count))
                while len(seen) > 1 and seen[1][0] <= start:
                    seen.popleft()
                if seen[0][0] <= start:
                    value = record.count - seen[0][1]
                else:
                    value = record.count if record.last_seen >= start else 0
                yield (f'{f.name}{d.labels},window_size_in_ms="{XID_WINDOW_MS}",'
                       f'xid="{code}"}} {go_float(value)}\n')


def _value(kind: str, key: str, gpu: int, snapshot: Snapshot) -> float | None:
    """A whole GPU's value in our unit, or None where it has none."""
    if kind == "state":
        state = snapshot.readings.get(gpu)
        return state.get(key) if state is not None else None
    if kind == "identity":
        ident = snapshot.identities[gpu]
        return ident.values.get(key) if ident is not None else None
    if kind == "fb_used":  # DCGM's used excludes what the driver reserves
        state = snapshot.readings.get(gpu)
        used = state.get("memory_used_bytes") if state is not None else None
        if used is None:
            return None
        return used - (snapshot.readings[gpu].get("memory_reserved_bytes") or 0.0)
    if kind == "pcie_rate":
        return _pcie_rate(key, gpu, snapshot)
    h = snapshot.device_reads.get(gpu)
    if h is None:
        return None
    if kind == "nvlink_traffic":
        if h.nvlink_traffic is not None:
            sent, received = h.nvlink_traffic
        else:
            sent = _sum(link.transmit_bytes for link in h.nvlinks)
            received = _sum(link.receive_bytes for link in h.nvlinks)
        return None if sent is None and received is None else (sent or 0.0) + (received or 0.0)
    if kind == "nvlink_errors":
        return _sum(link.errors.get(key) for link in h.nvlinks)
    raise ValueError(f"unknown source {kind!r} in dcgm_fields.csv")


def _pcie_rate(key: str, gpu: int, snapshot: Snapshot) -> float | None:
    """PCIe bytes per second: GPM's, over the last profiling interval, where GPM is read;
    else the PCIe byte counters' rate between the sweep's last two reads of them. Both are
    the sampler's: a render (a scrape) never keeps a previous value of its own."""
    side, gpm_key = PCIE_RATES[key]
    reading = _reading(snapshot, "profiling", ProfilingReading)
    profile = reading.gpus.get(gpu) if reading is not None else None
    if profile is not None and profile.reading is not None:
        rate = profile.reading.rates.get(gpm_key)
        if rate is not None:
            return rate
    rates = snapshot.pcie_rates.get(gpu)
    return rates[side] if rates is not None else None


def _sum(values: Iterable[float | None]) -> float | None:
    got = [v for v in values if v is not None]
    return sum(got) if got else None


def _xids(snapshot: Snapshot, whole: list[_Device]) -> Iterator[tuple]:
    by_gpu = {d.gpu: d for d in whole}
    for (gpu, code), record in sorted(snapshot.xids.items()):
        if gpu in by_gpu:
            yield by_gpu[gpu], code, record


def _xid_last_lines(f: DcgmField, snapshot: Snapshot, whole: list[_Device]) -> Iterator[str]:
    """The code of each GPU's newest XID (0 before any), named in err_code and err_msg."""
    newest: dict[int, tuple[float, int]] = {}
    for (gpu, code), record in snapshot.xids.items():
        if record.count and (gpu not in newest or record.last_seen > newest[gpu][0]):
            newest[gpu] = (record.last_seen, code)
    for d in whole:
        code = newest.get(d.gpu, (0.0, 0))[1]
        message = XID_MESSAGES.get(code, UNKNOWN_XID)
        yield (f'{f.name}{d.labels},err_code="{code}",err_msg="{message}"}} '
               f"{go_float(code)}\n")


def _health_lines(f: DcgmField, health: NodeHealth, whole: list[_Device]) -> Iterator[str]:
    """Per GPU and DCGM watch: the worst of our checks that map to it (0 pass, 10 warn,
    20 fail) and the DCGM failure code of that check. Not yet judged is no pass, and
    dcgm-exporter documents no value for it (its 0 is DCGM's pass), so nothing is
    served for it: a GPU whose verdict is `unknown` (before the first judgement, while
    a check it needs cannot judge yet, or when judging failed) has no status at all, and
    a watch whose checks of ours are all unknown (or not applicable) is left out of a
    judged GPU's. A watch no check of ours maps to reports pass, as the table says."""
    for d in whole:
        verdict = health.gpus.get(d.gpu)
        if verdict is None or verdict.state == UNKNOWN:
            continue
        worst: dict[str, tuple[float, str]] = {}
        judged, mapped = set(), set()
        for check in verdict.checks:
            watch, code = HEALTH_CHECKS.get(check.name, ("", ""))
            mapped.add(watch)
            if check.state in (OK, WARNING, FAILED):
                judged.add(watch)
            result = HEALTH_RESULT.get(check.state, 0.0)
            if watch and result > worst.get(watch, (0.0, ""))[0]:
                worst[watch] = (result, code)
        for watch in HEALTH_WATCHES:
            if watch in mapped and watch not in judged:
                continue
            result, code = worst.get(watch, (0.0, "DCGM_FR_OK"))
            yield (f'{f.name}{d.labels},health_error_code="{code}",'
                   f'health_watch="{watch}"}} {go_float(result)}\n')


R = TypeVar("R")


def _reading(snapshot: Snapshot, collector: str, kind: type[R]) -> R | None:
    """A collector's last reading in the snapshot, if it is on and has read."""
    result = snapshot.collectors.get(collector)
    reading = result.reading if result is not None else None
    return reading if isinstance(reading, kind) else None


def _pods(snapshot: Snapshot) -> Mapping[tuple[int, int | None], tuple[str, str, str]]:
    """(GPU, GPU instance or None) -> (namespace, pod, container) of the first container
    holding it, where the Kubernetes mapping is on."""
    reading = _reading(snapshot, "kubernetes", KubernetesReading)
    out: dict[tuple[int, int | None], tuple[str, str, str]] = {}
    for device in sorted(reading.devices if reading is not None else (),
                         key=lambda d: (d.gpu, d.gpu_instance or -1, d.namespace, d.pod)):
        out.setdefault((device.gpu, device.gpu_instance),
                       (device.namespace, device.pod, device.container))
    return out


def _jobs(snapshot: Snapshot) -> Mapping[tuple[int, int | None], str]:
    """(GPU, GPU instance or None) -> the first Slurm job holding it, where the mapping
    is on (dcgm-exporter's hpc_job)."""
    reading = _reading(snapshot, "jobs", JobsReading)
    if reading is None:
        return {}
    out: dict[tuple[int, int | None], str] = {
        (gpu, None): ids[0] for gpu, ids in reading.jobs.items() if ids}
    out.update({key: ids[0] for key, ids in reading.instance_jobs.items() if ids})
    return out


def _mig_memory(snapshot: Snapshot) -> Mapping[tuple[int, int | None], dict[str, float]]:
    """(GPU, GPU instance) -> its memory in bytes: used, total and free."""
    reading = _reading(snapshot, "mig", MigReading)
    out: dict[tuple[int, int | None], dict[str, float]] = {}
    for d in reading.devices if reading is not None else ():
        key = (d.gpu, d.gpu_instance)
        if key in out or d.memory_used_bytes is None or d.memory_total_bytes is None:
            continue
        out[key] = {"used": d.memory_used_bytes, "total": d.memory_total_bytes,
                    "free": d.memory_total_bytes - d.memory_used_bytes}
    return out


def _mig_profiles(snapshot: Snapshot) -> Mapping[tuple[int, int], str]:
    """(GPU, GPU instance) -> its GPU instance profile (`3g.71gb`) for GPUs in MIG mode."""
    reading = _reading(snapshot, "mig", MigReading)
    if reading is None:
        return {}
    out: dict[tuple[int, int], str] = {}
    for d in reading.devices:
        if reading.mig_mode.get(d.gpu):
            # a compute instance's profile names its share first (`1c.3g.71gb`)
            profile = d.profile.split(".", 1)[1] if d.profile.count(".") == 2 else d.profile
            out.setdefault((d.gpu, d.gpu_instance), profile)
    return out
