"""The node's GPUs as the loops see them: identities, and which are lost or hung.

One GPU that errors or hangs never hides the others: every loop reads GPU by GPU through
`each()`, which skips lost and hung GPUs and tells the loop which GPU it is inside, so
`check_hangs()` can mark a GPU hung and restart the loop without it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from exporter.gpu.backend import NvmlBackend
from exporter.gpu.state import GpuIdentity, read_identity
from exporter.sampling.clock import Clock
from exporter.sampling.loops import Loop

log = logging.getLogger(__name__)


class GpuSet:
    def __init__(self, backend: NvmlBackend, clock: Clock, hang_timeout: float,
                 recovery_interval: float):
        self.backend, self.clock = backend, clock
        self.hang_timeout, self.recovery_interval = hang_timeout, recovery_interval
        self.count = 0
        self.identities: list[GpuIdentity | None] = []
        self.hung: dict[int, float] = {}  # GPU -> when the stuck call began (epoch)
        self.hangs: dict[int, int] = {}
        self.recovery_attempts: dict[int, int] = {}
        self.recoveries: dict[int, int] = {}
        self._last_recovery: dict[int, float] = {}
        self._lock = threading.Lock()

    def open(self) -> int:
        self.count = self.backend.open()
        self.identities = [read_identity(self.backend, gpu) for gpu in range(self.count)]
        return self.count

    @property
    def lost(self) -> set[int]:
        return self.backend.lost

    def readable(self, gpu: int) -> bool:
        return gpu not in self.backend.lost and gpu not in self.hung

    def uuids(self) -> dict[str, int]:
        return {i.uuid: i.index for i in self.identities if i is not None}

    def each(self, loop: Loop, read: Callable[[int], None]) -> bool:
        """read(gpu) for every readable GPU; False if the loop was superseded meanwhile."""
        for gpu in range(self.count):
            if not self.readable(gpu):
                continue
            loop.enter(gpu)
            try:
                read(gpu)
            finally:
                loop.leave()
            if gpu in self.hung:  # it was declared hung while we waited: it answered now
                with self._lock:
                    self.hung.pop(gpu, None)
            if not loop.current:
                return False
        return True

    def check_hangs(self, loops: list[Loop]) -> None:
        """A loop inside one GPU's call for too long: mark that GPU hung, go on without it."""
        now = self.clock.monotonic()
        for loop in loops:
            gpu = loop.busy_gpu
            if gpu is None or now - loop.busy_since < self.hang_timeout:
                continue
            log.warning("GPU %d: %s loop stuck in an NVML call for %.1f s; going on without it",
                        gpu, loop.name, now - loop.busy_since)
            with self._lock:
                self.hung[gpu] = self.clock.time() - (now - loop.busy_since)
                self.hangs[gpu] = self.hangs.get(gpu, 0) + 1
            loop.restart()

    def hung_now(self) -> tuple[dict[int, float], dict[int, int]]:
        with self._lock:
            return dict(self.hung), dict(self.hangs)

    def recover_lost(self) -> list[int]:
        """Retry each lost GPU every recovery interval: fresh handle, same UUID. Returns
        the GPUs that came back."""
        now = self.clock.monotonic()
        back = []
        for gpu in sorted(self.backend.lost):
            if now - self._last_recovery.get(gpu, -1e18) < self.recovery_interval:
                continue
            self._last_recovery[gpu] = now
            self.recovery_attempts[gpu] = self.recovery_attempts.get(gpu, 0) + 1
            self.backend.lost.discard(gpu)
            handle = self.backend.reacquire(gpu)
            ident = read_identity(self.backend, gpu) if handle is not None else None
            known = self.identities[gpu]
            if ident is None or gpu in self.backend.lost or (
                    known is not None and ident.uuid != known.uuid):
                self.backend.lost.add(gpu)
                continue
            log.info("GPU %d (%s) answers again", gpu, ident.uuid)
            self.identities[gpu] = ident
            self.recoveries[gpu] = self.recoveries.get(gpu, 0) + 1
            back.append(gpu)
        return back
