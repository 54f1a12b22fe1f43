"""Cost of one analyse_window: 8 GPUs, 30 s at 20 Hz (600 samples each); and of the slow
cycles, the ramps and the step swing inside compute plateaus (find_step_swing).

Prints the median time per call and its ratio to two references measured in the
same run on the same arrays: a bare ``np.fft.rfft`` of the (8, 600) block, and
``np.percentile(..., [5, 95], axis=1)``.  Not a pass/fail test.

    PYTHONPATH=. python bench/bench_power_swing.py
"""

from __future__ import annotations

import numpy as np
from timing import median_seconds

from exporter.analysis.power_swing import analyse_cycles, analyse_window, detect_ramps
from exporter.analysis.step_segments import find_step_swing

T0 = 1_758_000_000.0




def main() -> None:
    rng = np.random.default_rng(0)
    t = T0 + np.arange(600) / 20.0
    high = ((t - T0) * 0.5) % 1.0 < 0.5
    power = np.where(high, 650.0, 200.0) + rng.normal(0, 10, (8, t.size))
    tdp = np.full(8, 700.0)
    jitter = np.sort(t + rng.uniform(-0.01, 0.01, t.size))

    ours = median_seconds(lambda: analyse_window(t, power, tdp))
    ours_irregular = median_seconds(lambda: analyse_window(jitter, power, tdp))
    fft = median_seconds(lambda: np.fft.rfft(power, axis=1))
    pct = median_seconds(lambda: np.percentile(power, [5, 95], axis=1))
    print(f"analyse_window, 8 GPUs x 600 samples (30 s at 20 Hz): {ours * 1e3:.3f} ms")
    print(f"  same, irregular timestamps (resampled):            {ours_irregular * 1e3:.3f} ms")
    print(f"  reference np.fft.rfft of the same (8, 600) block:   {fft * 1e3:.3f} ms "
          f"(analyse_window = {ours / fft:.0f}x)")
    print(f"  reference np.percentile([5, 95]) of the same block: {pct * 1e3:.3f} ms "
          f"(analyse_window = {ours / pct:.0f}x)")

    t10 = T0 + np.arange(12000) / 20.0
    p10 = 650 - 400 * (((t10 - T0) % 60) < 20) + rng.normal(0, 15, (8, t10.size))
    cyc = median_seconds(lambda: analyse_cycles(t10, p10, tdp), repeat=20)
    ramps = median_seconds(lambda: detect_ramps(t10, p10.sum(axis=0), 5600.0), repeat=20)
    print(f"analyse_cycles, 8 GPUs x 12000 samples (10 min at 20 Hz): {cyc * 1e3:.2f} ms")
    print(f"detect_ramps, node sum of 10 min at 20 Hz:                {ramps * 1e3:.2f} ms")

    # the live step swing inside the compute plateaus: the last 120 s on the 20 ms grid,
    # 20 s of compute (a 2 Hz square swing) and 15 s pauses
    ts = T0 + np.arange(6000) * 0.02
    rel = (ts - T0) % 35
    swing = np.where(((ts - T0) * 2.0) % 1.0 < 0.5, 60.0, 0.0)
    ps = np.where(rel < 20, 600 + swing, 90.0) + rng.normal(0, 10, (8, ts.size))
    step = median_seconds(lambda: find_step_swing(ts, ps, tdp, observable_hz=25.0), repeat=20)
    ref = median_seconds(lambda: np.fft.rfft(ps, axis=1), repeat=20)
    print(f"find_step_swing, 8 GPUs x 6000 samples (120 s at 50 Hz): {step * 1e3:.2f} ms "
          f"(= {step / ref:.0f}x np.fft.rfft of the same block, {ref * 1e3:.2f} ms; "
          f"= {step / ours:.1f}x analyse_window above); every 5 s that is "
          f"{step / 5 * 100:.2f} % of a core")


if __name__ == "__main__":
    main()
