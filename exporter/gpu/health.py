"""GPU health read every few sweeps: ECC, retired pages, row remapping, recovery action
and NVLink, in as few NVML calls as possible.

Everything field-based goes into one batched nvmlDeviceGetFieldValues request per GPU
(NVLink counters with the link as scope id), so 18 links cost one call, not 90.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from exporter.gpu import fields as fi

if TYPE_CHECKING:  # the reading needs the backend; the dataclasses must not need NVML
    from exporter.gpu.backend import NvmlBackend

FI_REMAPPED = {"correctable": fi.REMAPPED_COR, "uncorrectable": fi.REMAPPED_UNC}
FI_ECC = {  # (type, counter) -> field
    ("corrected", "volatile"): fi.ECC_SBE_VOL_TOTAL,
    ("uncorrected", "volatile"): fi.ECC_DBE_VOL_TOTAL,
    ("corrected", "aggregate"): fi.ECC_SBE_AGG_TOTAL,
    ("uncorrected", "aggregate"): fi.ECC_DBE_AGG_TOTAL,
}
FI_NVLINK_ERRORS = {"replay": fi.NVLINK_REPLAY, "recovery": fi.NVLINK_RECOVERY,
                    "crc_flit": fi.NVLINK_CRC_FLIT}
ALL_LINKS = 0xFFFFFFFF  # scope id of NVLink traffic fields: the sum over every link


@dataclass(frozen=True)
class NvlinkReads:
    """Which NVLink fields a health read asks for: what the metric selection wants
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
class GpuHealth:
    time: float
    ecc_errors: dict[tuple[str, str], float]  # (corrected|uncorrected, volatile|aggregate)
    retired_pages: dict[str, float]  # single_bit / double_bit
    retired_pages_pending: float | None
    remapped_rows: dict[str, float]  # correctable / uncorrectable
    row_remap_pending: float | None
    row_remap_failure: float | None
    recovery_action: str | None
    nvlinks: tuple[NvLink, ...]
    # bytes sent and received over all links, where traffic was read for all links at once
    nvlink_traffic: tuple[float | None, float | None] | None = None


def health_requests(nvlinks: int, reads: NvlinkReads = NvlinkReads()
                    ) -> list[int | tuple[int, int]]:
    """The field requests of one health read, for a GPU with `nvlinks` links."""
    requests: list[int | tuple[int, int]] = [
        *FI_ECC.values(), fi.RETIRED_SBE, fi.RETIRED_DBE, fi.RETIRED_PENDING,
        *FI_REMAPPED.values(), fi.REMAPPED_PENDING, fi.REMAPPED_FAILURE, fi.RECOVERY_ACTION]
    per_link_traffic = reads.traffic and reads.traffic_per_link
    for link in range(nvlinks):
        requests += [(fi.NVLINK_STATE, link)] if reads.state else []
        requests += [(fi.NVLINK_TX, link), (fi.NVLINK_RX, link)] if per_link_traffic else []
        requests += [(fid, link) for fid in FI_NVLINK_ERRORS.values()] if reads.errors else []
    if reads.errors:
        requests += [(fid, 0) for fid in fi.NVLINK_CRC_DATA[:nvlinks]]
    if nvlinks and reads.traffic and not reads.traffic_per_link:
        requests += [(fi.NVLINK_TX, ALL_LINKS), (fi.NVLINK_RX, ALL_LINKS)]
    return requests


def _traffic_totals(backend: NvmlBackend, gpu: int, nvlinks: int,
                    got: dict[tuple[int, int], float]) -> tuple[float | None, float | None]:
    """Bytes over all links: the all-links fields, else (a driver that does not answer
    them) the per-link fields summed."""
    totals = got.get((fi.NVLINK_TX, ALL_LINKS)), got.get((fi.NVLINK_RX, ALL_LINKS))
    if None in totals:
        per_link = backend.scoped_fields(gpu, [(fid, link) for link in range(nvlinks)
                                               for fid in (fi.NVLINK_TX, fi.NVLINK_RX)])
        summed = []
        for fid in (fi.NVLINK_TX, fi.NVLINK_RX):
            values = [v for (f, _), v in per_link.items() if f == fid]
            summed.append(sum(values) if values else None)
        totals = summed[0], summed[1]
    return tuple(None if v is None else v * 1024 for v in totals)  # type: ignore[return-value]


def read_health(backend: NvmlBackend, gpu: int, nvlinks: int, now: float,
                reads: NvlinkReads = NvlinkReads()) -> GpuHealth | None:
    handle = backend.handle(gpu)
    if handle is None:
        return None
    got = backend.scoped_fields(gpu, health_requests(nvlinks, reads))

    def value(fid: int, scope: int = 0) -> float | None:
        return got.get((fid, scope))

    links = []
    per_link = reads.state or reads.errors or (reads.traffic and reads.traffic_per_link)
    for link in range(nvlinks if per_link else 0):
        state = value(fi.NVLINK_STATE, link)
        errors = {name: v for name, fid in FI_NVLINK_ERRORS.items()
                  if (v := value(fid, link)) is not None}
        crc_data = None
        if not reads.errors:
            pass
        elif link < len(fi.NVLINK_CRC_DATA):
            crc_data = value(fi.NVLINK_CRC_DATA[link])
        else:
            crc_data = backend.call("nvmlDeviceGetNvLinkErrorCounter",
                                    handle, link,
                                    fi.NVLINK_ERROR_DL_CRC_DATA, gpu=gpu)
        if crc_data is not None:
            errors["crc_data"] = float(crc_data)
        tx, rx = value(fi.NVLINK_TX, link), value(fi.NVLINK_RX, link)
        links.append(NvLink(link, None if state is None else bool(state),
                            None if tx is None else tx * 1024,
                            None if rx is None else rx * 1024, errors))
    action = value(fi.RECOVERY_ACTION)
    return GpuHealth(
        time=now,
        ecc_errors={key: v for key, fid in FI_ECC.items() if (v := value(fid)) is not None},
        retired_pages={name: v for name, fid in (("single_bit", fi.RETIRED_SBE),
                                                 ("double_bit", fi.RETIRED_DBE))
                       if (v := value(fid)) is not None},
        retired_pages_pending=value(fi.RETIRED_PENDING),
        remapped_rows={name: v for name, fid in FI_REMAPPED.items()
                       if (v := value(fid)) is not None},
        row_remap_pending=value(fi.REMAPPED_PENDING),
        row_remap_failure=value(fi.REMAPPED_FAILURE),
        recovery_action=None if action is None else fi.RECOVERY_ACTIONS.get(int(action),
                                                                          f"code_{int(action)}"),
        nvlinks=tuple(links),
        nvlink_traffic=(_traffic_totals(backend, gpu, nvlinks, got)
                        if nvlinks and reads.traffic and not reads.traffic_per_link else None),
    )
