"""The sweep loop: the catalogue's values of every GPU, each cadence when it is due.

Every sweep reads the cheap values; the slow sweep (every --sweep.health-interval) adds the
slowly changing and the costly ones (PCIe counters, ECC, row remapping) to the sweep's
batched call, and the device read's own batched call per GPU (the recovery action and
NVLink); the energy interval adds the energy counter. Clock-event reasons are accumulated
into seconds sweep to sweep, the PCIe byte counters give a rate over the sweep's own previous
read of them (dcgm-exporter's DCGM_FI_PROF_PCIE_*_BYTES where GPM is not read), and each
sweep feeds the straggler window.
"""

from __future__ import annotations

from collections.abc import Callable

from exporter.gpu import catalogue
from exporter.gpu.board import BoardRead, read_board
from exporter.gpu.device_read import DeviceRead, NvlinkReads, read_device
from exporter.gpu.fields import CLOCK_EVENT_REASONS
from exporter.gpu.reading import GpuReading, read_gpu, read_identity
from exporter.sampling.buffers import SweepBuffer
from exporter.sampling.clock import Clock
from exporter.sampling.gpus import GpuSet
from exporter.sampling.loops import Loop

#: the PCIe byte counters a rate is kept of: sent, received
PCIE_COUNTERS = ("pcie_transmit_bytes", "pcie_receive_bytes")


class SweepSampler:
    def __init__(self, gpus: GpuSet, clock: Clock, interval: float, slow_interval: float,
                 energy_interval: float, board_interval: float = 60.0, *,
                 on_recovered: Callable[[int], None] | None = None,
                 nvlink_reads: NvlinkReads | None = None):
        """`on_recovered(gpu)`: a lost GPU answers again; `nvlink_reads`: the NVLink fields
        the metric selection needs (swapped whole on a reload)."""
        self.gpus, self.clock = gpus, clock
        self.interval = interval
        self.every = {catalogue.SLOW: slow_interval, catalogue.ENERGY: energy_interval}
        self.readings: dict[int, GpuReading] = {}
        self.device_reads: dict[int, DeviceRead] = {}
        self.board: dict[int, BoardRead] = {}  # fabric and InfoROM: at start, then seldom
        self.board_interval = board_interval
        self.clock_event_seconds: dict[tuple[int, str], float] = {}
        self._reason_keys: dict[int, list[tuple[tuple[int, str], int]]] = {}
        # gpu -> bytes per second sent and received over PCIe between the last two reads
        self.pcie_rates: dict[int, tuple[float | None, float | None]] = {}
        self._pcie_read: dict[int, tuple[float, tuple[float | None, ...]]] = {}
        self._last_read: dict[tuple[int, str], float] = {}  # (gpu, cadence) -> epoch
        self._last_reading_time: dict[int, float] = {}
        self.buffer: SweepBuffer | None = None
        self.recorder: Callable[[int, GpuReading], None] | None = None
        self.on_recovered = on_recovered
        self.nvlink_reads = nvlink_reads or NvlinkReads()

    def _due(self, gpu: int, now: float) -> list[str]:
        """The cadences due for this GPU now (a little early rather than a sweep late)."""
        due = [catalogue.SWEEP]
        for cadence, every in self.every.items():
            last = self._last_read.get((gpu, cadence))
            if last is None or now - last >= every - 0.5 * self.interval:
                due.append(cadence)
                self._last_read[(gpu, cadence)] = now
        return due

    def tick(self, loop: Loop) -> None:
        def read(gpu: int) -> None:
            if self.gpus.identities[gpu] is None:
                self.gpus.identities[gpu] = read_identity(self.gpus.backend, gpu)
            now = self.clock.time()
            due = self._due(gpu, now)
            reading = read_gpu(self.gpus.backend, gpu, now, due, self.readings.get(gpu))
            if reading is not None:
                self._count_clock_events(gpu, reading)
                self.readings[gpu] = reading
                if catalogue.SLOW in due:  # the PCIe counters were read now
                    self._rate_pcie(gpu, reading)
            ident = self.gpus.identities[gpu]
            if catalogue.SLOW in due and reading is not None:
                device_read = read_device(self.gpus.backend, gpu,
                                          ident.nvlinks if ident else 0, now, reading.values,
                                          self.nvlink_reads)
                if device_read is not None:
                    self.device_reads[gpu] = device_read
            self._read_board(gpu, now)
            if self.recorder is not None and reading is not None:
                self.recorder(gpu, reading)

        if self.gpus.each(loop, read):
            for gpu in self.gpus.recover_lost():
                # its counters may have restarted (a reset): a rate starts afresh
                self._pcie_read.pop(gpu, None)
                self.pcie_rates.pop(gpu, None)
                if self.on_recovered is not None:
                    self.on_recovered(gpu)
            self._feed_window()

    def _read_board(self, gpu: int, now: float) -> None:
        last = self._last_read.get((gpu, "board"))
        if last is not None and now - last < self.board_interval - 0.5 * self.interval:
            return
        self._last_read[(gpu, "board")] = now
        board = read_board(self.gpus.backend, gpu, now)
        if board is not None:
            self.board[gpu] = board

    def _feed_window(self) -> None:
        if self.buffer is None:
            return
        rows = {}
        for gpu in range(self.gpus.count):
            reading = self.readings.get(gpu)
            if reading is not None and self.gpus.readable(gpu):
                rows[gpu] = (reading.time, {k: reading.get(k) for k in SweepBuffer.FIELDS})
        self.buffer.append(rows)

    def _rate_pcie(self, gpu: int, reading: GpuReading) -> None:
        """Bytes per second over PCIe since this sweep's previous read of the counters
        (never over what scrapes saw); none for a counter absent or gone backwards."""
        counts = tuple(reading.get(key) for key in PCIE_COUNTERS)
        previous = self._pcie_read.get(gpu)
        self._pcie_read[gpu] = (reading.time, counts)
        if previous is None or reading.time <= previous[0]:
            return
        elapsed = reading.time - previous[0]
        sent, received = (None if a is None or b is None or b < a else (b - a) / elapsed
                          for a, b in zip(previous[1], counts, strict=True))
        self.pcie_rates[gpu] = (sent, received)

    def _count_clock_events(self, gpu: int, reading: GpuReading) -> None:
        """Accumulate seconds each clock-event reason was active, sweep to sweep."""
        previous = self._last_reading_time.get(gpu)
        self._last_reading_time[gpu] = reading.time
        reasons = reading.get("clock_event_reasons")
        if previous is None or reasons is None:
            return
        # a gap longer than a few sweeps (a hang, a lost GPU) is not counted as active
        elapsed = min(reading.time - previous, 3 * self.interval)
        mask, seconds = int(reasons), self.clock_event_seconds
        keys = self._reason_keys.get(gpu)
        if keys is None:  # each reason's key made once a GPU, not every sweep
            keys = self._reason_keys[gpu] = [((gpu, reason), bit)
                                              for reason, bit in CLOCK_EVENT_REASONS.items()]
        for key, bit in keys:
            if mask & bit:
                seconds[key] = seconds.get(key, 0.0) + elapsed
            elif key not in seconds:
                seconds[key] = 0.0
