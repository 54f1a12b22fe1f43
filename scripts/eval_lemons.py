#!/usr/bin/env python3
"""Choose the lemon score on rolling origins, and judge it on later origins the choice
did not use.

    scripts/eval_lemons.py FILE [--markdown] [--selection-only] [--fleet-nodes N]

FILE is InfiniteHBD-Trace's fault_trace.json (StepFun, 400 servers) or a fleet's own
fault events as JSON Lines (`history --format jsonl` from every node, concatenated); the
format is sniffed as `lemons` does.

At the start of each day d, every node not in a fault at that moment is ranked (the
servers the file never names are quiet nodes, never in a fault; events have no end, so
with JSON Lines every node is ranked every day). A node is a positive when a hardware
fault starts on it in [d, d + 7 days): in the trace a fault of Level `Hardware Failure`,
in events an episode of a hardware kind (an XID only where the catalogue asks for a
reset, a reboot or service). Each method raises its top k nodes a day (k = 2, 5, 10; fewer
when fewer score above 0; ties at the cut are shared, so the figures are the expectation
under a random tie-break).

Rolling origins: every 7 days from day 60. At each origin o every candidate is fitted on
the days whose 7-day labels end by o (d + 7 <= o) and judged on the days o to o + 6; its
precision at k at that origin is its true alerts over its alerts on those days. A model's
figure is the mean over origins and its spread the standard deviation across them. The
choice uses the selection origins (up to SELECTION_LAST) only: the best mean precision at
2 and at 5 alerts a day among the shippable candidates (those the exporter's kinds can
compute); then the simplest candidate (fewest chosen or fitted numbers) whose mean at 2
and at 5 is within the best's spread at each. The report origins (after SELECTION_LAST)
judge that choice once. What ships is the chosen candidate (a fitted one refitted on every
scored day): exporter/analysis/lemons.py, which tests/test_eval_lemons.py checks.
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
    HARDWARE_KINDS,
    KIND_WEIGHTS,
    NAME,
    TAU_DAYS,
    Model,
    counted,
)
from exporter.commands.lemons import INFINITEHBD, load_input, rank  # noqa: E402
from exporter.events import Event  # noqa: E402
from exporter.offline.infinitehbd import DAY, EPOCH, Fault, to_events  # noqa: E402

TRACE_SERVERS = 400  # the trace's README: 400 servers sampled
HORIZON = 7
KS = (2, 5, 10)
HARDWARE = "Hardware Failure"
SEGMENTS = ((0.0, 1.0), (1.0, 7.0), (7.0, 28.0))  # the exporter's windows, as segments
KIND_LIST = tuple(GROUP_OF)  # every kind, in the vocabulary's group order
GROUP_LIST = tuple(GROUPS)
GPU_KINDS = GROUPS["gpu"]
FIRST_ORIGIN = 60
STEP = 7
SELECTION_LAST = 151  # origins up to this day choose; the later ones judge the choice
SHRINK_EPISODES = 5.0  # per-kind weights: a kind's own fit counts as much as its group's
# once the days hold this many of its episodes (a prior's strength, set before fitting)
SHIPPED = f"shipped: {NAME}"


# -- the days ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Start:
    """A fault's start, with the labels the targets use."""

    node: str
    time: float
    hardware: bool
    gpu: bool


@dataclass
class Day:
    day: int
    eligible: list[str]
    hw: np.ndarray  # per eligible node: a hardware fault starts within 7 days
    episodes: np.ndarray  # eligible node x kind x segment (0-1, 1-7, 7-28 d)
    new: np.ndarray  # per kind: episodes started in the day before (any node)
    scores: dict[str, np.ndarray] = field(default_factory=dict)  # reference -> per eligible


@dataclass(frozen=True)
class Fleet:
    """What the days are built from: the events scored, the starts labelled, who is in
    a fault when (trace only), the fleet's size and its day 0."""

    events: list[Event]
    starts: list[Start]
    faults: list[Fault]
    servers: int
    epoch: float
    end: float  # the file's last record


def fleet_of_trace(faults: Sequence[Fault], epoch: float) -> Fleet:
    starts = [Start(f.node, f.time, f.level == HARDWARE, f.cls == "GPU")
              for f in faults if f.start]
    return Fleet(to_events(faults), starts, list(faults), TRACE_SERVERS, epoch,
                 max(f.time for f in faults))


def fleet_of_events(events: Sequence[Event], servers: int) -> Fleet:
    """A fleet's own events: an episode of a hardware kind (an XID only where it counts)
    is a hardware fault; the GPU group's kinds are its GPU faults. Day 0: the first
    event's day."""
    kept = sorted((e for e in events if counted(e.kind, e.xid)), key=lambda e: e.time)
    starts = [Start(e.node, e.time, e.kind in HARDWARE_KINDS, e.kind in GPU_KINDS)
              for e in kept]
    epoch = math.floor(kept[0].time / DAY) * DAY
    return Fleet(kept, starts, [], servers, epoch, kept[-1].time)


def _in_fault(faults: Sequence[Fault], t: float) -> set[str]:
    """The nodes in a fault at t (faults in time order, as load_faults gives them)."""
    state: dict[str, bool] = {}
    for f in faults:
        if f.time >= t:
            break
        state[f.node] = f.start
    return {n for n, open_ in state.items() if open_}


def baselines(starts: Sequence[Start], t: float) -> dict[str, dict[str, float]]:
    """The counts as the trace labels them (Level and Class, not our kinds): references,
    which the exporter cannot compute."""
    out: dict[str, dict[str, float]] = {k: {} for k in (
        "ref: faults in 30 d (GPU class)", "ref: faults in 30 d (Hardware Failure)",
        "ref: faults in 30 d (all)", "ref: hardware faults, decayed 14 d",
        "ref: lifetime faults")}

    def add(name: str, node: str, x: float) -> None:
        out[name][node] = out[name].get(node, 0.0) + x

    for s in starts:
        if s.time >= t:
            break
        age = (t - s.time) / DAY
        if age < 30:
            add("ref: faults in 30 d (all)", s.node, 1)
            if s.hardware:
                add("ref: faults in 30 d (Hardware Failure)", s.node, 1)
            if s.gpu:
                add("ref: faults in 30 d (GPU class)", s.node, 1)
        if s.hardware:
            add("ref: hardware faults, decayed 14 d", s.node, math.exp(-age / 14.0))
        add("ref: lifetime faults", s.node, 1)
    return out


def build_days(fleet: Fleet) -> list[Day]:
    last_day = math.floor((fleet.end - fleet.epoch) / DAY) - HORIZON  # its 7 days in the file
    nodes = sorted({e.node for e in fleet.events} | {s.node for s in fleet.starts})
    quiet = [f"quiet-{i}" for i in range(max(fleet.servers - len(nodes), 0))]
    days = []
    for d in range(1, last_day + 1):
        t = fleet.epoch + d * DAY
        busy = _in_fault(fleet.faults, t)
        eligible = [n for n in nodes if n not in busy] + quiet
        index = {n: i for i, n in enumerate(eligible)}
        episodes = np.zeros((len(eligible), len(KIND_LIST), len(SEGMENTS)))
        new = np.zeros(len(KIND_LIST))
        for e in fleet.events:
            if e.time >= t:
                break
            age = (t - e.time) / DAY
            new[KIND_LIST.index(e.kind)] += age < 1.0
            for s, (lo, hi) in enumerate(SEGMENTS):
                if e.node in index and lo <= age < hi:
                    episodes[index[e.node], KIND_LIST.index(e.kind), s] += 1
        soon = {s.node for s in fleet.starts if s.hardware and t <= s.time < t + HORIZON * DAY}
        day = Day(d, eligible, np.array([n in soon for n in eligible], float), episodes, new)
        for name, by_node in baselines(fleet.starts, t).items():
            day.scores[name] = _vector(by_node, eligible)
        shipped = {s.key: s.score for s in rank(fleet.events, t, fleet.servers).nodes}
        day.scores[SHIPPED] = _vector(shipped, eligible)
        days.append(day)
    return days


def _vector(by_node: dict[str, float], eligible: list[str]) -> np.ndarray:
    return np.array([by_node.get(n, 0.0) for n in eligible])


# -- the candidates ------------------------------------------------------------------------

def decayed(day: Day, tau: float) -> np.ndarray:
    """Each eligible node's episodes per kind, weighed by age as the exporter's windows
    allow (Model.segment_weights)."""
    return day.episodes @ np.array(Model(tau_days=tau).segment_weights())


def model_scores(day: Day, model: Model) -> np.ndarray:
    """The score's ranking (its excitation; the fleet's mean does not change the order)."""
    return decayed(day, model.tau_days) @ np.array([model.weight(k) for k in KIND_LIST])


def repeat_scores(day: Day) -> np.ndarray:
    """Hardware episodes in 28 days, plus one for each that repeats a kind the node had."""
    n = day.episodes.sum(axis=2)[:, [KIND_LIST.index(k) for k in HARDWARE_KINDS]]
    return n.sum(axis=1) + np.maximum(n - 1, 0).sum(axis=1)


def fit_poisson(days: Sequence[Day], tau: float, columns: Sequence[Sequence[str]],
                iterations: int = 2000) -> np.ndarray:
    """The weights of a self-exciting Poisson model of the hardware faults to come,
    rate = b + sum_j w_j x_j (x_j: the node's decayed episodes of the kinds of column j),
    by maximum likelihood with b, w >= 0 (EM updates, Vardi-Shepp-Kaufman). Returns w (a
    column with no episode in the days gets NaN: nothing measured it)."""
    pick = np.array([[k in col for col in columns] for k in KIND_LIST], float)
    x = np.vstack([np.hstack([np.ones((len(d.eligible), 1)), decayed(d, tau) @ pick])
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


def _rounded(weights: dict[str, float]) -> dict[str, float]:
    return {k: float(f"{w:.3g}") for k, w in weights.items() if w > 0 and not math.isnan(w)}


def fit_two(days: Sequence[Day]) -> Model:
    """A weight for the GPU kinds and one for the other hardware kinds, 28-day counts."""
    gpu, other = fit_poisson(days, math.inf, (GPU_KINDS, tuple(
        k for k in HARDWARE_KINDS if k not in GPU_KINDS)))
    return Model(math.inf, _rounded({k: gpu if k in GPU_KINDS else other
                                     for k in HARDWARE_KINDS}))


def fit_groups(days: Sequence[Day], tau: float) -> Model:
    """A weight per kind group, its kinds pooled."""
    w = fit_poisson(days, tau, [GROUPS[g] for g in GROUP_LIST])
    by_group = dict(zip(GROUP_LIST, w, strict=True))
    return Model(tau, _rounded({k: by_group[GROUP_OF[k]] for k in KIND_LIST}))


def fit_kinds(days: Sequence[Day], tau: float, shrink: float) -> Model:
    """A weight per kind, pulled toward its group's pooled weight: (n w_kind + s w_group)
    / (n + s), n the kind's episodes in the days, s = shrink (0: each kind its own fit; a
    kind the days never show takes its group's weight)."""
    per_kind = fit_poisson(days, tau, [(k,) for k in KIND_LIST])
    by_group = dict(zip(GROUP_LIST, fit_poisson(days, tau, [GROUPS[g] for g in GROUP_LIST]),
                        strict=True))
    n = sum(d.new for d in days)
    out = {}
    for i, kind in enumerate(KIND_LIST):
        group = np.nan_to_num(by_group[GROUP_OF[kind]])
        own = per_kind[i]
        out[kind] = group if math.isnan(own) else (n[i] * own + shrink * group) / (n[i] + shrink)
    return Model(tau, _rounded(out))


def count_model(kinds: Sequence[str], tau: float = math.inf, twice: Sequence[str] = ()
                ) -> Model:
    return Model(tau, {k: 2.0 if k in twice else 1.0 for k in kinds})


@dataclass(frozen=True)
class Candidate:
    name: str
    numbers: int  # how many numbers it chose or fitted: the simpler, the fewer
    model: Model | None = None  # a fixed score
    fit: Callable[[Sequence[Day]], Model] | None = None  # a fitted one
    custom: Callable[[Day], np.ndarray] | None = None  # a score the rules do not compute
    reference: bool = False  # the trace's own labels: a reference, not a choice

    @property
    def shippable(self) -> bool:
        return not self.reference and self.custom is None

    def scorer(self, training: Sequence[Day]) -> Callable[[Day], np.ndarray]:
        if self.reference:
            return lambda day: day.scores[self.name]
        if self.custom is not None:
            return self.custom
        model = self.fit(training) if self.fit is not None else self.model
        return lambda day: model_scores(day, model)  # type: ignore[arg-type]


def candidates() -> list[Candidate]:
    hw = HARDWARE_KINDS
    every = KIND_LIST
    out = [
        Candidate("GPU-kind episodes in 28 d", 0, count_model(GPU_KINDS)),
        Candidate("hardware-kind episodes in 28 d", 0, count_model(hw)),
        Candidate("every episode in 28 d", 0, count_model(every)),
        Candidate("GPU-kind episodes, decayed tau=7 d", 1, count_model(GPU_KINDS, 7.0)),
        Candidate("GPU-kind episodes, decayed tau=14 d", 1, count_model(GPU_KINDS, 14.0)),
        Candidate("hardware-kind episodes, decayed tau=7 d", 1, count_model(hw, 7.0)),
        Candidate("hardware-kind episodes, decayed tau=14 d", 1, count_model(hw, 14.0)),
        Candidate("GPU + hardware episodes in 28 d (GPU kinds twice)", 1,
                  count_model(hw, twice=GPU_KINDS)),
        Candidate("hardware episodes in 28 d + repeats of a kind", 1, custom=repeat_scores),
        Candidate("fitted: GPU and other hardware weights, 28 d", 2, fit=fit_two),
    ]
    for tau in (28.0, math.inf):
        t = f"tau={tau:g} d"
        out.append(Candidate(f"fitted: weight per group, {t}", len(GROUPS) + 1,
                             fit=lambda days, tau=tau: fit_groups(days, tau)))
        out.append(Candidate(f"fitted: weight per kind pulled to its group, {t}",
                             len(KIND_LIST) + 1,
                             fit=lambda days, tau=tau: fit_kinds(days, tau, SHRINK_EPISODES)))
        out.append(Candidate(f"fitted: weight per kind (the previous score), {t}",
                             len(KIND_LIST) + 1,
                             fit=lambda days, tau=tau: fit_kinds(days, tau, 0.0)))
    return out


def references(days: Sequence[Day]) -> list[Candidate]:
    return [Candidate(name, 0, reference=True) for name in days[0].scores if name != SHIPPED]


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


def precision(days: Sequence[Day], score: Callable[[Day], np.ndarray]) -> np.ndarray:
    """Precision at each k over the days (no alert at all: 0)."""
    alerts, hits = np.zeros(len(KS)), np.zeros(len(KS))
    for day in days:
        s = score(day)
        for i, k in enumerate(KS):
            a, h = _top(s, day.hw, k)
            alerts[i] += a
            hits[i] += h
    return np.divide(hits, alerts, out=np.zeros(len(KS)), where=alerts > 0)


def origins(days: Sequence[Day]) -> list[int]:
    return list(range(FIRST_ORIGIN, days[-1].day + 1, STEP)) if days else []


@dataclass(frozen=True)
class Result:
    """One candidate's precision at each k (columns) at each origin (rows)."""

    name: str
    per_origin: np.ndarray

    def mean(self, i: int) -> float:
        return float(self.per_origin[:, i].mean())

    def spread(self, i: int) -> float:
        """The standard deviation across origins."""
        rows = self.per_origin[:, i]
        return float(rows.std(ddof=1)) if len(rows) > 1 else 0.0


def judge(days: Sequence[Day], cands: Sequence[Candidate], at: Sequence[int]) -> list[Result]:
    by_day = {d.day: d for d in days}
    rows: dict[str, list[np.ndarray]] = {c.name: [] for c in cands}
    for o in at:
        training = [d for d in days if d.day + HORIZON <= o]
        judged = [by_day[d] for d in range(o, o + STEP) if d in by_day]
        for c in cands:
            rows[c.name].append(precision(judged, c.scorer(training)))
    return [Result(c.name, np.array(rows[c.name])) for c in cands]


def choose(results: Sequence[Result], cands: Sequence[Candidate]) -> Candidate:
    """The simplest shippable candidate within the best's spread at 2 and at 5 alerts a
    day (the best: the highest mean at each; ties of simplicity: the higher mean of the
    two)."""
    by_name = {r.name: r for r in results}
    ship = [c for c in cands if c.shippable]
    near = []
    for c in ship:
        r = by_name[c.name]
        ok = True
        for i in (KS.index(2), KS.index(5)):
            best = max((by_name[s.name] for s in ship), key=lambda x: x.mean(i))
            ok &= r.mean(i) >= best.mean(i) - best.spread(i)
        if ok:
            near.append(c)
    return min(near, key=lambda c: (c.numbers, -(by_name[c.name].mean(0)
                                                 + by_name[c.name].mean(1))))


def table(results: Sequence[Result], markdown: bool) -> str:
    head = ["candidate"] + [f"P@{k} mean ± sd" for k in KS]
    lines = []
    if markdown:
        lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    else:
        lines.append(f"{head[0]:58}" + "".join(f"{h:>18}" for h in head[1:]))
    for r in results:
        cells = [f"{r.mean(i):.3f} ± {r.spread(i):.3f}" for i in range(len(KS))]
        lines.append(f"| {r.name} | " + " | ".join(cells) + " |" if markdown
                     else f"{r.name:58}" + "".join(f"{c:>18}" for c in cells))
    return "\n".join(lines)


def fit_shipped(days: Sequence[Day], chosen: Candidate) -> Model:
    """What ships: a fixed candidate as it is, a fitted one fitted on every scored day."""
    return chosen.fit(days) if chosen.fit is not None else chosen.model  # type: ignore[return-value]


def _weights(model: Model) -> str:
    return (f"TAU_DAYS = {model.tau_days:g}; KIND_WEIGHTS = {{"
            + ", ".join(f'"{k}": {model.weight(k):g}' for k in model.kinds) + "}")


def load(path: str, fleet_nodes: int | None) -> Fleet:
    fmt, loaded = load_input(path, "auto")
    if fmt == INFINITEHBD:
        return fleet_of_trace(loaded, EPOCH)
    events = loaded
    named = len({e.node for e in events})
    return fleet_of_events(events, fleet_nodes or named)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("file", help="fault_trace.json, or events (history --format jsonl)")
    parser.add_argument("--markdown", action="store_true", help="tables in Markdown")
    parser.add_argument("--selection-only", action="store_true",
                        help="stop after the selection origins (choose without the later ones)")
    parser.add_argument("--fleet-nodes", type=int, metavar="N",
                        help="nodes in the fleet, quiet ones included (events only; default: "
                        "the nodes the events name)")
    args = parser.parse_args(argv)
    fleet = load(args.file, args.fleet_nodes)
    days = build_days(fleet)
    at = origins(days)
    if not at:
        print(f"eval_lemons: {args.file}: {len(days)} scored days; the first origin is day "
              f"{FIRST_ORIGIN}: too few days to evaluate", file=sys.stderr)
        return 2
    select = [o for o in at if o <= SELECTION_LAST]
    report = [o for o in at if o > SELECTION_LAST]
    cands = candidates()
    every = cands + references(days) + [Candidate(SHIPPED, 0, reference=True)]
    print(f"{fleet.servers} servers, {len({s.node for s in fleet.starts})} named; "
          f"{len(fleet.starts)} fault starts, {sum(s.hardware for s in fleet.starts)} of them "
          f"hardware; scored days 1-{days[-1].day}")
    print(f"origins every {STEP} days: selection {select[0]}-{select[-1]} ({len(select)}, "
          f"judged days {select[0]}-{select[-1] + STEP - 1}); report "
          + (f"{report[0]}-{report[-1]} ({len(report)}, judged days {report[0]}-"
             f"{min(report[-1] + STEP - 1, days[-1].day)})" if report else "none"))
    chosen_results = judge(days, every, select)
    chosen = choose(chosen_results, cands)
    print(f"chosen on the selection origins: {chosen.name}")
    print("\n## Selection origins (Hardware target; precision, mean ± standard deviation "
          "across origins)\n")
    print(table(chosen_results, args.markdown))
    if not args.selection_only and report:
        print("\n## Report origins (not used by the choice)\n")
        print(table(judge(days, every, report), args.markdown))
    shipped = fit_shipped(days, chosen)
    print(f"\nwhat ships: {_weights(shipped)}")
    same = shipped == Model(TAU_DAYS, dict(KIND_WEIGHTS))
    print("shipped (exporter/analysis/lemons.py): " + (
        "the same" if same else f"DIFFERENT: {_weights(Model())}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
