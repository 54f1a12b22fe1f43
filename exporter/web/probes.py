"""What /healthz (liveness) and /readyz (readiness and detail) say.

Two questions, kept apart on purpose (a probe that restarts the exporter for a stuck
GPU helps no one):

- **Liveness** (`/healthz`): is the exporter itself working? It is while its publisher
  builds fresh snapshots and the server answers. What the GPUs do does not enter into
  it: a hung or lost GPU is the node's fault, shown in metrics, and restarting the
  exporter would only blind it (and NVML initialisation can hang on that same GPU).
- **Readiness** (`/readyz`): can Prometheus get useful data here? Not ready (503) only
  while liveness fails; otherwise ready (200), with every degraded state listed: stuck
  or lost GPUs, fewer GPUs than expected, stale loops, failing sources. A degraded
  exporter stays in the endpoints, because its data (the other GPUs, the fabric, the
  fault itself) matters most exactly then.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from exporter.metrics.render import RenderedSnapshot
from exporter.sampling.snapshot import LoopStats, Snapshot


@dataclass(frozen=True)
class Readiness:
    ready: bool
    problems: tuple[str, ...]  # why not ready (if not), then every degraded state

    @property
    def status(self) -> str:
        """One word for unauthenticated probes: ok, degraded or unavailable."""
        if not self.ready:
            return "unavailable"
        return "degraded" if self.problems else "ok"

    @property
    def words(self) -> str:
        """The exporter's own readiness in words, as the page's header says it: "ready",
        "ready, degraded: GPU 1 lost", "not ready: ..." (never the GPUs' verdict)."""
        said = "; ".join(self.problems)
        if not self.ready:
            return f"not ready: {said}" if said else "not ready"
        return f"ready, degraded: {said}" if said else "ready"


class Probes:
    """Decides liveness and readiness from the snapshot being served."""

    def __init__(self, stale_after_seconds: float, clock=time.time,
                 problems: Callable[[], list[str]] = lambda: []):
        self.stale_after = stale_after_seconds
        self.clock = clock  # the sampler's clock (a manual one in simulated time)
        self.problems = problems  # degraded states from outside the snapshot (the history)

    def liveness(self, rendered: RenderedSnapshot | None, now: float | None = None) -> list[str]:
        """Why the exporter is not working; [] while it is (whatever the GPUs do)."""
        now = self.clock() if now is None else now
        if rendered is None:
            return ["no snapshot published yet"]
        age = now - rendered.snapshot.time
        if age > self.stale_after:
            return [f"publisher stalled: last snapshot {age:.1f} s ago"]
        return []

    def readiness(self, rendered: RenderedSnapshot | None,
                  now: float | None = None) -> Readiness:
        now = self.clock() if now is None else now
        dead = self.liveness(rendered, now)
        if dead or rendered is None:
            return Readiness(False, tuple(dead))
        return Readiness(True, tuple(self.degraded(rendered.snapshot, now) + self.problems()))

    def degraded(self, snap: Snapshot, now: float) -> list[str]:
        """Every state in which the exporter serves less than a healthy node would have."""
        out = []
        for name, loop in snap.loops.items():
            if (problem := self._stale_loop(name, loop, now)) is not None:
                out.append(problem)
        for gpu, since in sorted(snap.hung.items()):
            out.append(f"GPU {gpu} stuck in an NVML call for {now - since:.1f} s "
                       "(its data is left out; other GPUs are sampled)")
        for gpu in sorted(snap.lost):
            out.append(f"GPU {gpu} lost (NVML: GPU is lost); retried every few seconds")
        if snap.gpu_count < snap.expected_gpus:
            out.append(f"{snap.gpu_count} GPUs present, {snap.expected_gpus} expected")
        for name, result in sorted(snap.collectors.items()):
            if not result.success:
                out.append(f"collector {name} failing: {result.error[:200] or 'read failed'}")
            elif problem := getattr(result.reading, "problem", ""):
                # a source that was asked for but cannot work (no grpcio, no socket, ...)
                out.append(f"collector {name} cannot work: {problem[:300]}")
        return out

    def _stale_loop(self, name: str, loop: LoopStats, now: float) -> str | None:
        if not loop.last_completed:
            return None
        # a slow loop (sources every 5 s or more) is stale after three of its periods
        period = 1.0 / loop.target_hertz if loop.target_hertz > 0 else 0.0
        age = now - loop.last_completed
        if age <= max(self.stale_after, 3 * period):
            return None
        inside = f" (stuck in {loop.busy})" if loop.busy else ""
        return f"{name} loop stale: last completed {age:.1f} s ago{inside}"
