"""The fake's field values (nvmlDeviceGetFieldValues), NVLink counters and XID events.

Catalogue fields answer the model's value in NVML's unit; the health fields (ECC,
retired pages, row remapping, recovery action, NVLink) follow the scenario's faults.
"""

from __future__ import annotations

import ctypes
import struct
import sys
import time
from array import array
from collections.abc import Sequence

import pynvml

from exporter.gpu import catalogue
from exporter.gpu import fields as fi
from exporter.gpu.device_read import ALL_LINKS
from exporter.sim.cstructs import target, value_of, write_pointer
from exporter.sim.fake_core import FakeCore
from exporter.sim.fake_model import FAULT_KEYS, STATIC_KEYS
from exporter.sim.physics import HANDLE_BASE, FakeGpu
from exporter.sim.scenarios import DRIVER_RECOVERY_CODES, FaultEvent

SUCCESS, ERROR_UNINITIALIZED, ERROR_INVALID_ARGUMENT, ERROR_NOT_SUPPORTED = 0, 1, 2, 3
EVENT_SET_BASE = 0x7E58_0000
NVLINK_BYTES_PER_SECOND = 12e9  # per link while training
_UINT, _ULL = pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
# One c_nvmlFieldValue_t (batched.FIELD_DTYPE) as struct packs it: fieldId, scopeId,
# timestamp, latencyUsec, valueType, nvmlReturn, value (for a few fields, struct costs a
# fraction of numpy's structured arrays)
_ENTRY = struct.Struct("<IIqqIIQ")
_CRC_DATA_LINK = {fid: link for link, fid in enumerate(fi.NVLINK_CRC_DATA)}
# the catalogue's per-link fields (and the data CRC fields read by hand): a new one is
# answered here without a change
_LINK_ENTRIES = {e.nvml.id: e for e in catalogue.PER_LINK if isinstance(e.nvml, catalogue.Field)}
_NVLINK_FIELDS = {*_LINK_ENTRIES, *fi.NVLINK_CRC_DATA}
_COUNTS = {  # field -> (fault kind, parameter), counted over faults begun so far
    fi.ECC_SBE_VOL_TOTAL: ("ecc", "corrected"), fi.ECC_SBE_AGG_TOTAL: ("ecc", "corrected"),
    fi.ECC_DBE_VOL_TOTAL: ("ecc", "uncorrected"), fi.ECC_DBE_AGG_TOTAL: ("ecc", "uncorrected"),
    fi.RETIRED_SBE: ("retired_pages", "single_bit"),
    fi.RETIRED_DBE: ("retired_pages", "double_bit"),
    fi.REMAPPED_COR: ("row_remap", "correctable"),
    fi.REMAPPED_UNC: ("row_remap", "uncorrectable"),
}
_FLAGS = {fi.RETIRED_PENDING: ("retired_pages", "pending"),
          fi.REMAPPED_PENDING: ("row_remap", "pending"),
          fi.REMAPPED_FAILURE: ("row_remap", "failure")}
_RETIRED = {fi.RETIRED_SBE, fi.RETIRED_DBE, fi.RETIRED_PENDING}
# an error entry counts at its nvlink fault's rate `<type>_per_second` (its label value)
_NVLINK_ERROR_PARAMS = {fid: f"{e.labels[0]}_per_second" for fid, e in _LINK_ENTRIES.items()
                        if e.family is catalogue.NVLINK_ERRORS}
_ERROR_COUNTERS = {pynvml.NVML_NVLINK_ERROR_DL_REPLAY: "replay_per_second",
                   pynvml.NVML_NVLINK_ERROR_DL_RECOVERY: "recovery_per_second",
                   pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT: "crc_flit_per_second",
                   pynvml.NVML_NVLINK_ERROR_DL_CRC_DATA: "crc_data_per_second"}

_CHANGES = object()  # a field whose answer depends on time or on the scenario's faults
_FAULT_KIND_OF = {**{f: kind for f, (kind, _) in {**_COUNTS, **_FLAGS}.items()},
                  fi.RECOVERY_ACTION: "recovery_action"}
FAULT_FIELDS = frozenset(_FAULT_KIND_OF)  # fields answered from the scenario's faults
# the catalogue's fields the model answers (its memory errors are fault fields)
_CATALOGUE_KEYS = {field_id: value.key for field_id, value in catalogue.BY_FIELD.items()
                   if field_id not in FAULT_FIELDS}


_ANSWER = struct.Struct("<IIQ")  # an entry's valueType, nvmlReturn and value (its last 16 bytes)
_WORDS = _ENTRY.size // 8  # an entry is 5 words of 8 bytes: the timestamp is the second
_SWAP = sys.byteorder == "big"  # entries are written little-endian, as struct packs them


class _FieldPlan:
    """One request's answer on one GPU: every entry as the call writes it (as words of
    8 bytes), the fixed answers filled in and timestamps left to the call, and the
    entries whose answer changes (their byte offset, field id, scope)."""

    __slots__ = ("words", "changing")

    def __init__(self, pairs: list[tuple[int, int]], answers: list):
        self.changing: list[tuple[int, int, int]] = []
        packed = bytearray(len(pairs) * _ENTRY.size)
        for i, ((field_id, scope), answer) in enumerate(zip(pairs, answers, strict=True)):
            if answer is _CHANGES:
                self.changing.append((i * _ENTRY.size + 24, field_id, scope))
                answer = None
            _ENTRY.pack_into(packed, i * _ENTRY.size, field_id, scope, 0, 0,
                             *((0, ERROR_NOT_SUPPORTED, 0) if answer is None
                               else (answer[0], SUCCESS, int(answer[1]))))
        self.words = array("q", packed)


def _fixed(gpu: FakeGpu, field_id: int, fault_kinds: frozenset[str]) -> bool:
    """Whether _field answers this field the same at any time, given the faults' kinds."""
    if field_id == fi.POWER_INSTANT:
        return False
    key = _CATALOGUE_KEYS.get(field_id)
    if key is not None:  # the model's values: a few stand still (a replay's may not)
        return not gpu.replays and (key in STATIC_KEYS or (
            key in FAULT_KEYS and FAULT_KEYS[key] not in fault_kinds))
    if gpu.replays and not gpu.provides("health"):
        return True  # NotSupported
    if field_id in _NVLINK_FIELDS:
        return field_id not in (fi.NVLINK_TX, fi.NVLINK_RX) and "nvlink" not in fault_kinds
    return _FAULT_KIND_OF.get(field_id) not in fault_kinds


class FieldSymbols(FakeCore):
    """Mixin of FakeNvmlLibrary."""

    def _nvmlDeviceGetFieldValues(self, handle, count, values) -> int:
        gpu = self.gpu(handle)
        if gpu is None:
            return ERROR_UNINITIALIZED if self.initialized <= 0 else ERROR_INVALID_ARGUMENT
        n = value_of(count)
        if n < 0:
            return ERROR_INVALID_ARGUMENT
        buffer = memoryview(target(values)).cast("B")
        if len(buffer) < n * _ENTRY.size:
            raise ValueError("nvmlDeviceGetFieldValues: count is larger than the array")
        t = self.now()
        entries = buffer[:n * _ENTRY.size]
        words = entries.cast("q")
        plan = self._field_plan(gpu, words[0::_WORDS].tobytes(), entries, t)
        words[:] = plan.words
        stamps = array("q", [int(t * 1e6)]) * n
        if _SWAP:
            stamps.byteswap()
        words[1::_WORDS] = stamps
        field = self._field
        for offset, field_id, scope in plan.changing:
            answer = field(gpu, field_id, scope, t)
            _ANSWER.pack_into(buffer, offset, *((0, ERROR_NOT_SUPPORTED, 0) if answer is None
                                                else (answer[0], SUCCESS, int(answer[1]))))
        if self.costs is not None:
            self.pending_cost = self.costs.of_fields(
                [entry[0] for entry in _ENTRY.iter_unpack(entries)])
        return SUCCESS

    def _field_plan(self, gpu: FakeGpu, asked: bytes, entries: memoryview, t: float
                    ) -> _FieldPlan:
        """The answer to this request on this GPU (`asked`: the first word of each entry,
        its field id and scope) with what no time or fault of this scenario can change
        filled in, worked out once per GPU, request and scenario (_fixed_answers). A
        GPU's device read is 121 fields (18 links), most of them fixed: the fake's Python
        for them cost more than the H200 charges for the whole call."""
        by_gpu = self.fixed_answers.get(asked)  # emptied whenever the scenario is set
        if by_gpu is None:
            if len(self.fixed_answers) >= 64:
                self.fixed_answers.clear()
            by_gpu = self.fixed_answers[asked] = {}
        plan = by_gpu.get(gpu.index)
        if plan is None:
            pairs = [entry[:2] for entry in _ENTRY.iter_unpack(entries)]
            plan = by_gpu[gpu.index] = _FieldPlan(pairs, self._fixed_answers(gpu, pairs, t))
        return plan

    def _fixed_answers(self, gpu: FakeGpu, asked: Sequence[tuple[int, int]], t: float
                       ) -> list:
        """Per entry asked, its answer where no time or fault of this scenario can change
        it (a healthy link's state and error counters, a static flag), else _CHANGES;
        worked out by _field itself."""
        kinds = self.fault_kinds
        return [self._field(gpu, field_id, scope, t)
                if _fixed(gpu, field_id, kinds) else _CHANGES
                for field_id, scope in asked]

    def _field(self, gpu: FakeGpu, field_id: int, scope: int, t: float
               ) -> tuple[int, float] | None:
        if field_id == fi.POWER_INSTANT:
            if not gpu.provides("power_watts"):
                return None
            period = self.scenario.device.power_update_period_seconds
            return _UINT, round(gpu.instant_power(t, period) * 1000)
        key = _CATALOGUE_KEYS.get(field_id)
        if key is not None:
            answer = self.nvml_units(gpu, key)
            return None if answer is None else (_ULL, answer)
        if gpu.replays and not gpu.provides("health"):
            return None
        if field_id in (fi.NVLINK_TX, fi.NVLINK_RX) and scope == ALL_LINKS:
            # the driver's sum over every link; the cost model charges it as one field
            links = range(self.scenario.device.nvlinks)
            return _ULL, sum(self._nvlink_field(gpu, field_id, link, t - self.start)[1]
                             for link in links)
        if field_id in _NVLINK_FIELDS:
            link = _CRC_DATA_LINK.get(field_id, scope)
            if not 0 <= link < self.scenario.device.nvlinks:
                return None
            return self._nvlink_field(gpu, field_id, link, t - self.start)
        if field_id == fi.NVLINK_LINK_COUNT:
            return _UINT, self.scenario.device.nvlinks
        answer = self._fault_field(gpu.index, field_id, t - self.start)
        return None if answer is None else (_ULL, answer)

    def _fault_field(self, gpu: int, field_id: int, since: float) -> int | None:
        """ECC, retired pages, remapped rows and recovery action, from the faults so far."""
        if field_id in _RETIRED and not self.scenario.device.retired_pages:
            return None  # Hopper replaced page retirement by row remapping
        if field_id in _COUNTS:
            kind, param = _COUNTS[field_id]
            return int(sum(e.params[param] for e in self.faults(kind, gpu, since, started=True)))
        if field_id in _FLAGS:
            kind, param = _FLAGS[field_id]
            return int(any(e.params[param] for e in self.faults(kind, gpu, since)))
        if field_id == fi.ECC_CURRENT:
            return 1
        if field_id == fi.RECOVERY_ACTION:
            actions = self.faults("recovery_action", gpu, since)
            return DRIVER_RECOVERY_CODES[actions[-1].params["action"]] if actions else 0
        return None

    # -- NVLink ------------------------------------------------------------------------
    def _nvlink_errors(self, gpu: int, link: int, param: str, t: float) -> int:
        total = 0.0
        for event in self.faults("nvlink", gpu, t, started=True):
            if event.params["link"] in (None, link):  # a type no scenario names: 0
                total += event.params.get(param, 0.0) * event.active_seconds(t)
        return int(total)

    def _nvlink_up(self, gpu: int, link: int, t: float) -> bool:
        return not any(e.params["down"] and e.params["link"] in (None, link)
                       for e in self.faults("nvlink", gpu, t))

    def _nvlink_field(self, gpu: FakeGpu, field_id: int, link: int, since: float
                      ) -> tuple[int, float]:
        quiet = "nvlink" not in self.fault_kinds  # no NVLink faults: all up, no errors
        up = quiet or self._nvlink_up(gpu.index, link, since)
        if field_id == fi.NVLINK_STATE:
            return _UINT, int(up)
        if field_id in (fi.NVLINK_TX, fi.NVLINK_RX):  # KiB counters
            rate = NVLINK_BYTES_PER_SECOND if gpu.training and up else 0.0
            return _ULL, int(max(0.0, since) * rate / 1024) + 1000 * (link + 1)
        if quiet:
            return _ULL, 0
        param = _NVLINK_ERROR_PARAMS.get(field_id, "crc_data_per_second")
        return _ULL, self._nvlink_errors(gpu.index, link, param, since)

    def _nvmlDeviceGetNvLinkErrorCounter(self, handle, link, counter, result) -> int:
        link_no, kind = value_of(link), _ERROR_COUNTERS.get(value_of(counter))
        if kind is None or not 0 <= link_no < self.scenario.device.nvlinks:
            return ERROR_INVALID_ARGUMENT
        return self.device_call(handle, result, lambda g: self._nvlink_errors(
            g.index, link_no, kind, self.elapsed()))

    def _nvmlDeviceGetNvLinkState(self, handle, link, active) -> int:
        link_no = value_of(link)
        if not 0 <= link_no < self.scenario.device.nvlinks:
            return ERROR_INVALID_ARGUMENT
        return self.device_call(handle, active,
                                lambda g: int(self._nvlink_up(g.index, link_no, self.elapsed())))

    # -- events (XIDs) -------------------------------------------------------------
    def _nvmlEventSetCreate(self, event_set) -> int:
        if self.initialized <= 0:
            return ERROR_UNINITIALIZED
        with self._lock:
            self._next_set += 1
            number = self._next_set
            self._event_sets[number] = {"gpus": set(), "delivered": set()}
        write_pointer(event_set, EVENT_SET_BASE + number)
        return SUCCESS

    def _event_set(self, event_set) -> dict | None:
        address = ctypes.cast(event_set, ctypes.c_void_p).value or 0
        return self._event_sets.get(address - EVENT_SET_BASE)

    def _nvmlDeviceRegisterEvents(self, handle, event_types, event_set) -> int:
        gpu = self.gpu(handle)
        registry = self._event_set(event_set)
        if gpu is None or registry is None:
            return ERROR_INVALID_ARGUMENT
        if value_of(event_types) & ~pynvml.nvmlEventTypeXidCriticalError:
            return ERROR_NOT_SUPPORTED  # like NVML: one unsupported bit registers nothing
        registry["gpus"].add(gpu.index)
        return SUCCESS

    def _due_xid(self, registry: dict) -> tuple[int, FaultEvent] | None:
        t = self.elapsed()
        for number, event in enumerate(self.scenario.events):
            if (event.kind == "xid" and t >= event.at and number not in registry["delivered"]
                    and (event.gpu is None or event.gpu in registry["gpus"])):
                return number, event
        return None

    def _nvmlEventSetWait_v2(self, event_set, data, timeout_ms) -> int:
        registry = self._event_set(event_set)
        if registry is None:
            return ERROR_INVALID_ARGUMENT
        deadline = time.monotonic() + value_of(timeout_ms) / 1000.0
        while True:
            with self._lock:
                due = self._due_xid(registry)
                if due is not None:
                    registry["delivered"].add(due[0])
            if due is not None:
                break
            left = deadline - time.monotonic()
            if left <= 0:
                return pynvml.NVML_ERROR_TIMEOUT
            # sleep until the next XID is due (checked at least every 50 ms while one is
            # pending, since the fake's clock may run faster than the wall clock)
            pending = any(e.kind == "xid" and n not in registry["delivered"]
                          for n, e in enumerate(self.scenario.events))
            if self._released.wait(min(left, 0.05) if pending else left):
                return pynvml.NVML_ERROR_TIMEOUT
        event = due[1]
        out = target(data)
        gpu = event.gpu if event.gpu is not None else min(registry["gpus"])
        self.handles.write(out.device, HANDLE_BASE + gpu)
        out.eventType = pynvml.nvmlEventTypeXidCriticalError
        out.eventData = event.params["code"]
        return SUCCESS

    def _nvmlEventSetFree(self, event_set) -> int:
        address = ctypes.cast(event_set, ctypes.c_void_p).value or 0
        with self._lock:
            return SUCCESS if self._event_sets.pop(address - EVENT_SET_BASE, None) else (
                ERROR_INVALID_ARGUMENT)
