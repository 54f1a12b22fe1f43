"""How much of a trace's power can be seen: is it averaged, and up to which frequency.

The evidence is weighed in this order (docs/power.md, "The observable band"):

1. ``--power-averaging SECONDS|none`` (the user knows best);
2. the column: ``power.draw.instant`` is instantaneous, ``power.draw.average`` a
   1 s average (nvidia-smi says so);
3. a GPU ``name`` column, for plain ``power.draw``: Hopper, Ada, Blackwell and
   Ampere boards other than GA100 average it over ~1 s; A100 (GA100), Volta,
   Turing and older report it instantaneously (exporter.offline.gpu_models);
4. a cte trace's header (``power_averaging_seconds``; traces written before it
   existed hold the exporter's instantaneous readings);
5. the data (exporter.analysis.averaging): edges or swings a 1 s average cannot
   produce prove there is none, and that proof overrides 3 and 4 (a lookup
   table or a header can be wrong; physics cannot); slow edges and smooth noise
   only agree with an average.

With nothing to go on the kind is "unknown" and the band is the conservative one
(as if averaged).  The band's top is half the effective sample rate (polls, or
the sensor's own updates when readings repeat), and at most 0.5 / T Hz through
a T-second average.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from exporter.analysis.averaging import (
    AVERAGED,
    INSTANT,
    AveragingEvidence,
    averaging_evidence,
    finite_readings,
    sensor_update_seconds,
)
from exporter.offline.gpu_models import gpu_model
from exporter.traces.trace import Trace

UNKNOWN = "unknown"


@dataclass(frozen=True)
class _Prior:
    kind: str
    seconds: float | None
    source: str  # "column", "gpu-name", "metadata"
    confidence: str
    why: str


@dataclass
class BandDecision:
    kind: str  # INSTANT, AVERAGED or UNKNOWN
    seconds: float | None  # the averaging window when averaged (assumed 1 s when unknown)
    decided_by: str  # "flag", "column", "gpu-name", "metadata", "data" or "none"
    confidence: str  # "certain", "high", "medium" or "low"
    evidence: list[str]
    data: AveragingEvidence
    sample_interval_seconds: float
    sensor_update_seconds: float | None
    observable_hz: float
    aliasing_possible: bool  # faster swings than the samples can show may fold into the band
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "seconds": self.seconds,
            "decided_by": self.decided_by,
            "confidence": self.confidence,
            "evidence": list(self.evidence),
            "data": {"verdict": self.data.verdict, "proof": self.data.proof,
                     "reason": self.data.reason, **self.data.stats},
            "sensor_update_seconds": self.sensor_update_seconds,
            "aliasing_possible": self.aliasing_possible,
        }


def decide_band(trace: Trace, flag: float | None, *, swing_band_top_hz: float = 3.0,
                max_hz: float | None = None) -> BandDecision:
    """``flag``: None (auto), 0 (instantaneous) or the averaging window in seconds."""
    series = [(s.t, s.fields["power_watts"]) for s in trace.series.values()]
    series = [finite_readings(t, x) for t, x in series]
    series = [(t, x) for t, x in series if t.size >= 2]
    dt = float(np.median([np.median(np.diff(t)) for t, _ in series]))
    updates = [u for t, x in series if (u := sensor_update_seconds(t, x)) is not None]
    update = float(np.median(updates)) if len(updates) * 2 > len(series) else None
    prior = _prior(trace)
    seconds = flag if flag else (prior.seconds if prior and prior.seconds else 1.0)
    data = averaging_evidence(series, seconds)
    kind, source, confidence, evidence = _weigh(flag, prior, data, seconds)
    avg_s = seconds if kind in (AVERAGED, UNKNOWN) else None
    nyq = 0.5 / max(dt, update or 0.0)
    top = min(nyq, 0.5 / avg_s) if avg_s else nyq
    notes = []
    if max_hz is not None and max_hz < top:
        top = max_hz
        notes.append(f"--max-hz caps the observable band at {max_hz:g} Hz")
    if update is not None:
        evidence.append(f"readings change every {update:.3g} s (the sensor's own updates), "
                        f"though polled every {dt:.3g} s")
    # what the sensor passes and the samples could fold down: up to ~1/T Hz through
    # an average (beyond, under 22 %), up to the swing band's top otherwise
    passes = 1.0 / avg_s if kind == AVERAGED and avg_s else swing_band_top_hz
    return BandDecision(kind, avg_s if kind == AVERAGED else None, source, confidence,
                        evidence, data, dt, update, top, nyq < passes, notes)


def _prior(trace: Trace) -> _Prior | None:
    """What the file says (column, GPU name, cte header) before looking at the data."""
    col = trace.power_column
    if col == "power.draw.instant":
        return _Prior(INSTANT, None, "column", "high",
                      "column power.draw.instant: nvidia-smi's instantaneous reading")
    if col == "power.draw.average":
        return _Prior(AVERAGED, trace.power_averaging_seconds or 1.0, "column", "high",
                      "column power.draw.average: nvidia-smi's 1 s average")
    if trace.format == "cte":
        if trace.power_averaging_stated:
            avg = trace.power_averaging_seconds
            return _Prior(AVERAGED if avg else INSTANT, avg, "metadata", "high",
                          f"the cte header's power_averaging_seconds is {avg!r}" if avg else
                          "the cte header says power_averaging_seconds null: instantaneous")
        return _Prior(INSTANT, None, "metadata", "medium",
                      "a cte trace without power_averaging_seconds (written before the header "
                      "had it): the exporter records instantaneous power")
    return _prior_from_names(trace)


def _prior_from_names(trace: Trace) -> _Prior | None:
    names = Counter(trace.gpu_names.values())
    if not names:
        return None
    models = {n: gpu_model(n) for n in names}
    known = {n: m for n, m in models.items() if m is not None}
    if not known:
        return _Prior(UNKNOWN, None, "gpu-name", "low",
                      f"GPU name {next(iter(names))!r} is not one the analysis knows")
    kinds = {m.averages_power_draw for m in known.values()}
    name, model = max(known.items(), key=lambda kv: names[kv[0]])
    if len(kinds) > 1:
        return _Prior(UNKNOWN, None, "gpu-name", "low",
                      "the log mixes GPU generations that report power.draw differently: "
                      + ", ".join(sorted(known)))
    what = "averages power.draw over ~1 s" if model.averages_power_draw \
        else "reports power.draw instantaneously"
    return _Prior(AVERAGED if model.averages_power_draw else INSTANT,
                  1.0 if model.averages_power_draw else None, "gpu-name", "high",
                  f"GPU name {name!r}: {model.generation} {what}")


def _weigh(flag: float | None, prior: _Prior | None, data: AveragingEvidence, seconds: float
           ) -> tuple[str, str, str, list[str]]:
    """(kind, decided_by, confidence, evidence lines)."""
    said = f"data: {data.reason}"
    if flag is not None:
        kind = AVERAGED if flag else INSTANT
        ev = [f"--power-averaging {flag:g}" if flag else "--power-averaging none"]
        if data.verdict and data.verdict != kind:
            ev.append(f"the data disagree ({data.reason})")
        return kind, "flag", "certain", ev
    if prior is not None and prior.kind != UNKNOWN:
        ev = [prior.why]
        if data.verdict is None or data.verdict == prior.kind:
            ev.append(said if data.verdict else f"data cannot tell: {data.reason}")
            up = prior.confidence == "medium" and data.verdict == prior.kind
            return prior.kind, prior.source, "high" if up else prior.confidence, ev
        if data.proof and prior.source != "column":
            ev.append(f"overruled by the data: {data.reason}")
            return data.verdict, "data", "high", ev
        ev.append(f"the data disagree, but cannot prove it: {data.reason}")
        return prior.kind, prior.source, "medium", ev
    ev = [prior.why] if prior is not None else [
        "column power.draw: a ~1 s average on Hopper, Ada, Blackwell and most Ampere "
        "boards, instantaneous on A100 and older; no GPU name column to tell which"]
    if data.verdict is not None:
        ev.append(said)
        return data.verdict, "data", "high" if data.proof else "medium", ev
    ev.append(f"data cannot tell: {data.reason}; the band assumes a {seconds:g} s average")
    return UNKNOWN, "none", "low", ev
