"""record writes a trace of the live sampler; run --replay serves a trace as if live."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from exporter.metrics.render import render
from exporter.sim.replay import MAX_REPLAY_SAMPLE_RATE, max_speed, replay_library
from exporter.traces.load import load_trace
from exporter.traces.trace import TraceError, TraceWriter
from tests.tools import REAL_TRACE, wait_for

REAL = REAL_TRACE
CLI = [sys.executable, "-m", "exporter"]


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    out = tmp_path_factory.mktemp("rec") / "node.cte"
    result = subprocess.run([*CLI, "record", "--fake", "--duration", "4", "--out", str(out),
                             "--energy.interval", "1", "--progress", "1",
                             "--collector.profiling.interval", "1"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "recorded 4 s of 8 GPUs" in result.stdout
    (out.parent / "stdout").write_text(result.stdout)
    # progress while it runs (which second a line names depends on scheduling)
    assert re.search(r"^record: [1-3]/4 s, \d+ power samples from 8 GPUs$", result.stdout,
                     re.MULTILINE)
    return out


def test_record_keeps_power_at_the_sensor_rate_and_the_sweep_at_1_hz(recorded):
    trace = load_trace(recorded)
    assert trace.format == "cte" and trace.gpus == list(range(8))
    assert trace.tdp_watts == {g: 700.0 for g in range(8)}
    s = trace.series[3]
    power = s.fields["power_watts"]
    assert np.isfinite(power).sum() >= 4 * 45  # the driver's ~50 samples a second
    stamps = s.t[np.isfinite(power)]
    assert np.median(np.diff(stamps)) == pytest.approx(0.02, rel=0.2)
    temps = s.fields["temperature_celsius"]
    assert 3 <= np.isfinite(temps).sum() <= 6  # once a second
    energy = s.fields["energy_joules"][np.isfinite(s.fields["energy_joules"])]
    assert len(energy) >= 3 and (np.diff(energy) >= 0).all()
    assert np.nanmax(power) > 600 and np.nanmin(power) < 260  # the training swing
    # the header says the power is instantaneous and which GPUs these are
    assert trace.power_averaging_stated and trace.power_averaging_seconds is None
    assert len(trace.gpu_names) == 8 and all(trace.gpu_names.values())


def test_record_writes_the_profiling_ratios_once_an_interval(recorded):
    s = load_trace(recorded).series[3]
    tensor = s.fields["tensor_active_ratio"]
    assert 2 <= np.isfinite(tensor).sum() <= 4  # every 1 s, from the second sample on
    assert ((tensor[np.isfinite(tensor)] > 0.2) & (tensor[np.isfinite(tensor)] < 0.98)).all()
    assert np.isfinite(s.fields["sm_occupancy_ratio"]).sum() == np.isfinite(tensor).sum()


def test_record_states_the_rate_over_the_span_its_trace_covers(recorded):
    """The driver hands over the seconds buffered before the start too: the rate is the
    samples over the span their stamps cover, not over the seconds the command ran."""
    summary = (recorded.parent / "stdout").read_text().splitlines()[-1]
    m = re.search(r": (\d+) power samples over ([\d.]+) s \((\d+)/s per GPU\)", summary)
    assert m, summary
    trace = load_trace(recorded)
    stamps = [s.t[np.isfinite(s.fields["power_watts"])] for s in trace.series.values()]
    assert int(m.group(1)) == sum(x.size for x in stamps)
    first, last = min(x[0] for x in stamps), max(x[-1] for x in stamps)
    assert float(m.group(2)) == pytest.approx(last - first, abs=0.06)
    assert last - first > 4.5  # the buffered seconds are in the trace (so wall time is wrong)
    in_trace = np.mean([(x.size - 1) / (x[-1] - x[0]) for x in stamps])
    assert int(m.group(3)) == pytest.approx(in_trace, rel=0.05)
    assert int(m.group(3)) == pytest.approx(50, rel=0.1)  # the driver's rate


def test_record_refuses_to_overwrite_a_trace_without_force(recorded, tmp_path):
    out = tmp_path / "kept.cte"
    out.write_bytes(recorded.read_bytes())
    before = out.read_bytes()
    result = subprocess.run([*CLI, "record", "--fake", "--duration", "1", "--out", str(out),
                             "--progress", "0"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2  # as every other usage error
    assert result.stderr == (f"cluster-telemetry-exporter: record: --out {out}: the file "
                             "exists; pass --force to overwrite it\n")
    assert result.stdout == "" and out.read_bytes() == before
    result = subprocess.run([*CLI, "record", "--fake", "--duration", "1", "--out", str(out),
                             "--progress", "0", "--force"], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    assert out.read_bytes() != before and load_trace(out).gpus == list(range(8))
    help_text = subprocess.run([*CLI, "record", "--help"], capture_output=True, text=True,
                               timeout=60).stdout
    assert "--force" in help_text and "overwrite" in help_text


def test_a_trace_writer_never_replaces_a_file_when_exclusive(tmp_path):
    """What record relies on where a file appears between its check and its open."""
    out = tmp_path / "raced.cte"
    out.write_text("precious\n")
    with pytest.raises(FileExistsError):
        TraceWriter(out, [0], None, ["power_watts"], exclusive=True)
    assert out.read_text() == "precious\n"


def test_record_stops_cleanly_on_sigterm(tmp_path):
    import signal

    out = tmp_path / "cut.cte"
    proc = subprocess.Popen([*CLI, "record", "--fake", "--duration", "600", "--out", str(out),
                             "--progress", "0.5"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: out.exists() and out.stat().st_size > 10_000, timeout=30)
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0 and "Traceback" not in stderr
    assert "(stopped early)" in stdout
    assert load_trace(out).gpus == list(range(8))  # complete: readable to the last line


def test_record_errors(tmp_path):
    result = subprocess.run([*CLI, "record", "--duration", "1", "--out", str(tmp_path / "x")],
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 1 and "add --fake" in result.stderr
    result = subprocess.run([*CLI, "record", "--fake", "--duration", "-1", "--out", "x"],
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 2 and "--duration" in result.stderr
    result = subprocess.run([*CLI, "record", "--fake", "--duration", "1", "--out",
                             str(tmp_path / "no" / "dir" / "x")],
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 2 and "cannot write" in result.stderr
    assert "Traceback" not in result.stderr


def _limit_file_size(limit: int):
    """A preexec_fn: files the child writes may not grow past `limit` bytes (ulimit -f)."""
    import resource

    return lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))


def test_record_stops_in_one_line_when_the_trace_cannot_grow(tmp_path):
    out = tmp_path / "full.cte"
    limit = 150_000  # a few seconds of 8 GPUs at the sensor's rate
    result = subprocess.run([*CLI, "record", "--fake", "--duration", "120", "--out", str(out),
                             "--progress", "0"], capture_output=True, text=True, timeout=120,
                            preexec_fn=_limit_file_size(limit))
    assert result.returncode == 3, result.stderr  # the documented code for a failed write
    assert "Traceback" not in result.stderr
    assert result.stderr.count("\n") == 1, result.stderr  # one line, from start to stop
    assert f"cannot write {out}: File too large" in result.stderr
    assert "recorded" not in result.stdout  # no summary that reads like success
    data = out.read_bytes()
    assert 0 < len(data) <= limit and data.endswith(b"\n")  # cut back to the last whole row
    trace = load_trace(out)
    assert trace.skipped_lines == 0 and trace.gpus == list(range(8))
    assert sum(np.isfinite(trace.series[g].fields["power_watts"]).sum() for g in trace.gpus) \
        > 500


def test_record_to_a_full_device_stops_at_once(tmp_path):
    result = subprocess.run([*CLI, "record", "--fake", "--duration", "120", "--out",
                             "/dev/full", "--progress", "0"], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 3 and "Traceback" not in result.stderr
    assert result.stderr.count("\n") == 1 and "No space left on device" in result.stderr


@pytest.mark.skipif(not REAL.exists(), reason="shared/data is not beside the checkout")
def test_replay_library_follows_the_real_trace_and_loops():
    trace = load_trace(REAL)
    clock = [1_790_000_000.0]
    lib = replay_library(trace, speed=1.0, clock=lambda: clock[0])
    gpu = lib.gpus[1]
    first = trace.series[1]
    power = first.fields["power_watts"][np.isfinite(first.fields["power_watts"])]
    assert gpu.ideal_power(clock[0]) == pytest.approx(power[0])
    assert gpu.recorded("temperature_celsius", clock[0]) == 63  # the hot GPU of the trace
    # the trace's own rows are the driver's power samples, at the trace's timestamps
    ks = gpu.samples_between(clock[0] - 1, clock[0] + 10)
    stamps = [gpu.sample_time(k) - clock[0] for k in ks]
    assert stamps == pytest.approx(list(first.t[:len(stamps)] - first.t[0]))
    assert [gpu.sample_watts(k) for k in ks] == pytest.approx(list(power[:len(ks)]))
    duration = gpu.loop_seconds
    later = list(gpu.samples_between(clock[0] + duration - 0.5, clock[0] + duration + 1))
    assert later and later[-1] >= len(power)  # past the end the trace loops: samples go on
    assert [gpu.sample_watts(k) for k in later if k >= len(power)][0] == pytest.approx(
        power[0])
    fast = replay_library(trace, speed=10.0, clock=lambda: clock[0]).gpus[1]
    # ten times faster: ten times the samples in the same time
    assert len(fast.samples_between(clock[0], clock[0] + 10)) == pytest.approx(
        len(gpu.samples_between(clock[0], clock[0] + 100)), abs=2)
    # the log has power and temperature only: nothing else is served
    assert not gpu.provides("sm_clock_hertz") and not gpu.provides("energy_joules")


def test_run_replay_serves_the_trace_through_the_real_pipeline(recorded, running_exporter):
    exp = running_exporter.start(manual=True, fake=False, replay=str(recorded),
                                 profiling_interval_seconds=1)
    exp.sampler.advance(3)
    snap = exp.sampler.snapshot
    assert snap.backend == "replay" and snap.gpu_count == 8
    assert len(snap.readings) == 8
    watts = [s.watts for s in snap.power.values()]
    assert all(150 < w < 720 for w in watts)
    assert all(p.kind == "buffer" and p.samples_total >= 3 * 45
               for p in snap.power_sampling.values())  # the recorded samples, all of them
    body = render(snap).decode()
    assert 'cte_backend_info{backend="replay"' in body
    assert "gpu_temperature_celsius{" in body and "gpu_energy_joules_total{" in body
    assert "gpu_tensor_active_ratio{" in body  # GPM, from the trace's profiling columns
    # what the recording has no column for is absent, not simulated
    for absent in ("gpu_pcie_link_width{", "gpu_nvlink_link_up{", "gpu_ecc_errors_total{",
                   "gpu_performance_state{"):
        assert absent not in body


def test_replay_of_a_log_without_clocks_serves_no_clock(tmp_path, running_exporter):
    log = tmp_path / "smi.csv"
    rows = ["timestamp, index, temperature.gpu, utilization.gpu [%], power.draw [W]"]
    for i in range(40):
        for gpu in range(2):
            rows.append(f"2025/01/01 00:00:{i // 4:02d}.{(i % 4) * 250:03d}, {gpu}, 60, "
                        f"100 %, {300 + 100 * (i % 2)} W")
    log.write_text("\n".join(rows) + "\n")
    exp = running_exporter.start(manual=True, fake=False, replay=str(log))
    exp.sampler.advance(3)
    body = render(exp.sampler.snapshot).decode()
    assert "gpu_temperature_celsius{" in body and "gpu_utilization_ratio{" in body
    for absent in ("gpu_sm_clock_hertz{", "gpu_memory_clock_hertz{", "gpu_memory_used_bytes{",
                   "gpu_power_limit_watts{", "gpu_nvlink_link_up{", "gpu_energy_joules_total{",
                   "gpu_pcie_link_width{", "gpu_tensor_active_ratio{"):
        assert absent not in body, absent
    assert 'driver_version=""' in body  # no invented driver


def test_replay_errors(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("timestamp, index\n2025/01/01 00:00:00.000, 0\n")
    result = subprocess.run([*CLI, "run", "--replay", str(bad), "--web.listen-address",
                             "127.0.0.1:0"], capture_output=True, text=True, timeout=30)
    assert result.returncode == 2 and "bad.csv:1:" in result.stderr
    assert "Traceback" not in result.stderr
    result = subprocess.run([*CLI, "run", "--replay", str(bad), "--fake"],
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 2 and "choose one" in result.stderr


def _smi_log(path: Path, rows: list[tuple[int, int, str]]) -> Path:
    """An nvidia-smi CSV log of (second, gpu, power cell) rows."""
    lines = ["timestamp, index, temperature.gpu, power.draw [W]"]
    lines += [f"2025/01/01 00:00:{t:02d}.000, {gpu}, 60, {power}" for t, gpu, power in rows]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize("power", ["[N/A]", "1e308 W", "one timestamp"])
def test_replay_refuses_a_trace_that_analyze_refuses(tmp_path, power):
    if power == "one timestamp":
        rows = [(0, gpu, "300 W") for gpu in range(2)]
    else:
        rows = [(t, gpu, power) for t in range(20) for gpu in range(2)]
    log = _smi_log(tmp_path / "bad.csv", rows)
    analyzed = subprocess.run([*CLI, "analyze", str(log)], capture_output=True, text=True,
                              timeout=60)
    replayed = subprocess.run([*CLI, "run", "--replay", str(log), "--web.listen-address",
                               "127.0.0.1:0"], capture_output=True, text=True, timeout=60)
    assert analyzed.returncode == replayed.returncode == 2
    why = "no GPU has at least two power readings"
    assert why in analyzed.stderr
    # one line, the same reason, before anything serves
    assert replayed.stderr.count("\n") == 1 and why in replayed.stderr, replayed.stderr
    assert "serving on" not in replayed.stderr


def test_replay_serves_no_power_a_trace_does_not_hold(tmp_path, running_exporter):
    # GPU 0: good readings and one absurd one; GPU 1: temperature only
    rows = [(t, 0, "1e308 W" if t == 5 else f"{300 + 100 * (t % 2)} W") for t in range(20)]
    rows += [(t, 1, "[N/A]") for t in range(20)]
    log = _smi_log(tmp_path / "part.csv", rows)
    exp = running_exporter.start(manual=True, fake=False, replay=str(log))
    for _ in range(25):
        exp.sampler.advance(1)
    snap = exp.sampler.snapshot
    assert snap.gpu_count == 2
    assert set(snap.power) == {0}  # GPU 1 has no power: none is served for it
    assert 300 <= snap.power[0].watts <= 400  # never the absurd reading
    body = render(snap).decode()
    served = [float(line.rsplit(" ", 1)[1]) for line in body.splitlines()
              if line.startswith("gpu_power_watts{")]
    assert served and all(300 <= w <= 400 for w in served)
    assert 'gpu_power_watts{gpu="1"' not in body
    assert 'gpu_temperature_celsius{gpu="1"' in body  # what it has is served
    gpu1 = exp.fake_lib.gpus[1]
    assert gpu1.loop_seconds == pytest.approx(20.0)  # its own rows' span, not one second


# Written by `record --fake --duration 4` of the exporter before the driver's power-sample
# buffer was used (commit f6ed333): power and energy polled together at 20 Hz in one row,
# the sweep's values in rows of their own.
OLD_TRACE = Path(__file__).parent / "data" / "cte-v1-before-sample-buffer.cte"


def test_a_trace_recorded_before_the_sample_buffer_still_analyses():
    trace = load_trace(OLD_TRACE)
    assert trace.format == "cte" and trace.gpus == list(range(8))
    power = trace.series[0].fields["power_watts"]
    assert np.isfinite(power).sum() >= 4 * 18  # the old 20 Hz polls
    result = subprocess.run([*CLI, "analyze", str(OLD_TRACE), "--format", "json"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["gpus"] == list(range(8))
    assert report["observable_band_hz"][1] == pytest.approx(10.0, rel=0.05)  # 20 Hz polls


def test_a_trace_recorded_before_the_sample_buffer_still_replays(running_exporter):
    exp = running_exporter.start(manual=True, fake=False, replay=str(OLD_TRACE))
    exp.sampler.advance(3)
    snap = exp.sampler.snapshot
    assert snap.backend == "replay" and snap.gpu_count == 8
    assert all(150 < p.watts < 720 for p in snap.power.values())
    assert all(p.samples_total >= 2 * 18 for p in snap.power_sampling.values())
    body = render(snap).decode()
    assert "gpu_energy_joules_total{" in body and "gpu_sm_clock_hertz{" in body


def test_replay_at_the_highest_accepted_speed_loses_no_samples(recorded, running_exporter):
    trace = load_trace(recorded)
    top = max_speed(trace)
    assert top >= 10  # the README's `--speed 10` on a recording at the driver's rate
    exp = running_exporter.start(manual=True, fake=False, replay=str(recorded),
                                 replay_speed=top)
    start = exp.sampler.clock.time()
    exp.sampler.advance(12)  # past the 4 s trace's end: it loops, at ~12x
    end = exp.sampler.clock.time()
    for gpu, stats in exp.sampler.snapshot.power_sampling.items():
        delivered = len(exp.fake_lib.gpus[gpu].samples_between(start - 1, end))
        assert stats.lost_total == 0, gpu
        assert stats.samples_total >= delivered - 2 * MAX_REPLAY_SAMPLE_RATE, gpu  # one drain
        assert stats.samples_total >= 10 * MAX_REPLAY_SAMPLE_RATE * 0.8, gpu


def test_replay_refuses_a_speed_it_cannot_keep_up_with(recorded):
    trace = load_trace(recorded)
    top = max_speed(trace)
    replay_library(trace, speed=top)  # the highest accepted speed is accepted
    with pytest.raises(TraceError, match=r"--speed \d+(\.\d+)? or less"):
        replay_library(trace, speed=top * 1.05)
    result = subprocess.run([*CLI, "run", "--replay", str(recorded), "--speed", "1000",
                             "--web.listen-address", "127.0.0.1:0"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "--speed 1000 would deliver" in lines[0], result.stderr
    assert lines[0].startswith("cluster-telemetry-exporter: run: ")
    # a 1 Hz nvidia-smi log can be replayed far faster than a recording at the driver's rate
    assert 1 / 0.02 * top == pytest.approx(MAX_REPLAY_SAMPLE_RATE, rel=0.2)
    from exporter.config import all_options

    speed = next(o for o in all_options() if o.key == "replay_speed")
    assert f"more than {MAX_REPLAY_SAMPLE_RATE} power samples" in speed.help  # the docs' figure


def test_replayed_gpus_carry_the_names_their_trace_recorded(recorded, running_exporter):
    names = load_trace(recorded).gpu_names
    exp = running_exporter.start(manual=True, fake=False, replay=str(recorded))
    exp.sampler.advance(2)
    idents = exp.sampler.snapshot.identities
    assert {g: idents[g].name for g in names} == names
    assert "replayed GPU" not in render(exp.sampler.snapshot).decode()


RECORDED_GZ = Path(__file__).parent / "data" / "record-fake-60s.cte.gz"


def test_run_replay_serves_a_gzip_trace(running_exporter):
    exp = running_exporter.start(manual=True, fake=False, replay=str(RECORDED_GZ))
    exp.sampler.advance(2)
    snap = exp.sampler.snapshot
    assert snap.backend == "replay" and snap.gpu_count == 8
    assert all(150 < s.watts < 720 for s in snap.power.values())


def test_run_replay_refuses_binary_in_one_line(tmp_path):
    junk = tmp_path / "trace.cte"
    junk.write_bytes(bytes(range(256)) * 4)
    result = subprocess.run([*CLI, "run", "--replay", str(junk), "--web.listen-address",
                             "127.0.0.1:0"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert "binary data, not a trace" in result.stderr
    assert result.stderr.isascii() and result.stderr.strip().isprintable()
