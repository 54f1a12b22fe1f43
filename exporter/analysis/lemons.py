"""The lemon score: how many more GPU fault episodes than its fleet a node (or a GPU) had.

What ships is a count, chosen on rolling origins of a real fleet's trace against decayed
counts and fitted self-exciting models (scripts/eval_lemons.py; docs/health.md, "Lemon
score"): a member's episodes of the GPU group's kinds in the last 28 days, over the
fleet's mean (quiet members counted at 0). An XID counts only where the XID catalogue
asks for a reset, a reboot or service (`counted`).

The code keeps the general form the candidates share, so a refit on another fleet ships
by changing the constants below: pure functions of the episode counts in the three
windows every node exports (1 d, 7 d, 28 d), per kind, and the size of the fleet, so the
global recording rules (alerts/global-lemons.yml) compute the same number in PromQL:

    x = sum over kinds k and window segments s of  w_k * d_s * episodes(k, s)
    score = x / (the fleet's mean x, quiet members counted at 0)

with d_s the mean of exp(-age / tau) over the segment (0-1, 1-7, 7-28 days; 1 for
tau = inf, the count) and w_k the kind's weight. A score of 3 reads "three times the
fleet's average"; a member with no weighed episode in the windows scores 0.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from exporter.gpu.xid import HARDWARE_ACTIONS, xid_row

DAY = 86400.0
WINDOWS: tuple[tuple[str, float], ...] = (("1d", 1.0), ("7d", 7.0), ("28d", 28.0))

# Kind groups: a kind the fitting trace never shows takes its group's weight, fitted with
# the group's kinds pooled.
GROUPS: dict[str, tuple[str, ...]] = {
    "gpu": ("xid", "ecc_dbe", "ecc_sbe_storm", "row_remap_failure", "row_remap_pending",
            "retired_pages", "gpu_lost", "gpu_unresponsive", "pcie_degraded", "pcie_replays",
            "other_gpu"),
    "network": ("nvlink_errors", "nvlink_degraded", "fabric_degraded", "ib_link_down",
                "ib_degraded", "nic_lost"),
    "node": ("thermal", "other_hardware", "health_failed"),
    "other": ("software", "unknown"),
}
GROUP_OF: dict[str, str] = {kind: g for g, kinds in GROUPS.items() for kind in kinds}
# The hardware kinds: those of the groups gpu, network and node but a failed health verdict,
# the kinds InfiniteHBD-Trace files under its Level `Hardware Failure` (docs/health.md).
HARDWARE_KINDS: tuple[str, ...] = tuple(
    k for g in ("gpu", "network", "node") for k in GROUPS[g] if k != "health_failed")
# XIDs whose action (the fault table's XID columns) asks for a GPU reset, a reboot or
# service: they count as the hardware kinds do; the rest (an application's fault, a
# cleanup, a notice) do not. The node-local lemon rules select the same actions.
HARDWARE_XID_ACTIONS = HARDWARE_ACTIONS


def counted(kind: str, xid: int | None) -> bool:
    """Whether an episode enters the score: every kind's does, but an XID's only where the
    XID table says it counts (exporter/gpu/xid.py's `lemon`, which the fault table's
    xid_judgement reads too: not ok, and a reset, a reboot or service); an XID without a
    code (a trace that names none) counts."""
    return kind != "xid" or xid is None or xid_row(xid).lemon

# Chosen on rolling origins of InfiniteHBD-Trace (scripts/eval_lemons.py prints the choice;
# tests/test_eval_lemons.py checks these are what it ships): the simplest candidate within
# the spread of the best, a count. Each episode of the GPU group's kinds in the last 28
# days weighs 1 (no decay within the windows); every other kind weighs 0.
NAME = "GPU-kind episodes in 28 d"
TAU_DAYS = math.inf
KIND_WEIGHTS: dict[str, float] = {kind: 1.0 for kind in GROUPS["gpu"]}


@dataclass(frozen=True, slots=True)
class Model:
    tau_days: float = TAU_DAYS
    kind_weights: Mapping[str, float] = field(default_factory=lambda: dict(KIND_WEIGHTS))

    def weight(self, kind: str) -> float:
        return self.kind_weights.get(kind, 0.0)

    @property
    def kinds(self) -> tuple[str, ...]:
        """The kinds the score weighs (weight above 0), in the vocabulary's group order."""
        return tuple(k for k in GROUP_OF if self.weight(k) > 0)

    def segment_weights(self) -> tuple[float, ...]:
        """An episode's weight in each window segment (0-1, 1-7, 7-28 days): the mean of
        exp(-age/tau) over the segment."""
        out, lo = [], 0.0
        for _, hi in WINDOWS:
            if math.isinf(self.tau_days):
                out.append(1.0)
            else:
                t = self.tau_days
                out.append(t * (math.exp(-lo / t) - math.exp(-hi / t)) / (hi - lo))
            lo = hi
        return tuple(out)

    def window_coefficients(self) -> dict[str, float]:
        """decayed count = sum of coefficient x count over the windows (the windows nest,
        so a window's coefficient is its segment's weight less the next one's)."""
        w = self.segment_weights()
        return {name: w[i] - (w[i + 1] if i + 1 < len(w) else 0.0)
                for i, (name, _) in enumerate(WINDOWS)}

    def decayed_count(self, counts: Mapping[str, float]) -> float:
        """counts: episodes per window name ('1d', '7d', '28d'; absent = 0)."""
        return sum(c * counts.get(name, 0.0) for name, c in self.window_coefficients().items())

    def contributions(self, counts: Mapping[str, Mapping[str, float]]) -> dict[str, float]:
        """Each weighed kind's part of the member's weighed count (kind -> window -> episodes)."""
        return {kind: part for kind, windows in counts.items()
                if (part := self.weight(kind) * self.decayed_count(windows)) > 0}


@dataclass(frozen=True, slots=True)
class Member:
    """One node or one GPU: its episodes per kind and window."""

    key: str
    counts: Mapping[str, Mapping[str, float]]  # kind -> window -> episodes


def window_counts(ages_days: Iterable[float]) -> dict[str, float]:
    """Episodes per window from their ages at the ranking time (0 <= age; an episode is in
    a window when it started less than the window ago)."""
    out = {name: 0.0 for name, _ in WINDOWS}
    for age in ages_days:
        for name, length in WINDOWS:
            if age < length:
                out[name] += 1.0
    return {k: v for k, v in out.items() if v}


@dataclass(frozen=True, slots=True)
class Scored:
    """A member's score and why: one reason per weighed kind it has, largest part first."""

    key: str
    score: float
    reasons: tuple[str, ...]


def _reasons(model: Model, member: Member) -> tuple[str, ...]:
    parts = model.contributions(member.counts)
    total = sum(parts.values())
    out = []
    for kind in sorted(parts, key=lambda k: (-parts[k], k)):
        windows = member.counts[kind]
        seen = ", ".join(f"{windows.get(name, 0):g} in {name}" for name, _ in WINDOWS)
        share = parts[kind] / total
        out.append(f"{kind} ({seen}): {f'{share:.0%}' if share >= 0.005 else 'under 1%'} "
                   "of the score")
    return tuple(out)


def score_fleet(model: Model, members: Sequence[Member], fleet_size: int) -> list[Scored]:
    """Every member with a score above 0, by descending score (then key). fleet_size counts
    every member of the fleet, the quiet ones (no episode in the windows) too."""
    weighed = {m.key: sum(model.contributions(m.counts).values()) for m in members}
    total = sum(weighed.values())
    if total <= 0.0:
        return []
    mean = total / max(fleet_size, len(members))
    out = [Scored(m.key, weighed[m.key] / mean, _reasons(model, m)) for m in members
           if weighed[m.key] > 0]
    return sorted(out, key=lambda x: (-x.score, x.key))
