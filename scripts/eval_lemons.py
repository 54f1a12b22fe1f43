#!/usr/bin/env python3
"""Score the lemon score against real faults: InfiniteHBD-Trace (StepFun, 400 servers).

    scripts/eval_lemons.py fault_trace.json [--markdown]

At the start of each day d, every node not in a fault at that moment is ranked (the
servers the trace never names are quiet nodes, never in a fault). A node is a positive
when a `Hardware Failure` fault (its Level) starts on it in [d, d + 7 days); the second
target counts only faults of Class `GPU`. Each method raises its top k nodes a day (k = 2,
5, 10; fewer when fewer score above 0; ties at the cut are shared, so the figures are
the expectation under a random tie-break). Precision = true alerts / alerts; recall = true
alerts / positive node-days.

Days whose 7-day window would run past the trace are not scored. The lemon score's
options were chosen on the tuning days (the first two thirds: d + 7 <= 2/3 of the days):
segment and group weights fitted on their first half, every candidate judged on their
second half, the winner's weights fitted again on all of them. The held-out days are
d >= 2/3 of the days, never used to choose; `--tuning-only` stops before them. The
shipped score's rows go through `lemons`' own code (exporter.offline.lemons.rank).
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402

from exporter.analysis.lemons import (  # noqa: E402
    GROUP_OF,
    GROUPS,
    WINDOWS,
    Member,
    Model,
    fit_fleet,
    group_counts,
    group_rates,
)
from exporter.offline.infinitehbd import DAY, EPOCH, Fault, load_faults, to_events  # noqa: E402
from exporter.offline.lemons import members_at, rank  # noqa: E402

SERVERS = 400  # the trace's README: 400 servers sampled
HORIZON = 7.0
KS = (2, 5, 10)
HARDWARE = "Hardware Failure"
TAUS = (1.0, 3.0, 7.0, 14.0, 28.0, math.inf)
FITTED = "fitted"  # the decay option whose segment weights are fitted
FLOORS = (0.0, 1.0)  # the prior's spread floor, in units of mu^2
HARDWARE_GROUPS = ("gpu", "network", "node")
HORIZON_DAYS = 7  # days left out between fitting and validation (the labels' 7 days)
SHIPPED = "lemon score (shipped)"


@dataclass
class Day:
    day: int
    eligible: list[str]
    hw: set[str]  # positives, hardware target
    gpu: set[str]  # positives, GPU-class target
    scores: dict[str, dict[str, float]]  # method -> node -> score (absent = 0)
    # per decay option (tau or FITTED, spread floor): each eligible node's posterior rate
    # per group (GROUPS' order), the fleet's mean rates, which groups it has episodes in
    rates: dict[tuple, dict[str, np.ndarray]] = field(default_factory=dict)
    means: dict[tuple, np.ndarray] = field(default_factory=dict)
    has: dict[tuple, dict[str, np.ndarray]] = field(default_factory=dict)
    # each eligible node's episodes of the hardware groups per window segment (0-1, 1-7,
    # 7-28 d), which the segment weights are fitted to
    segments: dict[str, np.ndarray] = field(default_factory=dict)
    members: list[Member] = field(default_factory=list)  # the nodes with episodes at d


def _in_fault(faults: Sequence[Fault], t: float) -> set[str]:
    """The nodes in a fault at t (faults in time order, as load_faults gives them)."""
    state: dict[str, bool] = {}
    for f in faults:
        if f.time >= t:
            break
        state[f.node] = f.start
    return {n for n, open_ in state.items() if open_}


def baselines(faults: Sequence[Fault], t: float) -> dict[str, dict[str, float]]:
    starts = [f for f in faults if f.start and f.time < t]
    out: dict[str, dict[str, float]] = {k: {} for k in (
        "faults in 30 d (all)", "faults in 30 d (hardware)", "faults in 30 d (GPU)",
        "hardware, decayed 14 d", "MultipleRemediations (>= 5 in 7 d)", "lifetime faults")}

    def add(name: str, node: str, x: float) -> None:
        out[name][node] = out[name].get(node, 0.0) + x

    week: dict[str, int] = {}
    for f in starts:
        age = (t - f.time) / DAY
        hw = f.level == HARDWARE
        if age < 30:
            add("faults in 30 d (all)", f.node, 1)
            if hw:
                add("faults in 30 d (hardware)", f.node, 1)
            if f.cls == "GPU":
                add("faults in 30 d (GPU)", f.node, 1)
        if hw:
            add("hardware, decayed 14 d", f.node, math.exp(-age / 14.0))
        if age < 7:
            week[f.node] = week.get(f.node, 0) + 1
        add("lifetime faults", f.node, 1)
    out["MultipleRemediations (>= 5 in 7 d)"] = {n: 1.0 for n, c in week.items() if c >= 5}
    return out


def build_days(faults: Sequence[Fault]) -> list[Day]:
    events = to_events(faults)
    last_day = int((max(f.time for f in faults) - EPOCH) / DAY) + 1  # the trace's length
    days = []
    for d in range(1, int(last_day - HORIZON) + 1):
        t = EPOCH + d * DAY
        busy = _in_fault(faults, t)
        nodes = sorted({f.node for f in faults})
        eligible = [n for n in nodes if n not in busy]
        eligible += [f"quiet-{i}" for i in range(SERVERS - len(nodes))]
        soon = [f for f in faults if f.start and t <= f.time < t + HORIZON * DAY]
        scores = baselines(faults, t)
        scores[SHIPPED] = {s.key: s.score for s in rank(events, t, EPOCH, SERVERS).nodes}
        day = Day(d, eligible, {f.node for f in soon if f.level == HARDWARE},
                  {f.node for f in soon if f.cls == "GPU"}, scores)
        day.members = members_at(events, t, EPOCH, lambda e: e.node, {})
        by_node = {m.key: m for m in day.members}
        for n in eligible:
            day.segments[n] = _segments(by_node.get(n))
        days.append(day)
    return days


def _segments(member: Member | None) -> np.ndarray:
    """The member's episodes of the hardware groups in 0-1, 1-7 and 7-28 days."""
    out = np.zeros(3)
    for kind, w in (member.counts.items() if member else ()):
        if GROUP_OF[kind] in HARDWARE_GROUPS:
            c1, c7, c28 = (w.get(name, 0.0) for name, _ in WINDOWS)
            out += (c1, c7 - c1, c28 - c7)
    return out


def fit_segments(days: Sequence[Day], iterations: int = 3000) -> tuple[float, float, float]:
    """An episode's weight per window segment: a Poisson model of the hardware faults to
    come, rate = b + sum_s c_s x_s (x: the node's hardware-group episodes per segment),
    by maximum likelihood with b, c >= 0 (EM updates); scaled to a largest weight of 1."""
    x = np.array([[1.0, *day.segments[n]] for day in days for n in day.eligible])
    y = np.array([n in day.hw for day in days for n in day.eligible], float)
    c = np.full(x.shape[1], 0.01)
    column = x.sum(axis=0)
    for _ in range(iterations):
        c = c * ((x * (y / np.maximum(x @ c, 1e-300))[:, None]).sum(axis=0)
                 / np.maximum(column, 1e-300))
    seg = c[1:] / c[1:].max()
    return (float(seg[0]), float(seg[1]), float(seg[2]))


def decay_model(decay, floor: float, segments=None) -> Model:
    if decay == FITTED:
        return Model(segments=tuple(round(float(s), 3) for s in segments), spread_floor=floor)
    return Model(decay, segments=None, spread_floor=floor)


def add_rates(days: Sequence[Day], key: tuple, model: Model) -> None:
    for day in days:
        _rates(day, key, model)


def _rates(day: Day, key: tuple, model: Model) -> None:
    """The per-group posterior rates the candidates are built from (as `rank` computes
    them: the same members, fleet and prior)."""
    tau, members = key, day.members
    exposure = float(day.day)
    priors = fit_fleet(model, members, [exposure] * (SERVERS - len(members)))
    quiet = Member("", {}, exposure)
    zero = np.array(list(group_rates(model, priors, quiet).values()))
    by_node = {m.key: m for m in members}
    day.means[tau] = np.array([priors[g].mean for g in GROUPS])
    day.rates[tau], day.has[tau] = {}, {}
    for n in day.eligible:
        m = by_node.get(n)
        if m is None:
            day.rates[tau][n], day.has[tau][n] = zero, np.zeros(len(GROUPS), bool)
        else:
            counts = group_counts(model, m)
            day.rates[tau][n] = np.array(list(group_rates(model, priors, m).values()))
            day.has[tau][n] = np.array([counts.get(g, 0.0) > 0 for g in GROUPS])


def candidate_scores(day: Day, tau, weights: np.ndarray) -> dict[str, float]:
    """The lemon score of every node for these weights (exporter.analysis.lemons.score)."""
    fleet = float(weights @ day.means[tau])
    if fleet <= 0:
        return {}
    return {n: float(weights @ r) / fleet for n, r in day.rates[tau].items()
            if (day.has[tau][n] & (weights > 0)).any()}


def fit_weights(days: Sequence[Day], tau, iterations: int = 2000) -> np.ndarray:
    """Each group's weight in a Poisson model of the hardware faults to come,
    rate = sum_g w_g x_g (x: the node's posterior rate per group), by maximum likelihood
    with w >= 0 (EM updates, Vardi-Shepp-Kaufman); scaled to a largest weight of 1."""
    x = np.array([day.rates[tau][n] for day in days for n in day.eligible])
    y = np.array([n in day.hw for day in days for n in day.eligible], float)
    w = np.ones(x.shape[1])
    column = x.sum(axis=0)
    for _ in range(iterations):
        rate = x @ w
        w = w * ((x * (y / np.maximum(rate, 1e-300))[:, None]).sum(axis=0)
                 / np.maximum(column, 1e-300))
    return w / w.max()


def _top(scores: dict[str, float], eligible: list[str], positive: set[str],
         k: int) -> tuple[float, float]:
    """(alerts, expected true alerts) for the top k of the eligible nodes scoring above 0."""
    ranked = sorted(((scores[n], n in positive) for n in eligible if scores.get(n, 0) > 0),
                    reverse=True)
    if len(ranked) <= k:
        return float(len(ranked)), float(sum(p for _, p in ranked))
    cut = ranked[k - 1][0]
    above = [p for s, p in ranked if s > cut]
    tied = [p for s, p in ranked if s == cut]
    room = k - len(above)
    return float(k), sum(above) + room * sum(tied) / len(tied)


@dataclass(frozen=True)
class Row:
    alerts: dict[int, float]
    hits: dict[int, float]
    positives: int

    def precision(self, k: int) -> float:
        return self.hits[k] / self.alerts[k] if self.alerts[k] else float("nan")

    def recall(self, k: int) -> float:
        return self.hits[k] / self.positives if self.positives else float("nan")


def evaluate(days: Sequence[Day], method: str, target: Callable[[Day], set[str]]) -> Row:
    alerts = {k: 0.0 for k in KS}
    hits = {k: 0.0 for k in KS}
    positives = 0
    for day in days:
        pos = target(day) & set(day.eligible)
        positives += len(pos)
        for k in KS:
            a, h = _top(day.scores[method], day.eligible, pos, k)
            alerts[k] += a
            hits[k] += h
    return Row(alerts, hits, positives)


def base_rate(days: Sequence[Day], target: Callable[[Day], set[str]]) -> float:
    pos = sum(len(target(d) & set(d.eligible)) for d in days)
    return pos / sum(len(d.eligible) for d in days)


def table(days: Sequence[Day], methods: Sequence[str], markdown: bool) -> str:
    lines = []
    for title, target in (("Hardware Failure", lambda d: d.hw), ("GPU class", lambda d: d.gpu)):
        rate = base_rate(days, target)
        lines.append(f"\nTarget: {title} fault within 7 days; base rate {rate:.2%} of "
                     f"node-days ({len(days)} days)\n")
        head = ["method"] + [f"P@{k}" for k in KS] + [f"R@{k}" for k in KS]
        if markdown:
            lines.append("| " + " | ".join(head) + " |")
            lines.append("|" + "---|" * len(head))
        else:
            lines.append(f"{'method':44}" + "".join(f"{h:>8}" for h in head[1:]))
        for m in methods:
            row = evaluate(days, m, target)
            cells = [f"{row.precision(k):.3f}" if row.alerts[k] else "no alert" for k in KS]
            cells += [f"{row.recall(k):.3f}" for k in KS]
            if markdown:
                lines.append(f"| {m} | " + " | ".join(cells) + " |")
            else:
                lines.append(f"{m:44}" + "".join(f"{c:>8}" for c in cells))
    return "\n".join(lines)


def _precision(days: Sequence[Day], method: str) -> float:
    return sum(evaluate(days, method, lambda d: d.hw).precision(k) for k in (2, 5))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trace", help="fault_trace.json of InfiniteHBD-Trace")
    parser.add_argument("--markdown", action="store_true", help="tables in Markdown")
    parser.add_argument("--tuning-only", action="store_true",
                        help="stop after the tuning days (choose without the held-out ones)")
    args = parser.parse_args(argv)
    faults = load_faults(args.trace)
    days = build_days(faults)
    length = days[-1].day + HORIZON
    split = length * 2.0 / 3.0
    tuning = [d for d in days if d.day + HORIZON <= split]
    held = [d for d in days if d.day >= split]
    # the candidates: fitted weights come from the first half of the tuning days and are
    # judged, with the others, on the second half (validation); the winner's weights are
    # then fitted again on every tuning day
    half = len(tuning) // 2
    fit_part, validation = tuning[:half], tuning[half + HORIZON_DAYS:]
    segments = fit_segments(fit_part)
    hardware = np.array([g in HARDWARE_GROUPS for g in GROUPS], float)
    options: dict[str, tuple[tuple, np.ndarray]] = {}
    for decay in (*TAUS, FITTED):
        for floor in FLOORS:
            key = (decay, floor)
            add_rates(days, key, decay_model(decay, floor, segments))
            what = (f"segments {'/'.join(f'{s:.2f}' for s in segments)}" if decay == FITTED
                    else f"tau={decay:g} d")
            what = f"lemon {what}{f', floor {floor:g}' if floor else ''}"
            options[f"{what}, equal weights"] = (key, np.ones(len(GROUPS)))
            options[f"{what}, hardware groups"] = (key, hardware)
            options[f"{what}, gpu group"] = (key, np.eye(len(GROUPS))[0])
            options[f"{what}, fitted weights"] = (key, fit_weights(fit_part, key))
    for name, (key, w) in options.items():
        for day in days:
            day.scores[name] = candidate_scores(day, key, w)
    names = list(options)
    best = max(names, key=lambda m: _precision(validation, m))
    (decay, floor), weights = options[best]
    if decay == FITTED:
        segments = fit_segments(tuning)
    model = decay_model(decay, floor, segments)
    if "fitted weights" in best:
        add_rates(tuning, ("refit", floor), model)
        weights = fit_weights(tuning, ("refit", floor))
    chosen = ", ".join(f"{g} {w:.3g}" for g, w in zip(GROUPS, weights, strict=True))
    shipped = Model()
    print(f"{SERVERS} servers, {len({f.node for f in faults})} named by the trace; "
          f"{sum(f.start for f in faults)} fault starts, "
          f"{sum(f.start and f.level == HARDWARE for f in faults)} of them hardware")
    print(f"tuning days 1-{tuning[-1].day} (labels end by day {split:.1f}); weights fitted on "
          f"days 1-{fit_part[-1].day}, candidates judged on days {validation[0].day}-"
          f"{validation[-1].day}; held-out days {held[0].day}-{held[-1].day}")
    print(f"best on validation: {best}; on every tuning day: segment weights "
          f"{'/'.join(f'{s:.3g}' for s in model.segment_weights())}, spread floor {floor:g}, "
          f"weights ({chosen})")
    print("shipped (exporter/analysis/lemons.py): segment weights "
          f"{'/'.join(f'{s:.3g}' for s in shipped.segment_weights())}, spread floor "
          f"{shipped.spread_floor:g}, weights "
          + ", ".join(f"{g} {w:.3g}" for g, w in zip(GROUPS, shipped.weights, strict=True)))
    base = [m for m in days[0].scores if m not in options and m != SHIPPED]
    print("\n## Validation days (second half of the tuning days): every candidate")
    print(table(validation, names + base, args.markdown))
    print("\n## Tuning days: the shipped score and the baselines")
    print(table(tuning, [SHIPPED] + base, args.markdown))
    if args.tuning_only:
        return 0
    print("\n## Held-out days (the last third)")
    print(table(held, [SHIPPED] + base, args.markdown))
    print("\n## All days (tuning and held-out together)")
    print(table(days, [SHIPPED] + base, args.markdown))
    return 0


if __name__ == "__main__":
    sys.exit(main())
