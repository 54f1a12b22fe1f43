"""The lemon score: how much more often than its fleet a node (or a GPU) is expected to fail.

Pure functions of episode counts in the three windows every node exports (1 d, 7 d, 28 d),
each node's exposure (time since its history began) and fleet sums, so the global
recording rules (alerts/global-lemons.yml) compute the same number in PromQL.

Per kind group g (`GROUPS`), a node's decayed count is n = sum of its episodes weighted by
age, with one weight per window segment (0-1 d, 1-7 d, 7-28 d): either fitted to the faults
that followed (a piecewise decay), or the mean of exp(-age/tau) over the segment. Its
decayed exposure E weighs the time it was watched the same way.
The fleet's rates per group follow a gamma prior, fitted by moments to every node (quiet
ones too): mean rate mu = sum n / sum E, spread var from the excess of the nodes' rates
over Poisson noise, at least spread_floor x mu^2 (with too few episodes to show a spread
the moments give 0, and every node would get the fleet's rate: tied). A node's rate is then
the gamma-Poisson posterior mean
    rate = mu + var (n - mu E) / (mu + var E)
(shrunk to mu where it was watched little), and its score is
the weighted sum of its rates over the groups divided by the fleet's: 3 reads "three times
the fleet's rate". A node with no episode in the windows scores 0.

The segment weights, the spread's floor and the groups' weights were chosen on the first
two thirds of InfiniteHBD-Trace's days (scripts/eval_lemons.py; docs/health.md, "Lemon
score").
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

DAY = 86400.0
WINDOWS: tuple[tuple[str, float], ...] = (("1d", 1.0), ("7d", 7.0), ("28d", 28.0))

# Kind groups: each gets its own fleet prior (few episodes per kind, more per group).
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

# Chosen on the tuning days (scripts/eval_lemons.py): the weight of an episode in each
# window segment (0-1, 1-7, 7-28 days; fitted there), the prior's spread floor (in units
# of mu^2), and each group's weight in the score (in GROUPS' order; 0 leaves a group out).
TAU_DAYS = 28.0  # the segments' weights: the mean of exp(-age / 28 d) over each
SEGMENTS: tuple[float, float, float] | None = None  # fitted weights instead of tau's
SPREAD_FLOOR = 1.0
WEIGHTS: tuple[float, ...] = (1.0, 0.0, 0.0, 0.0)
# A node watched for less than an hour counts an hour (its rate is not divided by ~0).
MIN_EXPOSURE_DAYS = 1.0 / 24.0


@dataclass(frozen=True, slots=True)
class Model:
    tau_days: float = TAU_DAYS
    weights: tuple[float, ...] = WEIGHTS
    segments: tuple[float, float, float] | None = SEGMENTS  # given: tau_days is not used
    spread_floor: float = SPREAD_FLOOR

    @property
    def groups(self) -> tuple[str, ...]:
        """The groups the score sums (weight above 0)."""
        return tuple(g for g, w in zip(GROUPS, self.weights, strict=True) if w > 0)

    def weight(self, group: str) -> float:
        return self.weights[list(GROUPS).index(group)]

    def segment_weights(self) -> tuple[float, ...]:
        """An episode's weight in each window segment (0-1, 1-7, 7-28 days): the fitted
        ones, or the mean of exp(-age/tau) over the segment."""
        if self.segments is not None:
            return tuple(self.segments)
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
        """n = sum of coefficient x count over the windows (the windows nest, so a
        window's coefficient is its segment's weight less the next one's)."""
        w = self.segment_weights()
        return {name: w[i] - (w[i + 1] if i + 1 < len(w) else 0.0)
                for i, (name, _) in enumerate(WINDOWS)}

    def decayed_count(self, counts: Mapping[str, float]) -> float:
        """counts: episodes per window name ('1d', '7d', '28d'; absent = 0)."""
        return sum(c * counts.get(name, 0.0) for name, c in self.window_coefficients().items())

    def decayed_exposure(self, exposure_days: float) -> float:
        """The watched part of each segment, weighted like the counts (days)."""
        total, lo = 0.0, 0.0
        for w, (_, hi) in zip(self.segment_weights(), WINDOWS, strict=True):
            total += w * min(max(exposure_days - lo, 0.0), hi - lo)
            lo = hi
        return max(total, MIN_EXPOSURE_DAYS * self.segment_weights()[0])


@dataclass(frozen=True, slots=True)
class Prior:
    """The fleet's gamma prior for one group: mean rate and its spread (per day)."""

    mean: float
    var: float

    def rate(self, n: float, exposure: float) -> float:
        """The posterior mean rate of a member with decayed count n over exposure."""
        if self.mean <= 0.0:
            return 0.0
        return self.mean + self.var * (n - self.mean * exposure) / (self.mean + self.var * exposure)


def fit_prior(members: Iterable[tuple[float, float]],
              quiet: Sequence[float] = (), spread_floor: float = 0.0) -> Prior:
    """Moments fit of the gamma prior to (n, E) of each member with episodes, plus quiet
    members (no episode) watched for the exposures given. The spread is what the rates
    vary beyond Poisson noise: var = (S - (N - 1) mu) / (sum E - sum E^2 / sum E), with
    S = sum n^2 / E - mu sum n, floored at spread_floor x mu^2 (and at 0)."""
    pairs = list(members)
    count = len(pairs) + len(quiet)
    sum_n = sum(n for n, _ in pairs)
    sum_e = sum(e for _, e in pairs) + sum(quiet)
    sum_e2 = sum(e * e for _, e in pairs) + sum(e * e for e in quiet)
    if count < 2 or sum_e <= 0.0 or sum_n <= 0.0:
        return Prior(sum_n / sum_e if sum_e > 0 else 0.0, 0.0)
    mean = sum_n / sum_e
    spread = sum(n * n / e for n, e in pairs) - mean * sum_n
    denominator = sum_e - sum_e2 / sum_e
    var = (spread - (count - 1) * mean) / denominator if denominator > 0 else 0.0
    return Prior(mean, max(var, spread_floor * mean * mean, 0.0))


@dataclass(frozen=True, slots=True)
class Member:
    """One node or one GPU: its window counts per kind and its exposure (days)."""

    key: str
    counts: Mapping[str, Mapping[str, float]]  # kind -> window -> episodes
    exposure_days: float


def group_counts(model: Model, member: Member) -> dict[str, float]:
    """Decayed count per group."""
    out: dict[str, float] = {}
    for kind, windows in member.counts.items():
        g = GROUP_OF[kind]
        out[g] = out.get(g, 0.0) + model.decayed_count(windows)
    return out


def fit_fleet(model: Model, members: Sequence[Member],
              quiet_exposures_days: Sequence[float]) -> dict[str, Prior]:
    """One prior per group over the fleet: the members given, and quiet ones (no episode)
    watched for the given exposures."""
    e_quiet = [model.decayed_exposure(e) for e in quiet_exposures_days]
    pairs = [(group_counts(model, m), model.decayed_exposure(m.exposure_days)) for m in members]
    return {g: fit_prior([(c.get(g, 0.0), e) for c, e in pairs], e_quiet, model.spread_floor)
            for g in GROUPS}


def score(model: Model, priors: Mapping[str, Prior], member: Member) -> float:
    """The member's expected rate over the scored groups, in units of the fleet's; 0 when
    it has no episode in the windows or the fleet none in those groups."""
    counts = group_counts(model, member)
    if not any(counts.get(g, 0.0) > 0 for g in model.groups):
        return 0.0
    fleet = sum(model.weight(g) * priors[g].mean for g in model.groups)
    if fleet <= 0.0:
        return 0.0
    e = model.decayed_exposure(member.exposure_days)
    return sum(model.weight(g) * priors[g].rate(counts.get(g, 0.0), e)
               for g in model.groups) / fleet


def group_rates(model: Model, priors: Mapping[str, Prior], member: Member) -> dict[str, float]:
    """The member's posterior rate per group (per day)."""
    counts = group_counts(model, member)
    e = model.decayed_exposure(member.exposure_days)
    return {g: priors[g].rate(counts.get(g, 0.0), e) for g in GROUPS}


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
    """A member's score and why: one reason per group it has episodes in, largest first."""

    key: str
    score: float
    reasons: tuple[str, ...]


def _reasons(model: Model, priors: Mapping[str, Prior], member: Member) -> tuple[str, ...]:
    e = model.decayed_exposure(member.exposure_days)
    counts = group_counts(model, member)
    out = []
    for g in sorted((g for g in model.groups if counts.get(g, 0.0) > 0),
                    key=lambda g: -priors[g].rate(counts[g], e)):
        prior = priors[g]
        if prior.mean <= 0:
            continue
        kinds = ", ".join(
            f"{kind} " + ", ".join(f"{w.get(name, 0):g} in {name}" for name, _ in WINDOWS)
            for kind, w in sorted(member.counts.items()) if GROUP_OF[kind] == g)
        out.append(f"{g} faults at {prior.rate(counts[g], e) / prior.mean:.1f}x the fleet's "
                   f"rate ({kinds})")
    return tuple(out)


def score_fleet(model: Model, members: Sequence[Member],
                quiet_exposures_days: Sequence[float]) -> list[Scored]:
    """Every member with a score above 0, by descending score (then key); the quiet
    members (no episode in the windows) count in the fleet by their exposures."""
    priors = fit_fleet(model, members, quiet_exposures_days)
    out = [Scored(m.key, s, _reasons(model, priors, m)) for m in members
           if (s := score(model, priors, m)) > 0]
    return sorted(out, key=lambda x: (-x.score, x.key))
