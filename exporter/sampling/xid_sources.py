"""Both XID sources and the ledger they report to: NVML's events (sampling/xids.py) and
the kernel log, where it is read (sampling/xid_kmsg.py), counted once
(sampling/xid_ledger.py). The sampler runs them; the app begins them with what the store
hands over (or with nothing, where no state directory is kept)."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING

from exporter.sampling.clock import Clock
from exporter.sampling.gpus import GpuSet
from exporter.sampling.snapshot import XidRecord, XidSourceStats
from exporter.sampling.xid_ledger import GpuKey, XidLedger, XidSink, XidStart
from exporter.sampling.xids import XidWatcher

if TYPE_CHECKING:
    from exporter.sampling.xid_kmsg import KernelLogFollower


class XidSources:
    def __init__(self, gpus: GpuSet, clock: Clock, stop: threading.Event, kmsg_path: str):
        """`kmsg_path`: the kernel log to follow; "": none."""
        self.gpus = gpus
        self.ledger = XidLedger(self.keys)
        self.events = XidWatcher(gpus, clock, stop, self.ledger)
        self.kernel_log: KernelLogFollower | None = None
        if kmsg_path:  # the kernel log's modules only where one is read (none on the fake)
            from exporter.sampling.xid_kmsg import KernelLogFollower

            self.kernel_log = KernelLogFollower(kmsg_path, self.ledger, self.slots)
        self.begun = False
        self._later: dict[GpuKey, Mapping[int, XidRecord]] = {}

    def begin(self, start: XidStart, sink: XidSink | None) -> None:
        """Before sampling starts: the counts to continue from, where new XIDs are written
        before they are served, where the kernel log is read from. Without it, the counts
        start from zero and the log from its end."""
        self.ledger.begin(start, sink)
        # only a GPU lost now can be identified later (a GPU here keeps its identity), so
        # without one no snapshot looks for the stored counts of GPUs not here
        lost = any(i is None for i in self.gpus.identities)
        self._later = dict(start.later) if lost else {}
        if self.kernel_log is not None:
            self.kernel_log.begin(start.kmsg_cursor, start.kmsg_from_end)
        self.begun = True

    def slots(self) -> dict[str, int]:
        """Each GPU's PCI slot, as the kernel log names it -> its index."""
        from exporter.sampling.kmsg import pci_slot

        return {pci_slot(i.pci_bus_id): i.index for i in self.gpus.identities if i is not None}

    def keys(self) -> dict[int, GpuKey]:
        """Each identified GPU's index -> its (serial, UUID)."""
        return {i.index: (i.serial, i.uuid) for i in self.gpus.identities if i is not None}

    def seen(self) -> Mapping[tuple[int, int], XidRecord]:
        """The counts a snapshot serves; a GPU identified since start (it was lost then)
        has its stored counts added first."""
        if self._later:
            for gpu, key in self.keys().items():
                stored = self._later.pop(key, None)
                if stored is not None:
                    self.ledger.continue_from(gpu, stored)
        return self.ledger.seen()

    def problems(self) -> list[str]:
        """Degraded states for /readyz: a kernel log that cannot be read."""
        log_ = self.kernel_log
        return [log_.problem] if log_ is not None and log_.problem else []

    def stats(self) -> XidSourceStats:
        log_ = self.kernel_log
        return XidSourceStats(self.ledger.duplicates, log_ is not None,
                              log_.xids if log_ else 0, log_.readable if log_ else None,
                              log_.skipped if log_ else 0)
