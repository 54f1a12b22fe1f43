"""The history's writer: what is pending (the batch), written to the store in one
transaction at a time; a write that fails is counted, kept and retried; a row the store
cannot hold is refused alone, counted by reason and named in a log line.

Two locks: the history's `lock` (shared, passed in) guards the batch; `writing`, taken
before it, keeps to one write at a time, so a write ahead of XIDs never runs beside a
flush, nor commits before a flush that failed is taken back. The disk is written holding
`writing` only: the publisher and a scrape, which take `lock`, never wait for it.
"""

from __future__ import annotations

import logging
import threading

from exporter.history.store import Batch, Store
from exporter.sampling.xid_ledger import Refusals

log = logging.getLogger(__name__)

MAX_PENDING_EPISODES = 10_000  # held in memory while writes fail; the oldest go first
# Why a record is refused (cte_history_refused_records_total{reason}):
REFUSED_REASONS = ("xid_code", "not_on_this_node", "unstorable")


class Writer:
    def __init__(self, store: Store, lock: threading.Lock):
        self.store, self.lock = store, lock
        self.writing = threading.Lock()
        self.batch = Batch()
        self.refused = Refusals()  # with the XIDs the sampler refused
        self.transactions = self.write_failures = self.dropped = 0
        self.problem = ""  # why the last write failed; "" once one succeeds

    def flush(self) -> bool:
        """Write what is pending in one transaction; False if the write failed (it is
        kept for the next one)."""
        with self.writing:
            return self.write_ahead()

    def write_ahead(self) -> bool:
        """Commit what is pending now (the caller holds `writing`, not `lock`: what others
        add meanwhile waits for the next write, and nobody waits for the disk but the
        caller); False if the write failed."""
        with self.lock:
            batch, self.batch = self.batch, Batch()
        if not batch:
            return True
        refused, problem = self._write(batch)
        with self.lock:
            return self._settle(batch, refused, problem)

    def _write(self, batch: Batch) -> tuple[list[str], str]:
        """(the rows the store refused, named; why the write failed, "" if it did not)."""
        try:
            return self.store.write(batch), ""
        except Exception as exc:  # noqa: BLE001 - any failure is counted, its batch kept
            return [], f"{type(exc).__name__}: {exc}"[:200]

    def _settle(self, batch: Batch, refused: list[str], problem: str) -> bool:
        """Count the write's outcome (under `lock`); a failed batch is taken back."""
        for what in refused:
            self.refuse("unstorable", what)
        if problem:
            self.write_failures += 1
            if not self.problem:
                log.warning("history: write failed (%s); keeping it in memory and "
                            "retrying", problem)
            self.problem = problem
            self.batch.absorb(batch)
            self._bound_pending()
            return False
        self.transactions += 1
        if self.problem:
            log.info("history: writes succeed again")
        self.problem = ""
        return True

    def refuse(self, reason: str, what: str) -> None:
        """A record refused alone (under `lock`): counted, and named in one log line."""
        self.refused.add(reason, what)

    def _bound_pending(self) -> None:
        new = [k for k, e in self.batch.episodes.items() if e.id is None]
        for key in new[:max(0, len(new) - MAX_PENDING_EPISODES)]:
            del self.batch.episodes[key]
            self.dropped += 1
