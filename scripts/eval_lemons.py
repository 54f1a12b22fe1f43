#!/usr/bin/env python3
"""Score the lemon score against real faults: InfiniteHBD-Trace (StepFun, 400 servers).

    scripts/eval_lemons.py fault_trace.json [--markdown] [--tuning-only]

At the start of each day d, every node not in a fault at that moment is ranked (the
servers the trace never names are quiet nodes, never in a fault). A node is a positive
when a `Hardware Failure` fault (its Level) starts on it in [d, d + 7 days); the second
target counts only faults of Class `GPU`. Each method raises its top k nodes a day (k = 2,
5, 10; fewer when fewer score above 0; ties at the cut are shared, so the figures are
the expectation under a random tie-break). Precision = true alerts / alerts; recall = true
alerts / positive node-days. Days whose 7-day window would run past the trace are not
scored.

The candidates are chosen on the tuning days (the first two thirds: d + 7 <= 2/3 of the
days) by two-fold cross-validation: the tuning days are cut in two halves, 7 days apart
(the labels' 7 days), each candidate's weights are fitted on one half and judged on the
other, both ways, and the candidate with the best mean precision at 2 and 5 alerts a day
wins. Its weights fitted on every tuning day score the held-out days (d >= 2/3 of the
days, never used to choose or fit: the fair test); `--tuning-only` stops before them.
Last, its weights are fitted once more on every scored day, tuning and held-out: those
ship (exporter/analysis/lemons.py; tests/test_eval_lemons.py checks that they are), and
its rows on the held-out days are in-sample. The shipped score's rows go through `lemons`' own code
(exporter.offline.lemons.rank).
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

from exporter.analysis.lemons import GROUP_OF, GROUPS, KIND_WEIGHTS, TAU_DAYS, Model  # noqa: E402
from exporter.events import KINDS  # noqa: E402
from exporter.offline.infinitehbd import DAY, EPOCH, Fault, load_faults, to_events  # noqa: E402
from exporter.offline.lemons import rank  # noqa: E402

SERVERS = 400  # the trace's README: 400 servers sampled
HORIZON = 7.0
KS = (2, 5, 10)
HARDWARE = "Hardware Failure"
TAUS = (3.0, 7.0, 14.0, 28.0, math.inf)
SEGMENTS = ((0.0, 1.0), (1.0, 7.0), (7.0, 28.0))
KIND_LIST = tuple(GROUP_OF)  # every kind, in the vocabulary's group order
GROUP_LIST = tuple(GROUPS)
SHIPPED = "lemon score (shipped)"
TUNED = "lemon score (fitted on the tuning days)"


@dataclass
class Day:
    day: int
    eligible: list[str]
    hw: np.ndarray  # per eligible node: a Hardware Failure fault starts within 7 days
    gpu: np.ndarray  # the same for a GPU-class fault
    episodes: np.ndarray  # eligible node x kind x segment (0-1, 1-7, 7-28 d)
    scores: dict[str, np.ndarray] = field(default_factory=dict)  # method -> per eligible


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
    nodes = sorted({f.node for f in faults})
    quiet = [f"quiet-{i}" for i in range(SERVERS - len(nodes))]
    days = []
    for d in range(1, int(last_day - HORIZON) + 1):
        t = EPOCH + d * DAY
        busy = _in_fault(faults, t)
        eligible = [n for n in nodes if n not in busy] + quiet
        index = {n: i for i, n in enumerate(eligible)}
        episodes = np.zeros((len(eligible), len(KIND_LIST), len(SEGMENTS)))
        for e in events:
            if e.time >= t:
                break
            age = (t - e.time) / DAY
            for s, (lo, hi) in enumerate(SEGMENTS):
                if e.node in index and lo <= age < hi:
                    episodes[index[e.node], KIND_LIST.index(e.kind), s] += 1
        soon = [f for f in faults if f.start and t <= f.time < t + HORIZON * DAY]
        hw = {f.node for f in soon if f.level == HARDWARE}
        gpu = {f.node for f in soon if f.cls == "GPU"}
        day = Day(d, eligible, np.array([n in hw for n in eligible], float),
                  np.array([n in gpu for n in eligible], float), episodes)
        for name, by_node in baselines(faults, t).items():
            day.scores[name] = _vector(by_node, eligible)
        shipped = {s.key: s.score for s in rank(events, t, SERVERS).nodes}
        day.scores[SHIPPED] = _vector(shipped, eligible)
        days.append(day)
    return days


def _vector(by_node: dict[str, float], eligible: list[str]) -> np.ndarray:
    return np.array([by_node.get(n, 0.0) for n in eligible])


# -- the candidates ------------------------------------------------------------------------

def decay(tau: float) -> np.ndarray:
    """The segments' weights (as Model.segment_weights)."""
    return np.array(Model(tau_days=tau).segment_weights())


def decayed(day: Day, tau: float, columns: str) -> np.ndarray:
    """Each eligible node's decayed episodes per kind (columns='kind') or per group."""
    per_kind = day.episodes @ decay(tau)
    if columns == "kind":
        return per_kind
    return np.stack([per_kind[:, [KIND_LIST.index(k) for k in GROUPS[g]]].sum(axis=1)
                     for g in GROUP_LIST], axis=1)


def fit_poisson(days: Sequence[Day], tau: float, columns: str,
                iterations: int = 4000) -> np.ndarray:
    """The weights of a self-exciting Poisson model of the Hardware Failure faults to come,
    rate = b + sum_j w_j x_j (x: the node's decayed episodes per kind or group), by
    maximum likelihood with b, w >= 0 (EM updates, Vardi-Shepp-Kaufman). Returns w (per
    column; a column with no episode in the days gets NaN: nothing measured it)."""
    x = np.vstack([np.hstack([np.ones((len(d.eligible), 1)), decayed(d, tau, columns)])
                   for d in days])
    y = np.concatenate([d.hw for d in days])
    # the node-days without an episode all have the same rate: one row, counted m times
    quiet = (x[:, 1:] == 0).all(axis=1)
    m = np.concatenate([np.ones(int((~quiet).sum())), [quiet.sum()]])
    y = np.concatenate([y[~quiet], [y[quiet].sum()]])
    x = np.vstack([x[~quiet], np.eye(1, x.shape[1])])
    c = np.full(x.shape[1], 0.01)
    column = (x * m[:, None]).sum(axis=0)
    seen = column > 0
    for _ in range(iterations):
        rate = np.maximum(x[:, seen] @ c[seen], 1e-300)
        c[seen] *= (x[:, seen] * (y / rate)[:, None]).sum(axis=0) / column[seen]
    c[seen & (c < 1e-9)] = 0.0  # what EM drives toward 0 is 0
    c[~seen] = np.nan
    return c[1:]


def fit_kind_weights(days: Sequence[Day], tau: float) -> dict[str, float]:
    """Each kind's weight: its own fit, or, for a kind the days never show, its group's
    (fitted with the group's kinds pooled)."""
    per_kind = fit_poisson(days, tau, "kind")
    per_group = dict(zip(GROUP_LIST, fit_poisson(days, tau, "group"), strict=True))
    out = {}
    for kind, w in zip(KIND_LIST, per_kind, strict=True):
        w = per_group[GROUP_OF[kind]] if np.isnan(w) else w
        out[kind] = 0.0 if np.isnan(w) else float(f"{w:.3g}")
    return out


def hawkes_scores(day: Day, tau: float, weights: dict[str, float]) -> np.ndarray:
    """The shipped score's formula (exporter.analysis.lemons) in numpy: excitation over
    the fleet's mean."""
    w = np.array([weights.get(k, 0.0) for k in KIND_LIST])
    x = decayed(day, tau, "kind") @ w
    total = x.sum()
    return x / (total / SERVERS) if total > 0 else x


def gamma_poisson_scores(day: Day, tau: float, group_weights: np.ndarray) -> np.ndarray:
    """The other option: each group's gamma-Poisson posterior rate against the fleet's
    (prior by moments over the fleet, spread at least mu^2, exposure = the decayed days
    watched), the groups summed with weights, over the fleet's rate."""
    n = decayed(day, tau, "group")
    seg = decay(tau)
    watched = [min(max(day.day - lo, 0.0), hi - lo) for lo, hi in SEGMENTS]
    exposure = float(seg @ np.array(watched))
    mu = n.sum(axis=0) / (exposure * SERVERS)
    spread = (n ** 2 / exposure).sum(axis=0) - mu * n.sum(axis=0)
    denominator = SERVERS * exposure - SERVERS * exposure ** 2 / (SERVERS * exposure)
    var = np.maximum((spread - (SERVERS - 1) * mu) / denominator, mu ** 2)
    rate = np.where(mu > 0, (mu ** 2 + var * n) / np.maximum(mu + var * exposure, 1e-300), 0.0)
    fleet = float(group_weights @ mu)
    has = (n[:, group_weights > 0] > 0).any(axis=1)
    return np.where(has, rate @ group_weights / fleet, 0.0) if fleet > 0 else np.zeros(len(n))


@dataclass(frozen=True)
class Candidate:
    name: str
    tau: float
    fitted: str | None  # "kind" or "group": weights fitted on the days given; None: fixed
    group_weights: tuple[float, ...] = ()  # the gamma-Poisson options' fixed weights

    def scores(self, day: Day, weights: dict[str, float] | np.ndarray | None) -> np.ndarray:
        if self.fitted == "kind":
            return hawkes_scores(day, self.tau, weights)  # type: ignore[arg-type]
        if self.fitted == "group":  # the ranking needs no fleet mean
            return decayed(day, self.tau, "group") @ np.nan_to_num(weights)  # type: ignore[arg-type]
        return gamma_poisson_scores(day, self.tau, np.array(self.group_weights))

    def fit(self, days: Sequence[Day]):
        if self.fitted == "kind":
            return fit_kind_weights(days, self.tau)
        if self.fitted == "group":
            return fit_poisson(days, self.tau, "group")
        return None


def candidates() -> list[Candidate]:
    out = []
    gpu_only = tuple(float(g == "gpu") for g in GROUP_LIST)
    hardware = tuple(float(g != "other") for g in GROUP_LIST)
    for tau in TAUS:
        t = f"tau={tau:g} d"
        out.append(Candidate(f"self-exciting, weight per kind, {t}", tau, "kind"))
        out.append(Candidate(f"self-exciting, weight per group, {t}", tau, "group"))
        out.append(Candidate(f"gamma-Poisson, gpu group, {t}", tau, None, gpu_only))
        out.append(Candidate(f"gamma-Poisson, hardware groups, {t}", tau, None, hardware))
        out.append(Candidate(f"gamma-Poisson, every group, {t}", tau, None,
                             (1.0,) * len(GROUP_LIST)))
    return out


# -- judging -------------------------------------------------------------------------------

def _top(scores: np.ndarray, positive: np.ndarray, k: int) -> tuple[float, float]:
    """(alerts, expected true alerts) for the top k of the nodes scoring above 0."""
    keep = scores > 0
    s, p = scores[keep], positive[keep]
    if len(s) <= k:
        return float(len(s)), float(p.sum())
    cut = np.sort(s)[::-1][k - 1]
    above = s > cut
    tied = s == cut
    return float(k), float(p[above].sum() + (k - above.sum()) * p[tied].mean())


@dataclass(frozen=True)
class Row:
    alerts: dict[int, float]
    hits: dict[int, float]
    positives: float

    def precision(self, k: int) -> float:
        return self.hits[k] / self.alerts[k] if self.alerts[k] else float("nan")

    def recall(self, k: int) -> float:
        return self.hits[k] / self.positives if self.positives else float("nan")


def evaluate(days: Sequence[Day], method: str, target: Callable[[Day], np.ndarray]) -> Row:
    alerts = {k: 0.0 for k in KS}
    hits = {k: 0.0 for k in KS}
    positives = 0.0
    for day in days:
        pos = target(day)
        positives += float(pos.sum())
        for k in KS:
            a, h = _top(day.scores[method], pos, k)
            alerts[k] += a
            hits[k] += h
    return Row(alerts, hits, positives)


def base_rate(days: Sequence[Day], target: Callable[[Day], np.ndarray]) -> float:
    return sum(float(target(d).sum()) for d in days) / sum(len(d.eligible) for d in days)


TARGETS = (("Hardware Failure", lambda d: d.hw), ("GPU class", lambda d: d.gpu))


def table(days: Sequence[Day], methods: Sequence[str], markdown: bool) -> str:
    lines = []
    for title, target in TARGETS:
        rate = base_rate(days, target)
        lines.append(f"\nTarget: {title} fault within 7 days; base rate {rate:.2%} of "
                     f"node-days ({len(days)} days)\n")
        head = ["method"] + [f"P@{k}" for k in KS] + [f"R@{k}" for k in KS]
        if markdown:
            lines.append("| " + " | ".join(head) + " |")
            lines.append("|" + "---|" * len(head))
        else:
            lines.append(f"{'method':48}" + "".join(f"{h:>9}" for h in head[1:]))
        for m in methods:
            row = evaluate(days, m, target)
            cells = [f"{row.precision(k):.3f}" if row.alerts[k] else "no alert" for k in KS]
            cells += [f"{row.recall(k):.3f}" for k in KS]
            if markdown:
                lines.append(f"| {m} | " + " | ".join(cells) + " |")
            else:
                lines.append(f"{m:48}" + "".join(f"{c:>9}" for c in cells))
    return "\n".join(lines)


def _hardware_precision(days: Sequence[Day], method: str) -> tuple[float, ...]:
    row = evaluate(days, method, lambda d: d.hw)
    return tuple(row.precision(k) for k in KS)


def folds(tuning: Sequence[Day]) -> tuple[list[Day], list[Day]]:
    """The tuning days' two halves, 7 days apart (a day's label looks 7 days ahead)."""
    half = len(tuning) // 2
    return list(tuning[:half - int(HORIZON) // 2]), list(tuning[half + int(HORIZON) // 2:])


def cross_validate(tuning: Sequence[Day], markdown: bool) -> tuple[Candidate, str]:
    """Every candidate judged on each half with what it fitted on the other; the best mean
    precision at 2 and 5 wins. Returns it and the table."""
    a, b = folds(tuning)
    results: dict[str, tuple[float, ...]] = {}
    lines = [f"\nFold A: days {a[0].day}-{a[-1].day}; fold B: days {b[0].day}-{b[-1].day}; "
             "each judged with the weights fitted on the other\n"]
    head = ["candidate", "A P@2", "A P@5", "A P@10", "B P@2", "B P@5", "B P@10", "mean P@2,5"]
    if markdown:
        lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    else:
        lines.append(f"{head[0]:48}" + "".join(f"{h:>11}" for h in head[1:]))
    rows: list[tuple[str, tuple[float, ...]]] = []
    for cand in candidates():
        got: tuple[float, ...] = ()
        for judged, fitted in ((a, b), (b, a)):
            weights = cand.fit(fitted)
            for day in judged:
                day.scores[cand.name] = cand.scores(day, weights)
            got += _hardware_precision(judged, cand.name)
        rows.append((cand.name, got))
    rows += [(m, _hardware_precision(a, m) + _hardware_precision(b, m))
             for m in _baseline_names(tuning)]
    for name, got in rows:
        results[name] = got
        mean = float(np.mean(np.nan_to_num([got[0], got[1], got[3], got[4]])))
        cells = [f"{x:.3f}" if x == x else "no alert" for x in got] + [f"{mean:.3f}"]
        lines.append(f"| {name} | " + " | ".join(cells) + " |" if markdown
                     else f"{name:48}" + "".join(f"{c:>11}" for c in cells))
    best = max(candidates(), key=lambda c: np.mean(np.array(results[c.name])[[0, 1, 3, 4]]))
    return best, "\n".join(lines)


def _baseline_names(days: Sequence[Day]) -> list[str]:
    """The baselines' names (build_days scores them before any candidate)."""
    return [m for m in list(days[0].scores)[:list(days[0].scores).index(SHIPPED)]]


def split_days(days: Sequence[Day]) -> tuple[list[Day], list[Day], float]:
    """The tuning days (their labels end by 2/3 of the trace) and the held-out ones."""
    split = (days[-1].day + HORIZON) * 2.0 / 3.0
    return ([d for d in days if d.day + HORIZON <= split],
            [d for d in days if d.day >= split], split)


def choose(tuning: Sequence[Day], markdown: bool = False):
    """The candidate cross-validation picks, its weights fitted on every tuning day (None
    where it fits none), and the cross-validation table."""
    best, cv_table = cross_validate(tuning, markdown)
    weights = fit_kind_weights(tuning, best.tau) if best.fitted == "kind" else None
    return best, weights, cv_table


def _weights(tau: float, weights: dict[str, float]) -> str:
    return (f"TAU_DAYS = {tau:g}; KIND_WEIGHTS = {{"
            + ", ".join(f'"{k}": {w:g}' for k, w in weights.items() if w > 0) + "}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trace", help="fault_trace.json of InfiniteHBD-Trace")
    parser.add_argument("--markdown", action="store_true", help="tables in Markdown")
    parser.add_argument("--tuning-only", action="store_true",
                        help="stop after the tuning days (choose without the held-out ones)")
    args = parser.parse_args(argv)
    faults = load_faults(args.trace)
    days = build_days(faults)
    tuning, held, split = split_days(days)
    best, weights, cv_table = choose(tuning, args.markdown)
    print(f"{SERVERS} servers, {len({f.node for f in faults})} named by the trace; "
          f"{sum(f.start for f in faults)} fault starts, "
          f"{sum(f.start and f.level == HARDWARE for f in faults)} of them hardware")
    print(f"tuning days 1-{tuning[-1].day} (labels end by day {split:.1f}); "
          f"held-out days {held[0].day}-{held[-1].day}")
    print(f"best by cross-validation: {best.name}")
    base = _baseline_names(days)
    methods = [SHIPPED] + base
    if weights is not None:
        print(f"fitted on the tuning days: {_weights(best.tau, weights)}")
        for day in days:
            day.scores[TUNED] = hawkes_scores(day, best.tau, weights)
        methods = [TUNED] + methods
    print("\n## Cross-validation on the tuning days: every candidate and the baselines "
          "(Hardware Failure target, precision)")
    print(cv_table)
    print("\n## Tuning days")
    print(table(tuning, methods, args.markdown))
    if args.tuning_only:
        return 0
    print("\n## Held-out days (the last third; the shipped weights were fitted on them too)")
    print(table(held, methods, args.markdown))
    print("\n## All days (tuning and held-out together)")
    print(table(days, methods, args.markdown))
    final = fit_kind_weights(days, best.tau) if best.fitted == "kind" else None
    if final is not None:
        print(f"\nfitted on every day (what ships): {_weights(best.tau, final)}")
        same = best.tau == TAU_DAYS and final == {k: KIND_WEIGHTS.get(k, 0.0) for k in KINDS}
        print("shipped (exporter/analysis/lemons.py): " + (
            "the same" if same else f"DIFFERENT: {_weights(TAU_DAYS, KIND_WEIGHTS)}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
