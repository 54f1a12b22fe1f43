"""A GPU's device read, in the slow sweep: ECC, retired pages, row remapping, recovery action
and NVLink, in as few NVML calls as possible, as one reading the health checks take whole.

The memory errors are catalogue entries (gpu/catalogue.py, MEMORY_ERRORS), read with the
slow sweep's other fields in its one batched request; this read gathers their
values. The recovery action and the catalogue's per-link entries (PER_LINK) go into one
batched nvmlDeviceGetFieldValues request per GPU (the link as scope id), so 18 links cost
one call, not 90.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from exporter.gpu import catalogue
from exporter.gpu import fields as fi

if TYPE_CHECKING:  # the reading needs the backend; the dataclasses must not need NVML
    from exporter.families import Family
    from exporter.gpu.backend import NvmlBackend


def _link_fields(*families: Family) -> tuple[tuple[int, float, tuple[str, ...]], ...]:
    """(field id, scale, label values after `link`) of the families' per-link entries."""
    return tuple((e.nvml.id, e.scale, e.labels) for f in families
                 for e in catalogue.per_link(f) if isinstance(e.nvml, catalogue.Field))


# the catalogue's per-link entries, by what the read asks them for
_STATE = _link_fields(catalogue.LINK_UP)
_TRAFFIC = _link_fields(catalogue.NVLINK_TX, catalogue.NVLINK_RX)  # sent, received
_ERRORS = _link_fields(catalogue.NVLINK_ERRORS)
# data CRC errors are read by hand below: a field per link for links 0-11, a call beyond
ALL_LINKS = 0xFFFFFFFF  # scope id of NVLink traffic fields: the sum over every link


@dataclass(frozen=True)
class NvlinkReads:
    """Which NVLink fields a device read asks for: what the metric selection wants
    (exporter/metrics/selection.py), so an unwanted family costs no field reads. Traffic
    not per link is one all-links field each for TX and RX instead of one per link."""

    state: bool = True
    errors: bool = True
    traffic: bool = True
    traffic_per_link: bool = True


@dataclass(frozen=True)
class NvLink:
    link: int
    up: bool | None
    transmit_bytes: float | None = None
    receive_bytes: float | None = None
    errors: dict[str, float] = field(default_factory=dict)  # replay, recovery, crc_flit, ...


@dataclass(frozen=True)
class DeviceRead:
    time: float
    # (corrected|uncorrected, volatile|aggregate): the ECC entries' label values
    ecc_errors: dict[tuple[str, ...], float]
    retired_pages: dict[str, float]  # single_bit / double_bit
    retired_pages_pending: float | None
    remapped_rows: dict[str, float]  # correctable / uncorrectable
    row_remap_pending: float | None
    row_remap_failure: float | None
    recovery_action: str | None
    nvlinks: tuple[NvLink, ...]
    # bytes sent and received over all links, where traffic was read for all links at once
    nvlink_traffic: tuple[float | None, float | None] | None = None


def device_read_requests(nvlinks: int, reads: NvlinkReads = NvlinkReads()
                    ) -> list[int | tuple[int, int]]:
    """The field requests of one device read, for a GPU with `nvlinks` links."""
    requests: list[int | tuple[int, int]] = [fi.RECOVERY_ACTION]
    per_link_traffic = reads.traffic and reads.traffic_per_link
    for link in range(nvlinks):
        wanted = (*(_STATE if reads.state else ()), *(_TRAFFIC if per_link_traffic else ()),
                  *(_ERRORS if reads.errors else ()))
        requests += [(fid, link) for fid, _, _ in wanted]
    if reads.errors:
        requests += [(fid, 0) for fid in fi.NVLINK_CRC_DATA[:nvlinks]]
    if nvlinks and reads.traffic and not reads.traffic_per_link:
        requests += [(fid, ALL_LINKS) for fid, _, _ in _TRAFFIC]
    return requests


# One link's keys into the device read's answer: its state; (type, key, scale) of each
# error counter; its data CRC field (None: links 12+, a call); (key, scale) of TX and RX.
_LinkKeys = tuple[tuple[int, int], tuple[tuple[str, tuple[int, int], float], ...],
                  tuple[int, int] | None, tuple[tuple[tuple[int, int], float], ...]]
_CRC_CALL = "nvmlDeviceGetNvLinkErrorCounter"


@functools.lru_cache(maxsize=64)
def _layout(nvlinks: int, reads: NvlinkReads) -> tuple[
        tuple[int | tuple[int, int], ...], tuple[_LinkKeys, ...],
        tuple[tuple[str, tuple[int, ...]], ...]]:
    """The requests of a device read, each link's keys into the answer, and the data CRC
    calls (links 12+): worked out once per link count and selection, not every read."""
    per_link = reads.state or reads.errors or (reads.traffic and reads.traffic_per_link)
    links = tuple(((_STATE[0][0], link),
                   tuple((kind, (fid, link), scale) for fid, scale, (kind,) in _ERRORS),
                   (fi.NVLINK_CRC_DATA[link], 0) if link < len(fi.NVLINK_CRC_DATA) else None,
                   tuple(((fid, link), scale) for fid, scale, _ in _TRAFFIC))
                  for link in range(nvlinks if per_link else 0))
    calls = tuple((_CRC_CALL, (link, fi.NVLINK_ERROR_DL_CRC_DATA))
                  for link in range(len(fi.NVLINK_CRC_DATA), len(links)))
    return tuple(device_read_requests(nvlinks, reads)), links, calls


def _traffic_totals(backend: NvmlBackend, gpu: int, nvlinks: int,
                    got: dict[tuple[int, int], float]) -> tuple[float | None, float | None]:
    """Bytes over all links: the all-links fields, else (a driver that does not answer
    them) the per-link fields summed."""
    totals = [got.get((fid, ALL_LINKS)) for fid, _, _ in _TRAFFIC]
    if None in totals:
        per_link = backend.scoped_fields(gpu, [(fid, link) for link in range(nvlinks)
                                               for fid, _, _ in _TRAFFIC])
        totals = []
        for fid, _, _ in _TRAFFIC:
            values = [v for (f, _), v in per_link.items() if f == fid]
            totals.append(sum(values) if values else None)
    sent, received = (None if v is None else v * scale
                      for v, (_, scale, _) in zip(totals, _TRAFFIC, strict=True))
    return sent, received


def _by_labels(values: Mapping[str, float], family: Family) -> dict[tuple[str, ...], float]:
    """A memory-error family's values by its entries' label values."""
    return {e.labels: values[e.key] for e in catalogue.FAMILIES[family] if e.key in values}


def read_device(backend: NvmlBackend, gpu: int, nvlinks: int, now: float,
                values: Mapping[str, float],
                reads: NvlinkReads = NvlinkReads()) -> DeviceRead | None:
    """`values`: the sweep's state, where it has just read the memory-error entries (the
    slow sweep's batch); this read asks NVML only for the recovery action and NVLink."""
    handle = backend.handle(gpu)
    if handle is None:
        return None
    requests, link_keys, crc_calls = _layout(nvlinks, reads)
    got = backend.scoped_fields(gpu, requests)
    value = got.get  # by (field, scope): ~120 a GPU, no helper call each
    crc_read = backend.bound_calls(gpu, crc_calls) if reads.errors else ()

    links = []
    for link, (state_key, error_keys, crc_key, traffic_keys) in enumerate(link_keys):
        state = value(state_key)
        errors = {kind: v * scale for kind, key, scale in error_keys
                  if (v := value(key)) is not None}
        crc_data = None
        if not reads.errors:
            pass
        elif crc_key is not None:
            crc_data = value(crc_key)
        else:
            crc_data = crc_read[link - len(fi.NVLINK_CRC_DATA)](handle)
        if crc_data is not None:
            errors["crc_data"] = float(crc_data)
        tx, rx = (None if (v := value(key)) is None else v * scale
                  for key, scale in traffic_keys)
        links.append(NvLink(link, None if state is None else bool(state), tx, rx, errors))
    action = value((fi.RECOVERY_ACTION, 0))
    return DeviceRead(
        time=now,
        ecc_errors=_by_labels(values, catalogue.ECC),
        retired_pages={cause: v for (cause,), v in _by_labels(values, catalogue.RETIRED).items()},
        retired_pages_pending=values.get("retired_pages_pending"),
        remapped_rows={kind: v for (kind,), v in _by_labels(values, catalogue.REMAPPED).items()},
        row_remap_pending=values.get("row_remap_pending"),
        row_remap_failure=values.get("row_remap_failure"),
        recovery_action=None if action is None else fi.DRIVER_RECOVERY_TOKENS.get(
            int(action), f"code_{int(action)}"),
        nvlinks=tuple(links),
        nvlink_traffic=(_traffic_totals(backend, gpu, nvlinks, got)
                        if nvlinks and reads.traffic and not reads.traffic_per_link else None),
    )
