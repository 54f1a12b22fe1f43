"""The benchmarks still run (a smoke test; they assert no timing) and keep to public APIs."""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.tools import REPO, free_port, http_get, stop_process, wait_for

BENCH = REPO / "bench"


def _imports(path) -> list[tuple[str, str]]:
    """(module, name) for every import in a bench script."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(a.name, "") for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            out += [(node.module, a.name) for a in node.names]
    return out


def test_bench_uses_no_tests_and_no_private_names():
    bad = []
    for path in sorted(BENCH.glob("*.py")):
        text = path.read_text()
        for module, name in _imports(path):
            if module.split(".")[0] == "tests" or name.startswith("_") or any(
                    part.startswith("_") for part in module.split(".")[1:]):
                bad.append(f"{path.name}: {module} {name}")
        if '"tests"' in text:
            bad.append(f"{path.name}: puts tests/ on the path")
    assert bad == []


def test_bench_cpu_runs_its_targets_in_children_and_prints_a_table():
    targets = ["ours"]
    if importlib.util.find_spec("nvitop_exporter") is not None:
        targets.append("nvitop")  # optional: pip install -e '.[bench]'
    out = subprocess.run(
        [sys.executable, str(BENCH / "bench_cpu.py"), "--targets", ",".join(targets),
         "--seconds", "1.5", "--warmup", "0.5", "--scrape-interval", "0.5", "--no-costs"],
        capture_output=True, text=True, timeout=180, cwd=REPO)
    assert out.returncode == 0, out.stderr
    assert "ours (run --fake)" in out.stdout and "not measured" not in out.stdout, out.stdout
    assert "by loop/thread" in out.stdout
    # the sampling thread's loops share its time in the fake (counted by thread)
    shared = out.stdout.split("cte-sampling's loops together: in the fake ")[1]
    assert float(shared.split(" %")[0]) > 0


def test_bench_cpu_child_reports_json():
    out = subprocess.run(
        [sys.executable, str(BENCH / "bench_cpu.py"), "--child", "ours", "--seconds", "1",
         "--warmup", "0.5", "--scrape-interval", "0.4", "--no-costs"],
        capture_output=True, text=True, timeout=120, cwd=REPO)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    rates = result["rates"]
    assert {"process", "driver", "model", "scraper", "loop/power", "loop/sweep"} <= set(rates)
    assert result["scrapes"]["count"] >= 2 and result["scrapes"]["errors"] == 0
    assert result["render_cpu_seconds"] > 0
    assert rates["wakeups"] > 0  # every loop sleeps between its ticks
    # each loop's thread is named, and a thread's CPU is at least its loops' ticks: in the
    # totals since the start, read loops first (a window's rates can cut a tick in two)
    threads = result["loop_threads"]
    assert threads["sweep"] == threads["publish"] == "cte-sampling"
    assert threads["power_watch"] == "cte-power_watch"
    totals = result["totals"]
    assert totals["loop/sweep"] > 0
    # without schedstat (some kernels) a thread's CPU comes in whole clock ticks, cut down
    tick = 1e-6 if os.path.exists(f"/proc/self/task/{os.getpid()}/schedstat") else (
        1.0 / os.sysconf("SC_CLK_TCK"))
    assert totals["thread/cte-sampling"] >= totals["loop/sweep"] - tick - 1e-6


def test_bench_cpu_reads_threads_in_ns_when_one_ends_while_read(monkeypatch):
    """A thread that ends between the listing of /proc/<pid>/task and the read of its files
    is left out: the others keep schedstat's nanoseconds (not psutil's whole clock ticks,
    which can read a thread's CPU below its loops') and their wake-ups."""
    if not os.path.exists(f"/proc/{os.getpid()}/schedstat"):
        pytest.skip("this kernel keeps no schedstat")
    monkeypatch.syspath_prepend(str(BENCH))
    bench_cpu = importlib.import_module("bench_cpu")
    listdir = os.listdir

    def listing(path):  # a thread listed, then gone before its files are read
        names = listdir(path)
        return ["999999999", *names] if str(path).endswith("/task") else names

    monkeypatch.setattr(bench_cpu.os, "listdir", listing)

    class Proc:  # psutil.Process as far as the bench reads it, without the tick fallback
        pid = os.getpid()

        def threads(self):
            raise AssertionError("fell back to whole clock ticks")

    cpu = bench_cpu._task_cpu(Proc())
    assert cpu[os.getpid()] > 0 and 999999999 not in cpu
    assert bench_cpu.wakeups(Proc()) > 0


def test_bench_memory_prints_rss_at_start_and_the_reference():
    out = subprocess.run([sys.executable, str(BENCH / "bench_memory.py"), "--seconds", "3",
                          "--every", "0.5"], capture_output=True, text=True, timeout=180,
                         cwd=REPO)
    assert out.returncode == 0, out.stderr
    start = float(out.stdout.split("RSS start ")[1].split(" MiB")[0])
    assert 10 < start < 1000  # MiB: a real process's figure, not bytes or pages
    assert "steady nan MiB" in out.stdout  # 3 s fill no 660 s window: no steady figure
    assert "a bare interpreter importing the same libraries" in out.stdout


def test_the_fault_soak_holds_every_kind_of_fault_the_fake_models():
    """The 30-minute soak shows growth from anything a fault makes the exporter keep only
    if it has every kind of fault: a kind added to the fake must join it."""
    from exporter.sim.scenarios import FAULT_KINDS, load_scenario

    soak = load_scenario(str(BENCH / "scenarios" / "fault-soak.yaml"))
    assert {event.kind for event in soak.events} == set(FAULT_KINDS)
    assert max(event.at for event in soak.events) < 1800 and soak.gpus == 8


def test_bench_memory_prints_the_import_floor_against_the_bare_interpreter():
    out = subprocess.run([sys.executable, str(BENCH / "bench_memory.py"), "--imports",
                          "--rounds", "1"], capture_output=True, text=True, timeout=300,
                         cwd=REPO)
    assert out.returncode == 0, out.stderr
    rows = {line.split()[0]: line.split()[1:] for line in out.stdout.splitlines()[2:]}
    assert float(rows["numpy"][1]) > 1.0  # /bare: numpy costs more than the interpreter
    assert rows["numpy"][2] == "1.00"  # /numpy: the second reference
    assert float(rows["exporter.app"][1]) > float(rows["numpy"][1])


def test_bench_memory_prints_the_data_by_structure_on_a_manual_clock():
    out = subprocess.run([sys.executable, str(BENCH / "bench_memory.py"), "--data", "1"],
                         capture_output=True, text=True, timeout=300, cwd=REPO)
    assert out.returncode == 0, out.stderr
    assert "   1 min " in out.stdout and "(1.00 x minute 1)" in out.stdout
    ring = next(line for line in out.stdout.splitlines() if "power ring" in line)
    assert float(ring.split()[-3]) > 1.0  # MiB: 8 GPUs x 660 s, allocated at start
    assert "exporter/sampling/buffers.py" in out.stdout


def test_bench_bursts_prints_each_pause_against_back_to_back():
    out = subprocess.run([sys.executable, str(BENCH / "bench_bursts.py"), "--seconds", "2",
                          "--rounds", "1", "--pauses", "0.05"], capture_output=True, text=True,
                         timeout=300, cwd=REPO)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[1].split() == ["round", "back", "to", "back", "after", "0.05", "s"]
    number, hot, cold, ratio = lines[2].split()
    assert number == "1" and float(hot) > 0 and float(cold) > 0
    # the ratio is of the unrounded figures: within rounding of the printed ones
    assert ratio.startswith("(") and ratio.endswith("x)")
    assert abs(float(ratio[1:-2]) - float(cold) / float(hot)) <= 0.011
    loops = lines[3].removeprefix("by loop, back to back (last round): ").split(", ")
    assert {"sweep", "power"} <= {loop.split()[0] for loop in loops}
    wake = lines[4].removeprefix("a wake-up alone (the pause slept, no work): ").split()
    assert wake[:3] == ["after", "0.05", "s"] and wake[4] == "ms" and float(wake[3]) >= 0


def test_bench_sweep_path_prints_both_loops_and_the_calls():
    out = subprocess.run([sys.executable, str(BENCH / "bench_sweep_path.py"), "--seconds",
                          "5", "--runs", "1"], capture_output=True, text=True, timeout=300,
                         cwd=REPO)
    assert out.returncode == 0, out.stderr
    rows = {line.split()[0]: line.split()[1:] for line in out.stdout.splitlines()[2:4]}
    assert set(rows) == {"sweep", "power"} and all(len(v) == 3 for v in rows.values())
    power = next(line for line in out.stdout.splitlines() if line.startswith("power samples"))
    assert float(power.split()[4].rstrip(",")) > 300 and power.endswith("lost: 0")
    assert "nvmlDeviceGetMemoryInfo_v2" in out.stdout


def test_bench_profiles_prints_each_selection_against_full():
    out = subprocess.run(
        [sys.executable, str(BENCH / "bench_profiles.py"), "--seconds", "1", "--renders", "2",
         "--reads", "2"], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert out.returncode == 0, out.stderr
    rows = out.stdout.splitlines()[1:5]
    assert [row[:28].strip() for row in rows] == [
        "minimal", "standard", "full", "full + nvlink-per-gpu.yml"], out.stdout
    assert " x1.00 " in rows[2], out.stdout  # full is the reference
    lines = out.stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("dcgm-exporter compat"))
    compat = {row[:28].strip(): row[28:].split() for row in lines[at + 1:at + 4]}
    assert list(compat) == ["minimal", "standard", "full"], out.stdout
    assert all(int(cols[0]) > 8 * 20 for cols in compat.values()), out.stdout  # series


def test_bench_kmsg_reads_a_log_and_prints_the_phases():
    out = subprocess.run([sys.executable, str(BENCH / "bench_kmsg.py"), "--records", "3000",
                          "--after", "1"], capture_output=True, text=True, timeout=120,
                         cwd=REPO)
    assert out.returncode == 0, out.stderr
    assert "kernel log of 3,000 XID records" in out.stdout
    assert "/metrics before:" in out.stdout and "/metrics after:" in out.stdout


def test_bench_analyze_memory_prints_peak_rss_and_ratios():
    out = subprocess.run(
        [sys.executable, str(BENCH / "bench_analyze_memory.py"), "--size-mb", "2",
         "--reference-mb", "1", "--json"],
        capture_output=True, text=True, timeout=300, cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)})
    assert out.returncode == 0, out.stderr
    assert "large / reference: size" in out.stdout and "peak RSS" in out.stdout, out.stdout
    figures = json.loads(out.stdout.strip().splitlines()[-1])
    assert figures["large"]["rows"] > figures["reference"]["rows"] > 0
    assert figures["large"]["rss"] > 0


def start_ours_on_fake(stats, port: int, *flags: str) -> subprocess.Popen:
    """bench/ours_on_fake.py running the exporter on the zero-cost fake at `port`."""
    return subprocess.Popen(
        [sys.executable, str(BENCH / "ours_on_fake.py"), "--stats-file", str(stats), *flags,
         "--", "run", "--fake", "--no-fake.costs", f"--web.listen-address=127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=stats.parent)


def test_ours_on_fake_writes_the_fakes_accounts_on_sigusr1(tmp_path):
    """What a side-by-side harness reads from a peer on its fake, from ours: the calls
    into the fake and the CPU inside them grow between two signals, within the
    process's own CPU, and the exporter serves meanwhile."""
    stats, port = tmp_path / "stats.json", free_port()

    def serving() -> bool:
        try:
            return http_get(port, "/readyz")[0].status == 200
        except OSError:
            return False

    def accounts() -> dict:
        before = stats.stat().st_mtime_ns if stats.exists() else 0
        proc.send_signal(signal.SIGUSR1)
        wait_for(lambda: stats.exists() and stats.stat().st_mtime_ns != before)
        return json.loads(stats.read_text())

    proc = start_ours_on_fake(stats, port)
    try:
        wait_for(serving, timeout=60)
        first = accounts()
        time.sleep(2.5)
        second = accounts()
        assert serving()
    finally:
        stop_process(proc)
    assert second["time"] > first["time"]
    assert second["fake_calls"] > first["fake_calls"] > 0
    assert 0 < first["fake_cpu_s"] < second["fake_cpu_s"] < second["process_cpu_s"]
    assert second["missing_symbols"] == []


@pytest.mark.parametrize("analyses", [True, False])
def test_ours_on_fake_can_start_the_sampler_without_its_analyses(tmp_path, analyses):
    """`--no-analyses` (the floor a CPU figure is held against): the power drain, the
    sweep and publish run, the analysis and straggler loops do not; without the flag
    they do (the reference, so the test can fail)."""
    port = free_port()
    proc = start_ours_on_fake(tmp_path / "stats.json", port,
                              *([] if analyses else ["--no-analyses"]))

    def loops() -> set[str]:
        try:
            body = http_get(port, "/metrics")[1].decode()
        except OSError:
            return set()
        return {line.split('loop="')[1].split('"')[0] for line in body.splitlines()
                if line.startswith("cte_loop_cpu_seconds_total{")}

    try:
        wait_for(lambda: {"power", "sweep", "publish"} <= loops(), timeout=60)
        running = loops()
    finally:
        stop_process(proc)
    if analyses:
        assert {"analysis", "stragglers"} <= running
    else:
        assert not {"analysis", "stragglers"} & running
