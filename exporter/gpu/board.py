"""The board checks read seldom (at start, then every --sweep.board-interval): NVLink
fabric registration (nvmlDeviceGetGpuFabricInfoV) and InfoROM validity
(nvmlDeviceValidateInforom). Two calls per GPU a minute: neither changes by the second.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the reading needs the backend; the dataclasses must not need NVML
    from exporter.gpu.backend import NvmlBackend

# nvml.h nvmlGpuFabricState_t
FABRIC_STATES = {0: "not_supported", 1: "not_started", 2: "in_progress", 3: "completed"}
# nvml.h NVML_GPU_FABRIC_HEALTH_MASK_*: (name, shift, width mask, the value that is bad)
FABRIC_HEALTH_BAD = (("degraded_bandwidth", 0, 0x3, (1,)),
                     ("route_recovery", 2, 0x3, (1,)),
                     ("route_unhealthy", 4, 0x3, (1,)),
                     ("access_timeout_recovery", 6, 0x3, (1,)),
                     ("incorrect_configuration", 8, 0xF, tuple(range(2, 16))))


@dataclass(frozen=True)
class FabricInfo:
    state: str  # not_supported, not_started, in_progress, completed
    status: str  # the registration's NVML return: "Success" or an error name
    health_mask: int
    clique_id: int
    cluster_uuid: str

    @property
    def degradations(self) -> tuple[str, ...]:
        """The health mask's bad bits, by name."""
        return tuple(name for name, shift, mask, bad in FABRIC_HEALTH_BAD
                     if (self.health_mask >> shift) & mask in bad)


@dataclass(frozen=True)
class BoardRead:
    time: float
    fabric: FabricInfo | None  # None: the driver does not say (NotSupported, an error)
    fabric_error: str | None  # why fabric is None
    inforom_valid: bool | None  # None: not supported or the call failed
    inforom_error: str | None


def _uuid(raw) -> str:
    data = bytes(raw)
    if not any(data):
        return ""
    h = data.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def read_fabric(backend: NvmlBackend, gpu: int, handle) -> tuple[FabricInfo | None,
                                                                  str | None]:
    nvml = backend.nvml
    struct = getattr(nvml, "c_nvmlGpuFabricInfoV_t", None)
    if struct is None:
        return None, "FunctionNotFound"
    info = struct()
    answer, error = backend.attempt("nvmlDeviceGetGpuFabricInfoV", handle,
                                    ctypes.byref(info), gpu=gpu)
    if error is not None:
        return None, error
    status = int(info.status)
    status_name = "Success" if status == 0 else _error_name(nvml, status)
    return FabricInfo(FABRIC_STATES.get(int(info.state), f"state_{int(info.state)}"),
                      status_name, int(info.healthMask), int(info.cliqueId),
                      _uuid(info.clusterUuid)), None


def _error_name(nvml, code: int) -> str:
    try:
        cls = type(nvml.NVMLError(code))
    except Exception:  # noqa: BLE001 - an unknown code is still a failed status
        return f"error_{code}"
    return cls.__name__.removeprefix("NVMLError_")


def read_board(backend: NvmlBackend, gpu: int, now: float) -> BoardRead | None:
    handle = backend.handle(gpu)
    if handle is None:
        return None
    fabric, fabric_error = read_fabric(backend, gpu, handle)
    _, error = backend.attempt("nvmlDeviceValidateInforom", handle, gpu=gpu,
                               expected=("CorruptedInforom",))
    valid = None if error not in (None, "CorruptedInforom") else error is None
    return BoardRead(now, fabric, fabric_error, valid, error)
