"""Cost of one straggler update for 8 GPUs, and of one stall check.

A live update is ``window_features`` over the last 60 s (power at 20 Hz; SM
clock, temperature, utilization and the clock-event bitmask at 1 Hz, each on
its own time base) followed by ``StragglerDetector.update``.  Prints the median
time per call and its ratio to references measured in the same run on the same
arrays: ``np.median(power, axis=1)`` (one robust statistic of the window) and
``np.mean`` of every input.  Not a pass/fail test; the budget is 2 ms.

    PYTHONPATH=. python bench/bench_straggler.py
"""

from __future__ import annotations

import numpy as np
from timing import median_seconds

from exporter.analysis.stalls import compute_level, detect_stall
from exporter.analysis.straggler import StragglerDetector, window_features
from exporter.sampling.settings import StragglerSettings

T0 = 1_758_000_000.0
N = 8




def main() -> None:
    rng = np.random.default_rng(0)
    t = T0 + np.arange(1200) / 20.0  # 60 s of power at 20 Hz
    high = ((t - T0) % 2.0) < 1.4
    power = np.where(high, 650.0, 200.0) + rng.normal(0, 10, (N, t.size))
    ts = T0 + np.arange(60.0)  # the slow fields at 1 Hz
    clock = 1.98e9 + rng.normal(0, 15e6, (N, ts.size))
    temp = 62 + rng.normal(0, 0.5, (N, ts.size))
    util = np.ones((N, ts.size))
    reasons = np.zeros((N, ts.size))
    reasons[3, ::3] = 0x4
    det = StragglerDetector(StragglerSettings().thresholds())
    clock_in, temp_in, util_in, reasons_in = (
        (ts, clock), (ts, temp), (ts, util), (ts, reasons))
    now = [float(t[-1])]

    def features() -> object:
        return window_features(t, power, sm_clock=clock_in, temperature=temp_in,
                               utilization=util_in, clock_event_reasons=reasons_in)

    f = features()

    def update() -> object:
        now[0] += 10.0
        return det.update(f, t=now[0])

    def full() -> object:
        now[0] += 10.0
        return det.update(features(), t=now[0])

    def stall() -> object:
        return detect_stall(util[:, -1], power[:, -40:].mean(axis=1), compute_level(power))

    t_feat = median_seconds(features)
    t_upd = median_seconds(update)
    t_full = median_seconds(full)
    t_stall = median_seconds(stall)
    ref_med = median_seconds(lambda: np.median(power, axis=1))
    ref_mean = median_seconds(lambda: [np.mean(x, axis=1)
                                       for x in (power, clock, temp, util, reasons)])
    print("8 GPUs, 60 s window: power 8 x 1200 (20 Hz), clock/temperature/utilization/"
          "reasons 8 x 60 (1 Hz)")
    print(f"window_features:                      {t_feat * 1e3:.3f} ms")
    print(f"StragglerDetector.update:             {t_upd * 1e3:.3f} ms")
    print(f"straggler update (features + update): {t_full * 1e3:.3f} ms  (budget 2 ms)")
    print(f"  reference np.median(power, axis=1): {ref_med * 1e3:.3f} ms "
          f"(update = {t_full / ref_med:.0f}x)")
    print(f"  reference np.mean of every input:   {ref_mean * 1e3:.3f} ms "
          f"(update = {t_full / ref_mean:.0f}x)")
    print(f"stall check (compute_level over 60 s + detect_stall): {t_stall * 1e3:.3f} ms")


if __name__ == "__main__":
    main()
