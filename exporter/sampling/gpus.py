"""The node's GPUs as the loops see them: identities, and which are lost or hung.

One GPU that errors or hangs never hides the others: every loop reads GPU by GPU through
`each()`, which skips lost and hung GPUs and tells the loop which GPU it is inside, so a
loop stuck in one GPU's call can go on without it in a fresh thread (`move_on()`): the
power loop after a fraction of a second, so that no other GPU's buffer overflows, any
loop at the hang timeout (`check_hangs()`), which also marks the GPU hung. A loop never
enters a GPU again while its own call there is still stuck; the GPU is hung from the
timeout until every call stuck in it has returned.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

from exporter.gpu.backend import NvmlBackend
from exporter.gpu.reading import GpuIdentity, read_identity
from exporter.sampling.clock import Clock
from exporter.sampling.loops import Loop

log = logging.getLogger(__name__)


@dataclass
class _StuckCall:
    """A call a loop went on without, until it returns."""

    since: float  # monotonic
    began: float  # epoch
    declared: bool = False  # past the hang timeout: its GPU is hung, the hang counted


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
        self._stuck: dict[tuple[str, int], _StuckCall] = {}  # by (loop name, GPU)
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
            if not self.readable(gpu) or (loop.name, gpu) in self._stuck:
                continue
            loop.enter(gpu)
            superseded = False
            try:
                read(gpu)
            finally:
                with self._lock:  # against move_on(): superseded, or not inside any more
                    loop.leave()
                    if not loop.current:  # it went on without us: the call returned now
                        superseded = True
                        self._returned(loop.name, gpu)
            if superseded:
                return False
        return True

    def _returned(self, name: str, gpu: int) -> None:
        """A stuck call returned (under the lock): its GPU stays hung while another call
        stuck in it has not."""
        self._stuck.pop((name, gpu), None)
        if not any(g == gpu for _, g in self._stuck):
            self.hung.pop(gpu, None)

    def move_on(self, loop: Loop, patience: float) -> bool:
        """If the loop has been inside one GPU's call for `patience`, go on without that
        GPU: the loop continues in a fresh thread (a new generation), the stuck one exits
        when its call returns. True if it did."""
        gpu = loop.busy_gpu  # first: enter() sets busy_since before busy_gpu
        since = loop.busy_since
        now = self.clock.monotonic()
        if gpu is None or now - since < patience:
            return False
        with self._lock:
            if loop.busy_gpu != gpu or loop.busy_since != since:
                return False  # it answered meanwhile
            self._stuck[(loop.name, gpu)] = _StuckCall(since, self.clock.time() - (now - since))
            loop.restart()
        if patience < self.hang_timeout:
            log.info("GPU %d: %s loop inside an NVML call for %.2f s; going on without it "
                     "until it returns", gpu, loop.name, now - since)
        return True

    def check_hangs(self, loops: list[Loop]) -> None:
        """A call stuck for the hang timeout marks its GPU hung (and the loop inside it
        goes on without it)."""
        for loop in loops:
            self.move_on(loop, self.hang_timeout)
        now = self.clock.monotonic()
        with self._lock:
            for (name, gpu), call in self._stuck.items():
                if call.declared or now - call.since < self.hang_timeout:
                    continue
                call.declared = True
                log.warning("GPU %d hung: a call of the %s loop has been inside NVML for "
                            "%.1f s; sampling goes on without the GPU", gpu, name,
                            now - call.since)
                self.hung.setdefault(gpu, call.began)
                self.hangs[gpu] = self.hangs.get(gpu, 0) + 1

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
