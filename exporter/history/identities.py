"""Which GPU is which: each GPU's serial and UUID against its index now and its PCI slot,
the slots as last seen (so a kernel-log XID of a GPU that fell off the bus before the
exporter started still finds it), and the replacements seen in a slot. Fed the GPUs'
identities by the history (under its lock): the sampler's at start, then each snapshot's;
what changes goes into the history's batch.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from exporter.gpu.reading import GpuIdentity
from exporter.history.episodes import GpuKey
from exporter.history.store import Batch, Replacement
from exporter.sampling import kmsg

log = logging.getLogger(__name__)

LAST_SEEN_SECONDS = 3600.0  # how often the GPUs' last-seen times are written (one row each)


class GpuIdentities:
    def __init__(self) -> None:
        self.slots: dict[str, tuple[str, str, float]] = {}  # slot -> serial, uuid, since
        self.replacements: list[Replacement] = []
        self.index_of: dict[GpuKey, int] = {}
        self.key_of: dict[int, GpuKey] = {}
        self.key: tuple | None = None  # the identities last seen, in brief
        self._identities: object = None
        self._last_seen_written = 0.0

    def observe(self, identities: Sequence[GpuIdentity | None], driver_version: str,
                now: float, batch: Batch, boot_id: str) -> None:
        """New GPUs (or the same ones in a new order) are identified; the same ones have
        their last-seen time written every LAST_SEEN_SECONDS."""
        if identities is not self._identities and self._changed(identities):
            self._identify(identities, driver_version, now, batch, boot_id)
        elif now - self._last_seen_written >= LAST_SEEN_SECONDS:
            self._seen_now(identities, now, batch)

    def _changed(self, identities: Sequence[GpuIdentity | None]) -> bool:
        """Whether the GPUs are others than last time (the sampler may publish the same
        identities in a new tuple)."""
        key = tuple(None if i is None else (i.index, i.serial, i.uuid, i.pci_bus_id)
                    for i in identities)
        self._identities = identities
        if key == self.key:
            return False
        self.key = key
        return True

    def _identify(self, identities: Sequence[GpuIdentity | None], driver_version: str,
                  now: float, batch: Batch, boot_id: str) -> None:
        self.index_of, self.key_of = {}, {}
        for identity in identities:
            if identity is None:
                continue
            key: GpuKey = (identity.serial, identity.uuid)
            slot = kmsg.pci_slot(identity.pci_bus_id)
            self.index_of[key], self.key_of[identity.index] = identity.index, key
            batch.gpus[key] = (slot, now, now)
            batch.boots.add((*key, boot_id, driver_version, now))
            stored = self.slots.get(slot)
            if stored is not None and _replaced(stored[:2], key):
                replacement = Replacement(now, slot, (stored[0], stored[1]), key)
                log.warning("history: GPU %d in slot %s was replaced: serial %s (%s) is now "
                            "serial %s (%s)", identity.index, slot, stored[0], stored[1], *key)
                self.replacements.append(replacement)
                batch.replacements.append(replacement)
            if stored is None or stored[:2] != key:
                self.slots[slot] = (*key, now)
                batch.slots[slot] = (*key, now)
        self._last_seen_written = now

    def _seen_now(self, identities: Sequence[GpuIdentity | None], now: float,
                  batch: Batch) -> None:
        self._last_seen_written = now
        for identity in identities:
            if identity is not None:
                key = (identity.serial, identity.uuid)
                # the upsert keeps a stored first_seen, but a row not written yet (the
                # batch _identify filled, unwritten while writes fail) needs its own
                first = batch.gpus.get(key, ("", now, 0.0))[1]
                batch.gpus[key] = (kmsg.pci_slot(identity.pci_bus_id), first, now)

    def in_slot(self, slot: str) -> GpuKey | None:
        """The GPU last seen in a PCI slot (the one there now; else one that fell off the
        bus before we started), else None: not on this node."""
        stored = self.slots.get(slot)
        return (stored[0], stored[1]) if stored is not None else None


def _replaced(old: tuple[str, str], new: GpuKey) -> bool:
    """A different GPU in the slot: its serial differs (its UUID, where a GPU reports
    no serial)."""
    if old[0] and new[0]:
        return old[0] != new[0]
    return old[1] != new[1]
