"""analyze's text report, rendered from the JSON-ready dict (see docs/power.md)."""

from __future__ import annotations

from typing import Any

from exporter.offline.goodput import accounting_text


def not_run_note(name: str, why: str) -> str:
    """The notes' sentence for a detector that did not run."""
    return f"{name}: not run, {why}"


def _count(items: list[Any], rep: dict[str, Any], *detectors: str) -> str:
    """How many were found, "none found", or "not run: why" when no detector ran.

    A detector that did not run found nothing because it never looked: saying
    "none found" there would read as an all-clear.
    """
    skipped = {d: rep.get("not_run", {}).get(d) for d in detectors}
    why = {d: w for d, w in skipped.items() if w}
    found = str(len(items)) if items else "none found"
    if not items and len(why) == len(detectors):
        if len(set(why.values())) == 1:
            return f"not run: {next(iter(why.values()))}"
        return "not run: " + "; ".join(f"{d}: {w}" for d, w in why.items())
    if why:
        return f"{found}; " + "; ".join(f"{d} not run: {w}" for d, w in why.items())
    return found


def _fmt_ratio(r: float | None) -> str:
    return "n/a" if r is None else f"{100 * r:.0f} % of TDP"


def _header(rep: dict[str, Any]) -> list[str]:
    pa = rep["power_averaging"]
    kind = pa["kind"] + (f" ({pa['seconds']:g} s)" if pa.get("seconds") else "")
    names = sorted(set(rep.get("gpu_names", {}).values()))
    lines = [
        f"trace      {rep['source']} ({rep['format']}, power from {rep['power_column']})",
        f"GPUs       {', '.join(str(g) for g in rep['gpus'])}"
        + (f" ({', '.join(names)})" if names else ""),
        f"duration   {rep['duration_seconds']:.1f} s, one sample every "
        f"{rep['sample_interval_seconds']:.3f} s, node mean {rep['node_mean_watts']:.0f} W",
        f"power      {kind}, decided by {pa['decided_by']} ({pa['confidence']} confidence)",
    ]
    lines += [f"             - {e}" for e in pa["evidence"]]
    lines += [f"observable 0-{rep['observable_band_hz'][1]:.3g} Hz", ""]
    return lines


def _segment_line(s: dict[str, Any]) -> str:
    relevant = "grid-relevant" if s["grid_relevant"] else "below the grid threshold"
    return (f"  [step] {s['start']:.0f}-{s['end']:.0f} s: step period {s['period_seconds']:.3f} s"
            f" ({s['frequency_hz']:.3g} Hz) in the compute plateaus, node amplitude "
            f"{s['node_amplitude_watts']:.0f} W ({_fmt_ratio(s['amplitude_ratio'])}), synchrony "
            f"{s['synchrony']:.2f}, significance {s['significance']:.0f} (confidence "
            f"{s['confidence']:.4f}), covering {100 * s['duty']:.0f} % of compute; {relevant}")


def _swing_line(s: dict[str, Any]) -> str:
    if s.get("method") == "segments":
        return _segment_line(s)
    if not s.get("resolved", True):
        app = s.get("apparent_frequency_hz")
        seen = f", apparent {app:.3g} Hz" if app else ""
        return (f"  [step] {s['start']:.0f}-{s['end']:.0f} s: swing above "
                f"{s['above_hz']:.3g} Hz, unresolved ({s['reason']}{seen}); node amplitude at "
                f"least {s['node_amplitude_watts']:.0f} W, synchrony {s['synchrony']:.2f}")
    extra = f", strength {s['strength']:.2f}" if "strength" in s else ""
    rng = s.get("source_amplitude_range_watts")
    src = s.get("source_amplitude_watts")
    if rng:
        best = f"~{src:.0f} W as a {s['source_shape']} wave, " if src else ""
        extra += f"; at the GPUs {best}{rng[0]:.0f}-{rng[1]:.0f} W (seen through the average)"
    elif src:
        extra += f"; fitted at its period ~{src:.0f} W ({s['source_shape']} wave)"
    if s.get("aliasing_possible"):
        extra += "; could be the alias of a faster swing"
    return (f"  [{s['scale']}] {s['start']:.0f}-{s['end']:.0f} s: "
            f"period {s['period_seconds']:.2f} s"
            f" ({s['frequency_hz']:.3g} Hz), node amplitude {s['node_amplitude_watts']:.0f} W"
            f" ({_fmt_ratio(s['amplitude_ratio'])}), synchrony {s['synchrony']:.2f}, duty "
            f"{s['duty_cycle']:.2f}, max ramp {s['max_ramp_watts_per_second']:.0f} W/s{extra}")


def _events(rep: dict[str, Any]) -> list[str]:
    lines = [f"ramps: {_count(rep['ramps'], rep, 'ramps')}"]
    for r in rep["ramps"]:
        dip = f" (dip {r['dip'] + 1})" if r.get("dip") is not None else ""
        lines.append(f"  {r['time']:.1f} s: {r['direction']} {r['delta_watts']:+.0f} W "
                     f"in {r['duration_seconds']:.2f} s{dip}")
    lines.append(f"dips (pauses): {_count(rep['dips'], rep, 'dips')}")
    for i, d in enumerate(rep["dips"]):
        stall = ""
        if d["stalls"]:
            s = rep["stalls"][d["stalls"][0]]
            stall = (f"; stall {s['start']:.1f}-{s['end']:.1f} s, culprit GPU(s) "
                     f"{', '.join(map(str, s['culprit_gpus']))}")
        lines.append(
            f"  {i + 1}. {d['start']:.1f}-{d['end']:.1f} s ({d['duration_seconds']:.1f} s): "
            f"{d['level_before_watts']:.0f} W -> {d['level_watts']:.0f} W "
            f"(-{100 * d['depth_ratio']:.0f} %), fall in {d['fall']['duration_seconds']:.2f} s, "
            f"rise in {d['rise']['duration_seconds']:.2f} s{stall}")
    return lines


def _stragglers(rep: dict[str, Any]) -> list[str]:
    outl = rep["outliers"]
    lines = [f"outliers (held >= {rep['persistence_seconds']:g} s): "
             f"{_count(outl, rep, 'outliers')}"]
    for o in outl:
        lines.append(f"  GPU {o['gpu']} {o['signal']} {o['direction']} (M {o['score']:+.1f}): "
                     f"{o['start']:.0f}-{o['end']:.0f} s")
    top = sorted(((v, int(g), sig) for g, sc in rep["peer_scores"].items()
                  for sig, v in sc.items()), reverse=True)[:3]
    if top and "outliers" not in rep.get("not_run", {}):
        lines.append("  highest typical |M| (median over windows; flagged above 3.5): "
                     + ", ".join(f"GPU {g} {sig} {v:.1f}" for v, g, sig in top))
    stalls = rep["stalls"]
    lines.append(f"stalls: {_count(stalls, rep, 'stalls')}")
    for s in stalls:
        if s.get("cause") == "checkpoint":
            lines.append(f"  {s['start']:.1f}-{s['end']:.1f} s: checkpoint: GPU(s) "
                         f"{', '.join(map(str, s['culprit_gpus']))} write; waiting "
                         f"{', '.join(map(str, s['waiting_gpus']))} (not a fault)")
            continue
        lines.append(f"  {s['start']:.1f}-{s['end']:.1f} s: culprit GPU(s) "
                     f"{', '.join(map(str, s['culprit_gpus']))}; waiting "
                     f"{', '.join(map(str, s['waiting_gpus']))}")
    return lines


def render_text(rep: dict[str, Any]) -> str:
    lines = _header(rep)
    swings = rep["power_swings"]
    lines.append(f"power swings: {_count(swings, rep, 'step', 'cycle')}")
    lines += [_swing_line(s) for s in swings]
    lines += _events(rep)
    lines += _stragglers(rep)
    if "time_accounting" in rep:
        lines += accounting_text(rep["time_accounting"])
    # the not-run sentences were said where each detector's result goes
    said = {not_run_note(k, v) for k, v in rep.get("not_run", {}).items()}
    notes = [n for n in rep["notes"] if n not in said]
    if notes:
        lines.append("notes:")
        lines.extend(f"  - {n}" for n in notes)
    return "\n".join(lines)
