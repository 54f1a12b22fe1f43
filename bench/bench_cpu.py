"""CPU share of the exporter on the 8-GPU fake, side by side with references.

    python bench/bench_cpu.py [--seconds 60] [--warmup 10] [--rounds 1]
                              [--targets ours,nvitop,node_exporter] [--no-costs]

Each target runs in a child process of its own (`--child NAME`, which prints one JSON
line), so no figure mixes with another's: after a warm-up, for `--seconds`, it is
scraped like a Prometheus HA pair scrapes (two servers, each every 15 s, gzip), and the
child reports CPU-seconds per wall-second of the whole process, the part spent inside
the fake NVML (the modelled driver: what the H200 charges, `lib.busy_seconds`), the
scraper's own thread (taken off), per loop / thread, and NVML calls per second.

- ours: `Exporter` at its defaults on the fake (`run --fake`), H200 call costs on.
- ours_history: the same with a state directory (`--storage.path` in a temporary
  directory, the kernel log read from /dev/kmsg where it can be): the history's cost is
  the difference, printed under the table (its budget: 0.05 % of a core, 2 MiB of RSS).
- nvitop: nvitop-exporter (an optional dependency: `pip install -e '.[bench]'`) at its
  default 1 s interval, on the same fake with the same costs, run in-process.
- node_exporter: Debian's prometheus-node-exporter with its default collectors (no GPU):
  what every node already runs, the reference for "how much is an exporter".

With rounds > 1 the targets alternate (A B C A B C ...) and the median is printed,
which evens out load from other work on a shared machine. Not a pass/fail test.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
from targets import PrometheusPair, free_port, start_node_exporter, wait_http

from exporter.sim import costs as cost_model
from exporter.sim.fake import FakeNvmlLibrary, install
from exporter.sim.scenarios import load_scenario

TARGETS = ("ours", "ours_history", "nvitop", "node_exporter")
LABELS = {"ours": "ours (run --fake)", "ours_history": "ours, --storage.path",
          "nvitop": "nvitop-exporter",
          "node_exporter": "node_exporter"}
NVITOP_PIN = "nvitop-exporter==1.7.2"


# -- the measured child ---------------------------------------------------------------
class GcTime:
    """CPU-seconds spent in the cyclic garbage collector (it runs in whichever thread
    allocates when a generation fills, so it hides inside every loop's figure)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.collections = 0
        self._started = 0.0
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.thread_time()
        else:
            self.seconds += time.thread_time() - self._started
            self.collections += 1

    def counters(self) -> dict[str, float]:
        return {"gc": self.seconds, "gc_collections": float(self.collections)}


def thread_cpu(proc: psutil.Process) -> dict[str, float]:
    """CPU-seconds so far of each live thread, by thread name (summed over equal names):
    from /proc/<pid>/task/<tid>/schedstat in ns where Linux has it, else psutil (whose
    per-thread times come in 10 ms clock ticks)."""
    names = {t.native_id: t.name for t in threading.enumerate()}
    out: dict[str, float] = {}
    for tid, seconds in _task_cpu(proc).items():
        name = names.get(tid, "native")
        out[name] = out.get(name, 0.0) + seconds
    return out


def _per_task(pid: int, name: str) -> dict[int, str]:
    """Each live thread's /proc/<pid>/task/<tid>/<name>, by tid. A thread that ended
    between the listing and the read is left out, not the threads after it."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/{name}") as f:
                out[int(tid)] = f.read()
        except (FileNotFoundError, ProcessLookupError):
            continue
    return out


def _task_cpu(proc: psutil.Process) -> dict[int, float]:
    # the main thread's file says whether this kernel keeps schedstat at all
    if os.path.exists(f"/proc/{proc.pid}/schedstat"):
        try:
            return {tid: int(text.split()[0]) / 1e9
                    for tid, text in _per_task(proc.pid, "schedstat").items()}
        except (OSError, ValueError, IndexError):
            pass
    return {t.id: t.user_time + t.system_time for t in proc.threads()}


def wakeups(proc: psutil.Process) -> float:
    """Voluntary context switches so far of the live threads (a thread that blocked and
    was woken: a sleep, an Event, a GIL wait); 0 where /proc does not say."""
    total = 0
    try:
        statuses = _per_task(proc.pid, "status").values()
    except OSError:
        return 0.0
    for status in statuses:
        for line in status.splitlines():
            name, _, value = line.partition(":")
            if name == "voluntary_ctxt_switches" and value.strip().isdigit():
                total += int(value)
    return float(total)


def process_cpu(proc: psutil.Process) -> float:
    times = proc.cpu_times()
    return times.user + times.system


def fake_counters(lib: FakeNvmlLibrary) -> dict[str, float]:
    """The fake's own accounts (CPU inside it, and what the H200 model charged), in
    total and per live thread by name (a thread that ended counts in the totals)."""
    names = {t.ident: t.name for t in threading.enumerate()}
    out = {"driver": lib.busy_seconds, "model": lib.modelled_seconds}
    for prefix, by_thread in (("driver_thread", lib.busy_by_thread),
                              ("model_thread", lib.modelled_by_thread)):
        for ident, seconds in list(by_thread.items()):
            key = f"{prefix}/{names.get(ident, 'ended')}"
            out[key] = out.get(key, 0.0) + seconds
    out.update({f"calls/{k}": float(v) for k, v in list(lib.calls.items())})
    return out


def measure(port: int, opts: argparse.Namespace, counters: Callable[[], dict[str, float]],
            in_process: bool) -> dict[str, Any]:
    """Warm up, then scrape like a Prometheus pair for opts.seconds: every counter's rate
    (per wall-second) over the window, and the scrapes."""
    time.sleep(opts.warmup)
    pair = PrometheusPair(port, opts.scrape_interval)
    spy = start_profiler(opts) if opts.profile and in_process else None
    before, t0 = counters(), time.monotonic()
    pair.start()
    time.sleep(opts.seconds)
    pair.stop()
    if spy is not None:
        spy.wait(30)
    after, wall = counters(), time.monotonic() - t0
    rates = {k: (v - before[k]) / wall for k, v in after.items() if k in before}
    if in_process:  # the scraper's thread is not the target's
        rates["scraper"] = pair.cpu_seconds / wall
    lat = sorted(pair.latencies)
    return {"wall_seconds": wall, "rates": rates, "totals": after,
            "scrapes": {"count": len(lat), "errors": pair.errors, "bytes": pair.bytes,
                        "p50_ms": statistics.median(lat) * 1000 if lat else None,
                        "max_ms": lat[-1] * 1000 if lat else None}}


def start_profiler(opts: argparse.Namespace) -> subprocess.Popen:
    """py-spy on this process for the window, collapsed stacks per thread into
    PROFILE/<target>.folded (sampling from outside: --nonblocking never pauses us, and
    its own CPU is its process's, not ours). --gil samples only the thread holding the
    GIL: Python work, not GIL waits, nor the fake's burn (which releases the GIL as a C
    driver would). Needs py-spy (pip) and ptrace rights."""
    out = Path(opts.profile) / f"{opts.child}.folded"
    out.parent.mkdir(parents=True, exist_ok=True)
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    return subprocess.Popen([spy, "record", "--pid", str(os.getpid()), "--duration",
                             str(int(opts.seconds)), "--rate", "250", "--nonblocking", "--gil",
                             "--threads", "--format", "raw", "--output", str(out)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def fake_library(opts: argparse.Namespace) -> FakeNvmlLibrary:
    costs = cost_model.H200 if opts.costs else None
    return FakeNvmlLibrary(load_scenario(opts.scenario), time.time, costs)


def render_cost(snapshot: Any, repeat: int = 5) -> float:
    """Median CPU-seconds to render one snapshot and gzip it, as the first scrape of each
    snapshot does (in the connection's thread, which psutil cannot see once it ends),
    with the renderer's caches as the scrapes left them: the NVLink state and error and
    memory families are reused while their values hold, as a scrape finds them."""
    import gzip

    from exporter.metrics.render import render

    times = []
    for _ in range(repeat):
        c0 = time.thread_time()
        gzip.compress(render(snapshot), compresslevel=1, mtime=0)
        times.append(time.thread_time() - c0)
    return statistics.median(times)


def child_ours(opts: argparse.Namespace) -> dict[str, Any]:
    import tempfile

    from exporter.app import Exporter
    from exporter.cli import freeze_startup_objects, tune_interpreter
    from exporter.config import build_config

    tune_interpreter()  # as `run` does
    state = tempfile.mkdtemp(prefix="cte-bench-state-")
    config = build_config(None, {"listen_address": "127.0.0.1:0", "fake": True,
                                 "scenario": opts.scenario, "fake_costs": opts.costs,
                                 "storage_path": state if opts.child == "ours_history" else "",
                                 # the fake reads no kernel log by default; the history's
                                 # cost includes following it
                                 "storage_kmsg_path": "/dev/kmsg"
                                 if opts.child == "ours_history" else ""})
    lib = fake_library(opts)
    gc_time = GcTime()
    exp = Exporter(config, fake_lib=lib)
    exp.start()
    freeze_startup_objects()  # as `run` does
    proc = psutil.Process()
    sampler = exp.sampler
    assert sampler is not None

    def counters() -> dict[str, float]:
        out = {"process": process_cpu(proc), **fake_counters(lib), **gc_time.counters(),
               "wakeups": wakeups(proc)}
        # The loops' own figures before the threads': a tick that ends between the two
        # reads then adds to the thread's CPU, never to the loop's alone.
        out.update({f"loop/{loop.name}": loop.cpu_seconds for loop in sampler.loops})
        out.update({f"thread/{k}": v for k, v in thread_cpu(proc).items()})
        # the health checks (inside the publish loop's figure) and how often they judged
        out["health"], out["health_judgements"] = (exp.health.cpu_seconds,
                                                   float(exp.health.judgements))
        # the goodput account (inside the publish loop's figure)
        goodput = sampler.analyses.goodput if sampler.analyses is not None else None
        if goodput is not None:
            out["goodput"] = goodput.cpu_seconds
        for gpu, stats in sampler.power.stats().items():
            out[f"samples/{gpu}"] = float(stats.samples_total)
            out[f"lost/{gpu}"] = float(stats.lost_total)
        return out

    try:
        result = measure(exp.port, opts, counters, in_process=True)
        result["band_max_hz"] = sampler.power.band()[1]
        result["loop_threads"] = {loop.name: loop.thread.name for loop in sampler.loops
                                  if loop.thread is not None}
        assert exp.current is not None
        result["render_cpu_seconds"] = render_cost(exp.current.snapshot)
        result["power_sampling"] = sorted({s.kind for s in sampler.power.stats().values()})
        result["missing"] = sorted(lib.missing)
        result["rss_bytes"] = proc.memory_info().rss
        if exp.history is not None:
            stats = exp.history.stats()
            log_ = sampler.xids.kernel_log
            result["history"] = {"transactions": stats.transactions,
                                 "kmsg_readable": log_ is not None and log_.readable}
    finally:
        exp.stop()
        shutil.rmtree(state, ignore_errors=True)
    return result


def child_nvitop(opts: argparse.Namespace) -> dict[str, Any]:
    try:
        from importlib.metadata import version

        from nvitop_exporter import cli
    except ImportError:
        return {"error": f"nvitop-exporter is not installed: pip install -e '.[bench]' "
                         f"(or pip install {NVITOP_PIN})"}
    lib = fake_library(opts)
    install(lib)  # before nvitop's first NVML call: it loads the library once
    gc_time = GcTime()
    port = free_port()
    # nvitop-exporter's main() reads sys.argv, serves, then loops forever in collect().
    sys.argv = ["nvitop-exporter", "--bind-address", "127.0.0.1", "--port", str(port),
                "--hostname", "bench"]
    thread = threading.Thread(target=cli.main, name="nvitop-collect", daemon=True)
    thread.start()
    wait_http(port)
    proc = psutil.Process()

    def counters() -> dict[str, float]:
        out = {"process": process_cpu(proc), **fake_counters(lib), **gc_time.counters(),
               "wakeups": wakeups(proc)}
        out.update({f"thread/{k}": v for k, v in thread_cpu(proc).items()})
        return out

    result = measure(port, opts, counters, in_process=True)
    result["missing"] = sorted(lib.missing)
    result["rss_bytes"] = proc.memory_info().rss
    result["version"] = version("nvitop-exporter")
    return result


def child_node_exporter(opts: argparse.Namespace) -> dict[str, Any]:
    port = free_port()
    try:
        ne = start_node_exporter(port, collectors=())  # its defaults: what nodes run
    except FileNotFoundError as exc:
        return {"error": str(exc)}
    try:
        wait_http(port, proc=ne)
        target = psutil.Process(ne.pid)
        result = measure(port, opts, lambda: {"process": process_cpu(target)},
                         in_process=False)
        result["rss_bytes"] = target.memory_info().rss
    finally:
        ne.terminate()
        ne.wait(10)
    return result


CHILDREN = {"ours": child_ours, "ours_history": child_ours, "nvitop": child_nvitop,
            "node_exporter": child_node_exporter}


# -- the parent: run each child, print a table and ratios ------------------------------
def run_child(name: str, opts: argparse.Namespace) -> dict[str, Any]:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", name,
           "--seconds", str(opts.seconds), "--warmup", str(opts.warmup),
           "--scenario", opts.scenario, "--scrape-interval", str(opts.scrape_interval)]
    if opts.profile:
        cmd += ["--profile", opts.profile]
    if not opts.costs:
        cmd.append("--no-costs")
    done = subprocess.run(cmd, capture_output=True, text=True,
                          timeout=opts.seconds + opts.warmup + 120)
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        return {"error": f"exit {done.returncode}: {done.stderr.strip()[-600:]}"}
    return json.loads(lines[-1])


def median_result(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The first run's details with every rate replaced by its median over the runs."""
    ok = [r for r in runs if "error" not in r]
    if not ok:
        return runs[0]
    out = dict(ok[0])
    keys = set.intersection(*(set(r["rates"]) for r in ok))
    out["rates"] = {k: statistics.median(r["rates"][k] for r in ok) for k in keys}
    out["spread"] = {k: (min(r["rates"][k] for r in ok), max(r["rates"][k] for r in ok))
                     for k in ("process", "driver") if k in keys}
    out["rounds"] = len(ok)
    return out


@dataclass(frozen=True)
class Shares:
    """Fractions of one core; the in-process scraper's thread is off all of them."""

    whole: float  # the process
    fake: float  # inside the fake NVML (lib.busy_seconds)
    model: float  # what the H200 cost model charges for the same calls

    @property
    def itself(self) -> float:
        """The exporter's own code: the process less the fake."""
        return self.whole - self.fake

    @property
    def on_h200(self) -> float:
        """The process as it would be on an H200: its own code plus the modelled driver."""
        return self.itself + self.model


def shares(result: dict[str, Any]) -> Shares:
    r = result["rates"]
    return Shares(r["process"] - r.get("scraper", 0.0), r.get("driver", 0.0),
                  r.get("model", 0.0))


def pct(x: float) -> str:
    return f"{x * 100:6.2f} %"


def ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b > 0 else "n/a"


def print_table(results: dict[str, dict[str, Any]], opts: argparse.Namespace) -> None:
    print(f"CPU share of one core: 8-GPU fake ({opts.scenario}), H200 call costs "
          f"{'on' if opts.costs else 'OFF'}, {opts.seconds:g} s after {opts.warmup:g} s of "
          f"warm-up, a Prometheus pair scraping every {opts.scrape_interval:g} s (gzip), "
          f"median of {opts.rounds} round(s); {psutil.cpu_count()} CPUs, load average "
          f"{psutil.getloadavg()[0]:.2f}")
    print(f"  {'target':22s} {'whole':>8s} {'in fake':>8s} {'itself':>8s} {'H200drv':>8s}"
          f" {'on H200':>8s} {'NVML/s':>6s} {'scrape':>9s} {'RSS':>9s}")
    for name, res in results.items():
        label = LABELS[name] + (f" {res['version']}" if "version" in res else "")
        if "error" in res:
            print(f"  {label:22s} not measured: {res['error']}")
            continue
        sh = shares(res)
        calls = sum(v for k, v in res["rates"].items() if k.startswith("calls/"))
        gpu = name != "node_exporter"
        dash = f"{'-':>8s}"
        model = pct(sh.model) if gpu and opts.costs else dash
        on_h200 = pct(sh.on_h200) if gpu and opts.costs else pct(sh.whole) if not gpu else dash
        print(f"  {label:22s} {pct(sh.whole)} {pct(sh.fake) if gpu else dash} "
              f"{pct(sh.itself)} {model} {on_h200} {calls:6.0f} "
              f"{res['scrapes']['p50_ms'] or 0:6.2f} ms {res['rss_bytes'] / 2**20:5.1f} MiB")
    spreads = [f"{name} {lo * 100:.2f}-{hi * 100:.2f} %" for name, res in results.items()
               if (lo_hi := res.get("spread", {}).get("process")) for lo, hi in [lo_hi]]
    if opts.rounds > 1 and spreads:
        print(f"  spread of the process's figure over the rounds: {', '.join(spreads)}")
    print("  whole: the process; in fake: inside the fake NVML (busy_seconds: the modelled "
          "driver, or the fake's own\n  Python where that costs more); itself: whole - in "
          "fake; H200drv: what the H200 model charges for the same calls;\n  on H200: itself "
          "+ H200drv (the estimate for real hardware); scrape: p50 of the pair's scrapes")


def print_history_cost(results: dict[str, dict[str, Any]]) -> None:
    """What the state directory adds: the two runs of ours, less one another."""
    off, on = results.get("ours", {}), results.get("ours_history", {})
    if not off or not on or "error" in off or "error" in on:
        return
    whole = shares(on).whole - shares(off).whole
    rss = (on["rss_bytes"] - off["rss_bytes"]) / 2**20
    h = on.get("history", {})
    print(f"history (--storage.path): whole {whole * 100:+.3f} % of a core (budget +0.05 %), "
          f"RSS {rss:+.1f} MiB (budget +2 MiB); {h.get('transactions', '?')} transactions, "
          f"kernel log {'read' if h.get('kmsg_readable') else 'not readable'}")


def print_ratios(results: dict[str, dict[str, Any]]) -> None:
    print_history_cost(results)
    ours = results.get("ours", {})
    if "error" in ours or not ours:
        return
    o = shares(ours)
    print("ratios (same run):")
    for name in ("nvitop", "node_exporter"):
        ref = results.get(name)
        if not ref or "error" in ref:
            continue
        r = shares(ref)
        line = (f"  ours / {LABELS[name]}: whole {ratio(o.whole, r.whole)}, itself "
                f"{ratio(o.itself, r.itself)}")
        if name == "nvitop":
            line += (f", in fake {ratio(o.fake, r.fake)}, H200 driver {ratio(o.model, r.model)}"
                     f", on H200 {ratio(o.on_h200, r.on_h200)}")
        print(line)


def thread_parts(rates: dict[str, float], loop_threads: dict[str, str]
                 ) -> list[tuple[str, float, float, float]]:
    """(loop or thread, CPU, in fake, H200 model) per loop (its cpu_seconds) and per other
    thread (psutil), largest first. `loop_threads`: each loop's thread; the fake counts
    its time by thread, so only a loop alone in its thread gets that thread's time in
    the fake (shared_fake: the shared threads')."""
    loops = {k[5:]: v for k, v in rates.items() if k.startswith("loop/")}
    names = {n: loop_threads.get(n, f"cte-{n}") for n in loops}
    hosted = list(names.values())
    names.update({k[7:]: k[7:] for k, v in rates.items() if k.startswith("thread/")
                  and k[7:] not in hosted and v > 0.00005})
    parts = []
    for n, t in names.items():
        alone = hosted.count(t) <= 1
        parts.append((n, loops.get(n, rates.get(f"thread/{t}", 0.0)),
                      rates.get(f"driver_thread/{t}", 0.0) if alone else 0.0,
                      rates.get(f"model_thread/{t}", 0.0) if alone else 0.0))
    return sorted(parts, key=lambda p: -p[1])


def shared_fake(rates: dict[str, float], loop_threads: dict[str, str]
                ) -> dict[str, tuple[float, float]]:
    """Each thread that several loops share (the sampling thread): its time in the fake
    and what the H200 model charges for its calls."""
    hosted = list(loop_threads.values())
    return {t: (rates.get(f"driver_thread/{t}", 0.0), rates.get(f"model_thread/{t}", 0.0))
            for t in dict.fromkeys(hosted) if hosted.count(t) > 1}


def print_breakdown(results: dict[str, dict[str, Any]]) -> None:
    for name, res in results.items():
        if "error" in res or name == "node_exporter":
            continue
        rates = res["rates"]
        print(f"{LABELS[name]} by loop/thread: CPU (in the fake, H200 model):")
        parts = thread_parts(rates, res.get("loop_threads", {}))
        print("  " + ", ".join(f"{n} {v * 100:.2f} % ({d * 100:.2f}, {m * 100:.2f})"
                               for n, v, d, m in parts if v > 0.00005))
        for thread, (fake_share, model) in shared_fake(rates, res.get("loop_threads", {})
                                                       ).items():
            print(f"  {thread}'s loops together: in the fake {fake_share * 100:.2f} %, "
                  f"H200 model {model * 100:.2f} %")
        other = shares(res).whole - sum(p[1] for p in parts)
        print(f"  other (threads that came and went, e.g. HTTP connections): "
              f"{other * 100:.2f} %; scraper thread, taken off: "
              f"{rates.get('scraper', 0.0) * 100:.3f} %; garbage collector (inside the "
              f"above): {rates.get('gc', 0.0) * 100:.2f} % in "
              f"{rates.get('gc_collections', 0.0):.1f} collections/s; thread wake-ups "
              f"(voluntary context switches of the live threads): "
              f"{rates.get('wakeups', 0.0):.0f}/s")
        if "health" in rates:
            # the board reads come once a minute per GPU, maybe not inside the window:
            # their steady share from the H200 model (estimated costs), 8 GPUs
            board = 8 * sum(cost_model.H200.of_call(c).cpu for c in (
                "nvmlDeviceGetGpuFabricInfoV", "nvmlDeviceValidateInforom")) / 60.0
            print(f"  health checks (inside the publish loop): {rates['health'] * 100:.4f} % "
                  f"in {rates['health_judgements']:.2f} judgements/s; their board reads "
                  f"(fabric, InfoROM once a minute per GPU; H200 model, estimated) "
                  f"{board * 100:.4f} %; together {(rates['health'] + board) * 100:.4f} % of "
                  f"a core (budget 0.05 %)")
        if "goodput" in rates:
            print(f"  goodput account (inside the publish loop): "
                  f"{rates['goodput'] * 100:.4f} % of a core (budget 0.05 %)")
        if "render_cpu_seconds" in res:
            renders = res["scrapes"]["count"] / res["wall_seconds"]
            print(f"  render + gzip of one snapshot (first scrape of it, in its connection's "
                  f"thread): {res['render_cpu_seconds'] * 1000:.1f} ms CPU; at "
                  f"{renders * 60:.0f} scrapes/min of fresh snapshots: "
                  f"{res['render_cpu_seconds'] * renders * 100:.2f} %")
        calls = sorted(((k[6:], v) for k, v in rates.items() if k.startswith("calls/")),
                       key=lambda kv: -kv[1])
        print("  NVML calls/s: " + ", ".join(f"{k} {v:.1f}" for k, v in calls if v >= 0.05))
        if res.get("missing"):
            print(f"  symbols it asked for that the fake does not serve: "
                  f"{', '.join(res['missing'])}\n  (each answered FunctionNotFound: the "
                  f"value is skipped and costs nothing here, so this figure is a floor; "
                  f"docs/performance.md says what they cost on an H200)")
        if name == "ours":
            samples = [v for k, v in rates.items() if k.startswith("samples/")]
            lost = sum(v for k, v in rates.items() if k.startswith("lost/"))
            print(f"  power: {statistics.mean(samples):.1f} samples/s per GPU "
                  f"({', '.join(res['power_sampling'])}), lost {lost:.2f}/s, observable "
                  f"band 0-{res['band_max_hz']:.1f} Hz")


def print_profile(folder: str, target: str, top: int = 12) -> None:
    """The hottest frames of a py-spy profile: by own samples, and by samples under them."""
    path = Path(folder) / f"{target}.folded"
    if not path.exists():
        print(f"{LABELS[target]}: no profile (is py-spy installed, and may it ptrace?)")
        return
    own: dict[str, int] = {}
    under: dict[str, int] = {}
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames, n = stack.split(";"), int(count)
        total += n
        own[frames[-1]] = own.get(frames[-1], 0) + n
        for frame in set(frames[1:]):  # the first frame names the thread
            under[frame] = under.get(frame, 0) + n
    print(f"{LABELS[target]} profile ({total} samples, {path}):")
    for title, table in (("own", own), ("inclusive", under)):
        print(f"  hottest, {title}:")
        for frame, n in sorted(table.items(), key=lambda kv: -kv[1])[:top]:
            print(f"    {n / total * 100:5.1f} %  {frame}")


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="measured window")
    parser.add_argument("--warmup", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=1, help="alternate targets N times")
    parser.add_argument("--targets", default=",".join(TARGETS),
                        help=f"comma-separated, of {', '.join(TARGETS)}")
    parser.add_argument("--scenario", default="training")
    parser.add_argument("--scrape-interval", type=float, default=15.0)
    parser.add_argument("--no-costs", dest="costs", action="store_false",
                        help="the fake charges nothing (compare with the issue's figures)")
    parser.add_argument("--child", choices=TARGETS, help=argparse.SUPPRESS)
    parser.add_argument("--json", metavar="FILE", help="also write every result here")
    parser.add_argument("--profile", metavar="DIR", help="py-spy each Python target over the "
                        "window into DIR/<target>.folded and print its hottest frames")
    opts = parser.parse_args(argv)
    targets = [t for t in opts.targets.split(",") if t]
    if bad := [t for t in targets if t not in TARGETS]:
        parser.error(f"unknown target(s) {', '.join(bad)}; choose from {', '.join(TARGETS)}")
    opts.targets = targets
    return opts


def main(argv: list[str] | None = None) -> None:
    opts = parse(argv)
    if opts.child:
        print(json.dumps(CHILDREN[opts.child](opts)), flush=True)
        return
    runs: dict[str, list[dict[str, Any]]] = {t: [] for t in opts.targets}
    for _ in range(opts.rounds):
        for target in opts.targets:
            runs[target].append(run_child(target, opts))
    results = {t: median_result(r) for t, r in runs.items()}
    print_table(results, opts)
    print_ratios(results)
    print_breakdown(results)
    for target in opts.targets if opts.profile else ():
        if target != "node_exporter":
            print_profile(opts.profile, target)
    if opts.json:
        Path(opts.json).write_text(json.dumps(runs, indent=1))


if __name__ == "__main__":
    main()
